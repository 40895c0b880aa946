#include "transport/staged/staged_wire.h"

#include "transport/core/envelope.h"

namespace kvstream::transport::staged {

// Version 5: the hello names the writer's admission ticket (version 4: its address and a box
// the receiver connected back to; before 4, the address was "KVSTGA02", the hello "KVSTHL03",
// the key "KVSTRK01").
static constexpr internal::WireTag kTag = {{'K', 'V', 'S', 'T'}, 5};
enum StagedMessage : uint16_t { kAddress = 1, kKey = 2, kHelloRecord = 3 };
using PayloadReader = internal::PayloadReader;
using PayloadWriter = internal::PayloadWriter;

std::string EncodeAddress(const StagedAddress& a) {
  return PayloadWriter()
      .Record(a.area)
      .Bytes(a.inner_address)
      .Bytes(a.staging_key)
      .Seal(kTag, kAddress);
}

Result<StagedAddress> DecodeAddress(const std::string& blob) {
  auto e = internal::OpenEnvelope(kTag, blob, "ucx_staged peer address");
  if (!e.ok()) {
    return InvalidArgument("ucx_staged: peer address is not a ucx_staged address (or another "
                           "version): " + e.status().message());
  }
  StagedAddress a;
  PayloadReader in(e->payload);
  std::string_view inner, key;
  if (e->type != kAddress || !in.Record(&a.area) || !in.Bytes(&inner) || !in.Bytes(&key) ||
      !in.done()) {
    return InvalidArgument("ucx_staged: peer address is not a ucx_staged address");
  }
  a.inner_address.assign(inner);
  a.staging_key.assign(key);
  const StagingArea& s = a.area;
  if (s.chunk_bytes == 0 || s.slots == 0 || s.slot_stride != kHeaderBytes + s.chunk_bytes ||
      s.mailboxes == 0 ||
      s.staging_len < uint64_t(s.mailboxes) * kMailboxBytes + uint64_t(s.slots) * s.slot_stride) {
    return InvalidArgument("ucx_staged: peer address describes an unusable staging area");
  }
  return a;
}

std::string EncodeKey(const StagedKey& k) { return PayloadWriter().Record(k).Seal(kTag, kKey); }

Result<StagedKey> DecodeKey(const std::string& blob, size_t region) {
  const std::string what = "ucx_staged: region " + std::to_string(region);
  auto e = internal::OpenEnvelope(kTag, blob, what + "'s key");
  StagedKey k{};
  if (!e.ok()) return InvalidArgument(what + " has no ucx_staged key: " + e.status().message());
  PayloadReader in(e->payload);
  if (e->type != kKey || !in.Record(&k) || !in.done() || k.length == 0) {
    return InvalidArgument(what + " has no ucx_staged key");
  }
  return k;
}

std::string EncodeHello(const Hello& h) {
  return PayloadWriter()
      .Record(h.head)
      .Bytes(h.ticket)
      .Seal(kTag, kHelloRecord);
}

Result<Hello> DecodeHello(std::string_view mailbox) {
  KV_ASSIGN_OR_RETURN(internal::Envelope e,
                      internal::OpenEnvelope(kTag, mailbox, "hello", /*exact=*/false));
  Hello h;
  PayloadReader in(e.payload);
  std::string_view ticket;
  if (e.type != kHelloRecord || !in.Record(&h.head) || !in.Bytes(&ticket) || !in.done()) {
    return InvalidArgument("hello of another kind");
  }
  h.ticket.assign(ticket);
  return h;
}

}  // namespace kvstream::transport::staged
