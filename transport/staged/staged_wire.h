// The host-staged transport's protocol (transport/staged/): what its address, memory keys and
// hello record carry (envelopes of transport/core/envelope.h, tag "KVST"), the layout of a
// staging slot (a chunk descriptor, its pieces and the doorbell words, in memory both sides
// map or write into), and the control messages that ride on the inner UCX transport's
// notifications (flags = kFlagMagic | type | bits).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"
#include "transport/transport.h"

namespace kvstream::transport::staged {

// ---- control messages on the inner transport's notifications --------------------------------

inline constexpr int32_t kFlagMagic = 0x4B500000;
inline constexpr int32_t kFlagMagicMask = 0x7FF00000;
enum MsgType : int32_t {
  kHello = 1,
  kChunk = 2,
  kBye = 3,
  kCredit = 4,
  kByeAck = 5,
  kPing = 6,
  kAbandon = 7,  // writer -> receiver: forget the progress of write `request_id` (never finishes)
};
inline constexpr int32_t kBitWriteDone = 1 << 8;
inline constexpr int32_t kBitError = 1 << 9;

inline Notification Msg(MsgType type, uint64_t request_id, int32_t layer, int32_t bits = 0) {
  return Notification{request_id, layer, kFlagMagic | type | bits};
}

// ---- the receive staging area -----------------------------------------------------------------

inline constexpr uint64_t kHeaderBytes = 64 * 1024;    // chunk descriptor area in front of each slot
inline constexpr uint64_t kMailboxBytes = 16 * 1024;   // one hello record
inline constexpr uint32_t kMailboxes = 16;
inline constexpr uint64_t kStagingAlign = 64 * 1024;   // staging area length rounded up to this

// The descriptor at the start of a slot's header area, followed by npieces PieceWire.
struct ChunkWire {
  char magic[8];  // "KVSTCK03"
  uint32_t conn_id;
  uint32_t npieces;
  uint64_t write_seq;
  uint32_t chunk_index;
  uint32_t total_chunks;
  uint32_t has_note;
  int32_t note_layer;
  uint64_t note_request;
  int32_t note_flags;
  uint32_t pad;
  uint64_t data_bytes;
  uint64_t token;  // doorbell writers: this chunk's token (0 otherwise)
  uint8_t note_mac[kNotificationMacBytes];  // the notification's tag, delivered unchanged
};
inline constexpr char kChunkMagic[8] = {'K', 'V', 'S', 'T', 'C', 'K', '0', '4'};
struct PieceWire {
  uint32_t region_id;
  uint32_t pad;
  uint64_t dst_offset;
  uint64_t staging_offset;
  uint64_t length;
};
// Doorbells (zero-copy writers that asked for them, see StagedOptions::doorbells): two words at
// the end of each slot's header area, in the receiver's staging memory that both map. The
// writer stores the chunk's token (conn_id << 32 | its own chunk counter, never 0) at
// kReadyOffset once the chunk's device -> host copy is complete; the receiver stores a DoneWire
// at kDoneOffset, token last, once the chunk is on its device (instead of a UCX credit). Both
// sides still poll only while chunks are in flight; the writer also sends the UCX announcement
// as a wake-up for a receiver that is idle.
inline constexpr uint64_t kReadyOffset = kHeaderBytes - 128;
inline constexpr uint64_t kDoneOffset = kHeaderBytes - 64;
struct DoneWire {
  uint64_t write_seq;
  int32_t bits;  // kBitWriteDone, kBitError
  uint32_t pad;
  uint64_t token;
};
inline constexpr uint64_t kMaxPieces = (kReadyOffset - sizeof(ChunkWire)) / sizeof(PieceWire);

// Doorbell words live in memory another process writes: atomic, acquire / release.
inline uint64_t LoadWord(const char* p) {
  return __atomic_load_n(reinterpret_cast<const uint64_t*>(p), __ATOMIC_ACQUIRE);
}
inline void StoreWord(char* p, uint64_t v) {
  __atomic_store_n(reinterpret_cast<uint64_t*>(p), v, __ATOMIC_RELEASE);
}

// ---- address, key, hello ------------------------------------------------------------------------

// LocalAddress(): the staging area, then the inner UCX address and the staging area's key.
struct StagingArea {
  uint64_t staging_addr;
  uint64_t staging_len;
  uint64_t chunk_bytes;
  uint64_t slot_stride;
  uint32_t slots;
  uint32_t mailboxes;
};
struct StagedAddress {
  StagingArea area;
  std::string inner_address;
  std::string staging_key;
};
std::string EncodeAddress(const StagedAddress& a);
// kInvalidArgument when not a ucx_staged address or when it describes an unusable area.
Result<StagedAddress> DecodeAddress(const std::string& blob);

// RemoteKey(): the receiver's id of a registered region.
struct StagedKey {
  uint32_t region_id;
  int32_t device;
  uint64_t length;
};
std::string EncodeKey(const StagedKey& k);
Result<StagedKey> DecodeKey(const std::string& blob, size_t region);

// The record a writer puts in one of the receiver's mailboxes before it announces kHello: who
// it is and which admitted connection the receiver answers over (credits, acknowledgements:
// ucx::ReplyEndpoint; the writer accepts no connection).
inline constexpr uint32_t kHelloDoorbells = 1;  // a zero-copy writer that rings doorbells
struct HelloHead {
  uint64_t nonce;
  uint32_t conn_id;
  uint32_t writer_pid;  // != 0: a zero-copy writer on the receiver's host (its pid there)
  uint32_t flags;       // kHelloDoorbells
  uint32_t pad;
};
struct Hello {
  HelloHead head;
  std::string ticket;  // the writer's inner endpoint's admission ticket
};
std::string EncodeHello(const Hello& h);  // at most kMailboxBytes for any UCX address in use
// Reads the hello in a mailbox (`mailbox`: its kMailboxBytes). kInvalidArgument when it is
// malformed or overwritten.
Result<Hello> DecodeHello(std::string_view mailbox);

}  // namespace kvstream::transport::staged
