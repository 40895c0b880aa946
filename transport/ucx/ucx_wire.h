// What the UCX backend publishes and sends besides the data (transport/core/envelope.h with the
// tag "KVUX"): its address (where the worker runs and how a same-host writer reaches its
// same-host gate, then UCX's worker address), its memory keys (UCX's packed rkey) and the
// notification that follows a write (an active message's header), and the admission ticket a
// writer's endpoint hands back to the receiver.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"
#include "transport/transport.h"

namespace kvstream::transport::ucx {

// The active-message id of notifications.
inline constexpr unsigned kNotifyAmId = 17;
// The active-message id of data written as messages (CUDA memory on either side): the receiver
// lands each in memory it registered, after checking the range its header names.
inline constexpr unsigned kDataAmId = 18;

// Where a worker runs and how a writer on the same host (same boot, same pid namespace) reaches
// its same-host gate (ucx_same_host.h), carried in front of the ucp address. No pid: a writer
// learns the receiver's pid from the kernel (SO_PEERCRED on the gate's socket), never from this.
struct HostIdentity {
  char boot_id[40] = {};
  uint64_t pid_ns = 0;
  char gate_path[108] = {};    // the receiver's gate socket; empty = no same-host shortcut
  uint8_t gate_token[16] = {};  // what a writer presents there (travels with the handshake)
  uint32_t reserved = 0;
};
static_assert(sizeof(HostIdentity) == 176);

// This host's boot id and pid namespace (no gate).
HostIdentity LocalHostIdentity();
// Same boot and pid namespace (and a boot id known at all).
bool SameHost(const HostIdentity& a, const HostIdentity& b);

// A socket address on the wire: IPv4 or IPv6, the address bytes in network order, the port in
// host order.
struct WireSockAddr {
  uint16_t family = 0;  // AF_INET or AF_INET6
  uint16_t port = 0;
  uint8_t addr[16] = {};
  uint32_t reserved = 0;
};
static_assert(sizeof(WireSockAddr) == 24);

// 0 family where `sa` is not an IP address; an IPv4-mapped IPv6 address becomes IPv4.
WireSockAddr ToWire(const struct sockaddr* sa);
// False for another family or a port 0.
bool FromWire(const WireSockAddr& w, struct sockaddr_storage* out, unsigned* length);
bool IsWildcard(const WireSockAddr& w);  // 0.0.0.0 or ::
bool SameEndpoint(const WireSockAddr& a, const WireSockAddr& b);  // family, address and port
std::string ToString(const WireSockAddr& w);  // "1.2.3.4:5" / "[::1]:5"

// The address a UCX transport publishes: where it runs (for the same-host gate) and its
// ucp_listener's socket address. No UCX worker address: a writer connects to the listener.
struct UcxAddress {
  HostIdentity identity;
  WireSockAddr listener;
};
std::string EncodeAddress(const HostIdentity& identity, const WireSockAddr& listener);
Result<UcxAddress> DecodeAddress(const std::string& blob);  // kInvalidArgument when not one

// What a receiver admits (Transport::Admit): the writer worker's random client id, sent in its
// connection request, and the socket address its connection comes from.
struct UcxTicket {
  uint64_t client_id = 0;
  WireSockAddr source;
};
std::string EncodeTicket(const UcxTicket& ticket);
Result<UcxTicket> DecodeTicket(const std::string& blob);  // kInvalidArgument when not one

struct UcxKey {
  std::string_view rkey;  // into the blob decoded
  bool cuda = false;      // the region is CUDA memory (written with data messages)
};
std::string EncodeKey(const void* rkey, size_t length, bool cuda);
Result<UcxKey> DecodeKey(const std::string& blob, const std::string& what);

// A data message's header: where in the receiver's memory its bytes go (the receiver's virtual
// address, as its RemoteRegion names it, and the length; the message carries exactly that many).
struct UcxDataHeader {
  uint64_t addr = 0;
  uint64_t length = 0;
};
std::string EncodeDataHeader(const UcxDataHeader& h);
Result<UcxDataHeader> DecodeDataHeader(std::string_view header);  // kInvalidArgument when not one

// The notification's active-message header, its MAC included (its landed_seq is not carried:
// always 0).
std::string EncodeNotification(const Notification& n);
Result<Notification> DecodeNotification(std::string_view header);

}  // namespace kvstream::transport::ucx
