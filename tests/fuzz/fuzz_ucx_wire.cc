// Fuzzes the UCX backend's blob parsers (transport/ucx/ucx_wire.h): DecodeAddress, DecodeKey,
// DecodeNotification and DecodeTicket, and the walks of UCX's own address and rkey (ucx_blob_check.h).
// data[0] picks the parser (bit 0x40: a walk); with bit 0x80 the rest is first sealed as that
// kind of blob (tag and type taken from an encoded one), so the payload checks are reached.
// What decodes must encode back to the same bytes.
#include <cstdint>
#include <cstring>
#include <string>

#include "tests/fuzz/fuzz_util.h"
#include "transport/core/envelope.h"
#include "transport/ucx/ucx_blob_check.h"
#include "transport/ucx/ucx_wire.h"

namespace {

using namespace kvstream::transport;
using kvstream::fuzz::Fail;

// `payload` sealed with the tag and type of `model` (an encoded blob of the kind wanted).
std::string SealLike(const std::string& model, std::string_view payload) {
  internal::EnvelopeHead head;
  std::memcpy(&head, model.data(), sizeof(head));
  internal::WireTag tag;
  std::memcpy(tag.magic, head.magic, sizeof(tag.magic));
  tag.version = head.version;
  return internal::SealEnvelope(tag, head.type, payload);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  std::string blob(reinterpret_cast<const char*>(data + 1), size - 1);
  const char one = 1;
  if (mode & 0x40) {  // UCX's own blobs, walked before UCX sees them (ucx_blob_check.h)
    if (mode & 1)
      (void)ucx::CheckWorkerAddress(blob, "fuzz address");
    else
      (void)ucx::CheckPackedRkey(blob, "fuzz rkey");
    return 0;
  }
  switch (mode % 4) {
    case 0: {
      if (mode & 0x80) blob = SealLike(ucx::EncodeAddress(ucx::HostIdentity{}, {}), blob);
      auto a = ucx::DecodeAddress(blob);
      if (!a.ok()) break;
      if (a->listener.port == 0) Fail("a listener without a port accepted");
      if (ucx::EncodeAddress(a->identity, a->listener) != blob)
        Fail("address does not encode back to its blob");
      (void)ucx::SameHost(a->identity, ucx::HostIdentity{});
      (void)ucx::ToString(a->listener);
      break;
    }
    case 3: {
      if (mode & 0x80) blob = SealLike(ucx::EncodeTicket(ucx::UcxTicket{}), blob);
      auto t = ucx::DecodeTicket(blob);
      if (!t.ok()) break;
      if (t->client_id == 0 || t->source.port == 0) Fail("an empty ticket accepted");
      if (ucx::EncodeTicket(*t) != blob) Fail("ticket does not encode back to its blob");
      break;
    }
    case 1: {
      if (mode & 0x80) blob = SealLike(ucx::EncodeKey(&one, 1, (mode & 0x20) != 0), blob);
      auto k = ucx::DecodeKey(blob, "fuzz key");
      if (!k.ok()) break;
      if (k->rkey.empty()) Fail("empty rkey accepted");
      if (ucx::EncodeKey(k->rkey.data(), k->rkey.size(), k->cuda) != blob)
        Fail("key does not encode back to its blob");
      break;
    }
    case 2: {
      if (mode & 0x80) blob = SealLike(ucx::EncodeNotification(Notification{}), blob);
      auto n = ucx::DecodeNotification(blob);
      if (n.ok() && ucx::DecodeNotification(ucx::EncodeNotification(*n))->request_id != n->request_id)
        Fail("notification does not encode back");
      break;
    }
  }
  return 0;
}
