#include "transport/ucx/ucx_wire.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>

#include "transport/core/envelope.h"
#include "transport/core/peer_process.h"
#include "transport/ucx/ucx_blob_check.h"

namespace kvstream::transport::ucx {
namespace {

using internal::PayloadReader;
using internal::PayloadWriter;

// Version 5: the address names a same-host gate instead of a pid, keys carry no memfd. A
// mismatch is refused, never misread.
constexpr internal::WireTag kTag = {{'K', 'V', 'U', 'X'}, 5};
enum Message : uint16_t { kAddress = 1, kKey = 2, kNotify = 3 };

}  // namespace

HostIdentity LocalHostIdentity() {
  HostIdentity id;
  std::ifstream b("/proc/sys/kernel/random/boot_id");
  std::string boot;
  std::getline(b, boot);
  std::strncpy(id.boot_id, boot.c_str(), sizeof(id.boot_id) - 1);
  char link[64] = {};
  if (readlink("/proc/self/ns/pid", link, sizeof(link) - 1) > 0) {
    const char* open = std::strchr(link, '[');
    if (open) id.pid_ns = std::strtoull(open + 1, nullptr, 10);
  }
  return id;
}

bool SameHost(const HostIdentity& a, const HostIdentity& b) {
  return a.boot_id[0] != 0 && std::strncmp(a.boot_id, b.boot_id, sizeof(a.boot_id)) == 0 &&
         a.pid_ns == b.pid_ns;
}

std::string EncodeAddress(const HostIdentity& identity, const void* worker_address, size_t length) {
  return PayloadWriter()
      .Record(identity)
      .Bytes(std::string_view(static_cast<const char*>(worker_address), length))
      .Seal(kTag, kAddress);
}

Result<UcxAddress> DecodeAddress(const std::string& blob) {
  KV_ASSIGN_OR_RETURN(internal::Envelope e, internal::OpenEnvelope(kTag, blob, "peer address"));
  UcxAddress out;
  PayloadReader in(e.payload);
  if (e.type != kAddress || !in.Record(&out.identity) || !in.Bytes(&out.worker_address) ||
      !in.done() || out.worker_address.empty() ||
      std::memchr(out.identity.boot_id, 0, sizeof(out.identity.boot_id)) == nullptr ||
      std::memchr(out.identity.gate_path, 0, sizeof(out.identity.gate_path)) == nullptr) {
    return InvalidArgument("peer address is not a UCX worker address");
  }
  KV_RETURN_IF_ERROR(CheckWorkerAddress(out.worker_address, "peer address"));
  return out;
}

std::string EncodeKey(const void* rkey, size_t length) {
  return PayloadWriter()
      .Bytes(std::string_view(static_cast<const char*>(rkey), length))
      .Seal(kTag, kKey);
}

Result<UcxKey> DecodeKey(const std::string& blob, const std::string& what) {
  KV_ASSIGN_OR_RETURN(internal::Envelope e, internal::OpenEnvelope(kTag, blob, what));
  UcxKey out;
  PayloadReader in(e.payload);
  if (e.type != kKey || !in.Bytes(&out.rkey) || !in.done() ||
      out.rkey.empty()) {
    return InvalidArgument(what + " is not a UCX memory key");
  }
  KV_RETURN_IF_ERROR(CheckPackedRkey(out.rkey, what));
  return out;
}

std::string EncodeNotification(const Notification& n) {
  PayloadWriter out;
  internal::AppendNotification(out, Notification{n.request_id, n.layer, n.flags});
  return out.Seal(kTag, kNotify);
}

Result<Notification> DecodeNotification(std::string_view header) {
  KV_ASSIGN_OR_RETURN(internal::Envelope e,
                      internal::OpenEnvelope(kTag, header, "ucx notification"));
  Notification n;
  PayloadReader in(e.payload);
  if (e.type != kNotify || !internal::ReadNotification(in, &n) || !in.done()) {
    return InvalidArgument("ucx notification of another kind");
  }
  return n;
}

}  // namespace kvstream::transport::ucx
