// The one framing every backend uses for what it exchanges besides the data itself: its
// address, its memory keys, notifications and control messages (not part of the public API).
//
// An envelope is a 16-byte head and a payload, little-endian (both ends are x86-64 or aarch64):
//   [magic 4][version u16][type u16][payload length u32][FNV-1a 32 of the payload u32][payload]
// A backend has one WireTag (its magic and protocol version; bump the version on any layout
// change) and numbers its message kinds with `type`. A blob of another backend, another
// version, cut short or altered is refused with kInvalidArgument, never misread (UCX, for one,
// parses its own addresses and keys without bounds checks).
//
// Payloads are built from fixed-size records (trivially copyable structs, stored as they are in
// memory) and length-prefixed byte strings; the reader never reads past the payload.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

#include "common/status.h"
#include "transport/transport.h"

namespace kvstream::transport::internal {

struct WireTag {
  char magic[4];
  uint16_t version;
};

struct EnvelopeHead {
  char magic[4];
  uint16_t version;
  uint16_t type;
  uint32_t length;    // payload bytes
  uint32_t checksum;  // FNV-1a 32 of the payload
};
static_assert(sizeof(EnvelopeHead) == 16);

struct Envelope {
  uint16_t type = 0;
  std::string_view payload;  // into the blob given to OpenEnvelope
};

uint32_t Fnv1a32(std::string_view bytes);

std::string SealEnvelope(const WireTag& tag, uint16_t type, std::string_view payload);

// Opens `blob` sealed with `tag`. `exact`: the blob ends with the payload (an address or key);
// otherwise bytes after it are ignored (a record read from a fixed-size mailbox). Errors are
// kInvalidArgument and name `what`.
Result<Envelope> OpenEnvelope(const WireTag& tag, std::string_view blob, std::string_view what,
                              bool exact = true);

// Stream framing (a socket reads the head, then the payload): checks the head's magic and
// version and that the payload is at most `max_length`; CheckEnvelopePayload then checks the
// payload read against the head's length and checksum. kDataLoss on a mismatch.
Result<EnvelopeHead> ReadEnvelopeHead(const WireTag& tag, const void* head, uint32_t max_length,
                                      std::string_view what);
Status CheckEnvelopePayload(const EnvelopeHead& head, std::string_view payload,
                            std::string_view what);

class PayloadWriter {
 public:
  template <class T>
  PayloadWriter& Record(const T& record) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&record), sizeof(T));
    return *this;
  }
  // u32 length, then the bytes.
  PayloadWriter& Bytes(std::string_view bytes);
  std::string Seal(const WireTag& tag, uint16_t type) const { return SealEnvelope(tag, type, out_); }
  const std::string& payload() const { return out_; }

 private:
  std::string out_;
};

// Each call consumes what it reads and returns false (reading nothing) when the payload is too
// short.
class PayloadReader {
 public:
  explicit PayloadReader(std::string_view payload) : in_(payload) {}
  template <class T>
  bool Record(T* record) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (in_.size() < sizeof(T)) return false;
    std::memcpy(record, in_.data(), sizeof(T));
    in_.remove_prefix(sizeof(T));
    return true;
  }
  bool Bytes(std::string_view* bytes);
  bool done() const { return in_.empty(); }

 private:
  std::string_view in_;
};

// A transport.h Notification as a payload record (request_id, layer, flags, landed_seq).
void AppendNotification(PayloadWriter& out, const Notification& n);
bool ReadNotification(PayloadReader& in, Notification* n);

}  // namespace kvstream::transport::internal
