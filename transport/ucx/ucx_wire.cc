#include "transport/ucx/ucx_wire.h"

#include <arpa/inet.h>
#include <netinet/in.h>
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

// Version 7: keys say whether the region is CUDA memory; data messages. (6: the address names a
// ucp_listener instead of a UCX worker address; tickets.) A mismatch is refused, never misread.
constexpr internal::WireTag kTag = {{'K', 'V', 'U', 'X'}, 7};
enum Message : uint16_t { kAddress = 1, kKey = 2, kNotify = 3, kTicket = 4, kData = 5 };

bool ValidSockAddr(const WireSockAddr& w) {
  return (w.family == AF_INET || w.family == AF_INET6) && w.port != 0 && w.reserved == 0;
}

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

WireSockAddr ToWire(const sockaddr* sa) {
  WireSockAddr w;
  if (sa == nullptr) return w;
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    w.family = AF_INET;
    w.port = ntohs(in->sin_port);
    std::memcpy(w.addr, &in->sin_addr, 4);
  } else if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    w.port = ntohs(in6->sin6_port);
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {  // an IPv4 peer seen through an IPv6 socket
      w.family = AF_INET;
      std::memcpy(w.addr, reinterpret_cast<const uint8_t*>(&in6->sin6_addr) + 12, 4);
    } else {
      w.family = AF_INET6;
      std::memcpy(w.addr, &in6->sin6_addr, 16);
    }
  }
  return w;
}

bool FromWire(const WireSockAddr& w, sockaddr_storage* out, unsigned* length) {
  if (!ValidSockAddr(w)) return false;
  std::memset(out, 0, sizeof(*out));
  if (w.family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(out);
    in->sin_family = AF_INET;
    in->sin_port = htons(w.port);
    std::memcpy(&in->sin_addr, w.addr, 4);
    *length = sizeof(sockaddr_in);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(out);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(w.port);
    std::memcpy(&in6->sin6_addr, w.addr, 16);
    *length = sizeof(sockaddr_in6);
  }
  return true;
}

bool IsWildcard(const WireSockAddr& w) {
  static const uint8_t kZero[16] = {};
  return std::memcmp(w.addr, kZero, w.family == AF_INET ? 4 : 16) == 0;
}

bool SameEndpoint(const WireSockAddr& a, const WireSockAddr& b) {
  return a.family == b.family && a.port == b.port &&
         std::memcmp(a.addr, b.addr, a.family == AF_INET ? 4 : 16) == 0;
}

std::string ToString(const WireSockAddr& w) {
  char buf[INET6_ADDRSTRLEN] = "?";
  if (w.family == AF_INET || w.family == AF_INET6) inet_ntop(w.family, w.addr, buf, sizeof(buf));
  return w.family == AF_INET6 ? "[" + std::string(buf) + "]:" + std::to_string(w.port)
                              : std::string(buf) + ":" + std::to_string(w.port);
}

std::string EncodeAddress(const HostIdentity& identity, const WireSockAddr& listener) {
  return PayloadWriter().Record(identity).Record(listener).Seal(kTag, kAddress);
}

Result<UcxAddress> DecodeAddress(const std::string& blob) {
  KV_ASSIGN_OR_RETURN(internal::Envelope e, internal::OpenEnvelope(kTag, blob, "peer address"));
  UcxAddress out;
  PayloadReader in(e.payload);
  if (e.type != kAddress || !in.Record(&out.identity) || !in.Record(&out.listener) ||
      !in.done() || !ValidSockAddr(out.listener) ||
      std::memchr(out.identity.boot_id, 0, sizeof(out.identity.boot_id)) == nullptr ||
      std::memchr(out.identity.gate_path, 0, sizeof(out.identity.gate_path)) == nullptr) {
    return InvalidArgument("peer address is not a UCX listener address");
  }
  return out;
}

std::string EncodeTicket(const UcxTicket& ticket) {
  return PayloadWriter().Record(ticket.client_id).Record(ticket.source).Seal(kTag, kTicket);
}

Result<UcxTicket> DecodeTicket(const std::string& blob) {
  KV_ASSIGN_OR_RETURN(internal::Envelope e,
                      internal::OpenEnvelope(kTag, blob, "ucx admission ticket"));
  UcxTicket out;
  PayloadReader in(e.payload);
  if (e.type != kTicket || !in.Record(&out.client_id) || !in.Record(&out.source) || !in.done() ||
      out.client_id == 0 || !ValidSockAddr(out.source)) {
    return InvalidArgument("ucx admission ticket is malformed");
  }
  return out;
}

std::string EncodeKey(const void* rkey, size_t length, bool cuda) {
  return PayloadWriter()
      .Record(static_cast<uint32_t>(cuda ? 1 : 0))
      .Bytes(std::string_view(static_cast<const char*>(rkey), length))
      .Seal(kTag, kKey);
}

Result<UcxKey> DecodeKey(const std::string& blob, const std::string& what) {
  KV_ASSIGN_OR_RETURN(internal::Envelope e, internal::OpenEnvelope(kTag, blob, what));
  UcxKey out;
  PayloadReader in(e.payload);
  uint32_t kind = 0;
  if (e.type != kKey || !in.Record(&kind) || !in.Bytes(&out.rkey) || !in.done() ||
      out.rkey.empty() || kind > 1) {
    return InvalidArgument(what + " is not a UCX memory key");
  }
  out.cuda = kind == 1;
  KV_RETURN_IF_ERROR(CheckPackedRkey(out.rkey, what));
  return out;
}

std::string EncodeDataHeader(const UcxDataHeader& h) {
  return PayloadWriter().Record(h).Seal(kTag, kData);
}

Result<UcxDataHeader> DecodeDataHeader(std::string_view header) {
  KV_ASSIGN_OR_RETURN(internal::Envelope e,
                      internal::OpenEnvelope(kTag, header, "ucx data message header"));
  UcxDataHeader h;
  PayloadReader in(e.payload);
  if (e.type != kData || !in.Record(&h) || !in.done() || h.length == 0 ||
      h.addr + h.length < h.addr) {
    return InvalidArgument("ucx data message header is malformed");
  }
  return h;
}

std::string EncodeNotification(const Notification& n) {
  PayloadWriter out;
  internal::AppendNotification(out, Notification{n.request_id, n.layer, n.flags});
  out.Record(n.mac);
  return out.Seal(kTag, kNotify);
}

Result<Notification> DecodeNotification(std::string_view header) {
  KV_ASSIGN_OR_RETURN(internal::Envelope e,
                      internal::OpenEnvelope(kTag, header, "ucx notification"));
  Notification n;
  PayloadReader in(e.payload);
  if (e.type != kNotify || !internal::ReadNotification(in, &n) || !in.Record(&n.mac) ||
      !in.done()) {
    return InvalidArgument("ucx notification of another kind");
  }
  return n;
}

}  // namespace kvstream::transport::ucx
