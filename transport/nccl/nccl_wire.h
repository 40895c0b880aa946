// The nccl backend's host-side protocol, kept free of CUDA and NCCL so that it is unit-tested on
// the CPU: the address and RemoteKey formats, the control-socket frames (hello, hello ack, write
// header, ack), how a write's runs are cut into staging chunks, and pack-vs-direct choice.
//
// Control socket (TCP, one connection per writer endpoint), every message one frame:
//   FrameHead {u32 magic 'KVNC', u32 type, u64 payload bytes} + payload (host byte order: both
//   ends must share endianness, which every host NCCL runs on does).
//   writer -> receiver: kHello, then kWrite per write. (Between the hello ack and the first
//   kWrite, over NCCL: communicator init, then, if the hello asks for it, one warm-up send /
//   receive, writer to receiver.)
//   receiver -> writer: kHelloAck (the NCCL unique id to use, or a refusal), then kAck per write
//   (in write order) once the write's bytes are in the receiver's memory and its notification
//   was handed to the sink.
//
// Guarantees:
//  - Decode* functions never read past the bytes given and refuse (kDataLoss) malformed or
//    oversized input; Encode* followed by Decode* yields the same values.
//  - PlanChunks cuts runs, in order, into chunks of at most chunk_bytes packed bytes; both ends
//    compute the same chunks from the same header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/time.h"
#include "transport/transport.h"

namespace kvstream::transport::nccl {

inline constexpr uint32_t kFrameMagic = 0x434E564Bu;  // "KVNC"
// 2: both ends make a warm-up send / receive right after communicator init (WarmUp, nccl_comm.h).
// 3: a write header carries its notification's MAC (Notification::mac).
// 4: the hello presents a one-shot admission id (not an NCCL unique id); the hello ack always
//    carries a unique id made for that connection.
inline constexpr uint32_t kProtocolVersion = 4;
inline constexpr size_t kUniqueIdBytes = 128;          // NCCL_UNIQUE_ID_BYTES
inline constexpr uint64_t kMaxPayload = 64ull << 20;   // refuse larger frames
inline constexpr uint64_t kMaxRuns = 4u << 20;

enum class FrameType : uint32_t { kHello = 1, kHelloAck = 2, kWrite = 3, kAck = 4 };

struct FrameHead {
  uint32_t magic = kFrameMagic;
  uint32_t type = 0;
  uint64_t payload = 0;
};
static_assert(sizeof(FrameHead) == 16);

// ---- address and key ----------------------------------------------------------------------

// LocalAddress(): "nccl:tcp:<host>:<port>:<hex admission id>" (nccl_transport.h).
struct Address {
  std::string host;
  uint16_t port = 0;
  std::string unique_id;  // the admission id, kUniqueIdBytes raw bytes
};
std::string EncodeAddress(const Address& a);
Result<Address> DecodeAddress(const std::string& text);  // kInvalidArgument when malformed

// RemoteKey(): identifies a receiver registration (the receiver maps writes by this id).
struct Key {
  uint64_t registration_id = 0;
  uint64_t length = 0;
  int32_t device = -1;
  char pci_bus_id[32] = {};
  char host_id[48] = {};
};
std::string EncodeKey(const Key& k);
Result<Key> DecodeKey(const std::string& blob);  // kInvalidArgument when not an nccl key

// ---- handshake ----------------------------------------------------------------------------

struct Hello {
  uint32_t version = kProtocolVersion;
  int32_t device = -1;
  uint64_t chunk_bytes = 0;   // the writer's staging chunk
  char pci_bus_id[32] = {};
  char host_id[48] = {};
  char unique_id[kUniqueIdBytes] = {};  // the admission id the writer read from LocalAddress()
  uint32_t warm_up = 1;       // 1: both ends make the warm-up exchange after communicator init
  uint32_t reserved = 0;
};
struct HelloAck {
  uint32_t version = kProtocolVersion;
  int32_t code = 0;           // StatusCode; non-zero: refused, `message` says why
  uint64_t chunk_bytes = 0;   // agreed: min of both ends
  char unique_id[kUniqueIdBytes] = {};  // the communicator to join
  char message[160] = {};
};

// ---- per write ----------------------------------------------------------------------------

enum class WireMode : uint32_t {
  kPack = 0,    // gather into a staging buffer, one ncclSend per chunk, scatter on arrival
  kDirect = 1,  // one ncclSend/ncclRecv per run, straight between source and pool
};

struct WireRun {
  uint64_t remote_offset = 0;  // into the receiver's registration
  uint64_t length = 0;
};

struct WriteHeader {
  uint64_t write_id = 0;
  uint64_t registration_id = 0;
  uint64_t total_bytes = 0;   // sum of run lengths
  WireMode mode = WireMode::kPack;
  bool notify = false;
  Notification notification;
  std::vector<WireRun> runs;
};

struct Ack {
  uint64_t write_id = 0;
  int32_t code = 0;  // StatusCode of the receiver's side
};

std::string EncodeFrame(FrameType type, const void* payload, size_t bytes);
std::string EncodeHello(const Hello& h);
std::string EncodeHelloAck(const HelloAck& a);
std::string EncodeWrite(const WriteHeader& h);
std::string EncodeAck(const Ack& a);

// Takes one complete frame off the front of `buf`: OK(true) with type and payload, OK(false)
// when more bytes are needed, kDataLoss for a bad magic, an unknown type or a payload over
// kMaxPayload.
Result<bool> TakeFrame(std::string* buf, FrameType* type, std::string* payload);

// ---- control socket -----------------------------------------------------------------------

// Reading is core::ReadAvailable (transport/core/socket_io.h): it may append the last bytes the
// peer sent before closing, so a caller takes the complete frames from `buf` before it treats
// its false as the end.
// Waits until `deadline` for one frame and returns its payload: kDataLoss for a frame of
// another type (or a bad one), kTimeout at the deadline, kRemoteDisconnect when the peer
// closed the socket before a complete frame - a frame that arrived just before the close
// (a refusal sent right before the peer hung up) is still returned.
Result<std::string> ReadFrame(int fd, std::string* buf, FrameType want, Deadline deadline,
                              const char* what);
Result<Hello> DecodeHello(const std::string& payload);
Result<HelloAck> DecodeHelloAck(const std::string& payload);
Result<WriteHeader> DecodeWrite(const std::string& payload);
Result<Ack> DecodeAck(const std::string& payload);

// ---- chunking -----------------------------------------------------------------------------

struct Piece {
  uint32_t run = 0;            // index into the header's runs
  uint64_t run_offset = 0;     // bytes into that run
  uint64_t chunk_offset = 0;   // where the piece sits in its chunk's staging buffer
  uint64_t length = 0;
};
struct Chunk {
  uint64_t bytes = 0;
  size_t first_piece = 0, pieces = 0;  // into ChunkPlan::pieces
};
struct ChunkPlan {
  std::vector<Chunk> chunks;
  std::vector<Piece> pieces;
};
// chunk_bytes > 0. Runs of length 0 are skipped.
void PlanChunks(const std::vector<WireRun>& runs, uint64_t chunk_bytes, ChunkPlan* out);

// kDirect for few runs (a contiguous layer: NCCL moves it best straight from source to pool), or
// for runs long enough that per-call cost is small against their bytes; kPack otherwise.
inline constexpr size_t kDirectMaxRuns = 8;
inline constexpr uint64_t kDirectMinMeanRun = 4ull << 20;
inline constexpr size_t kDirectMaxRunsLong = 256;
WireMode ChooseMode(size_t runs, uint64_t total_bytes);

}  // namespace kvstream::transport::nccl
