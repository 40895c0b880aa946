// What the UCX backend publishes and sends besides the data (transport/core/envelope.h with the
// tag "KVUX"): its address (where the worker runs and how a same-host writer reaches its
// same-host gate, then UCX's worker address), its memory keys (UCX's packed rkey) and the
// notification that follows a write (an active message's header).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"
#include "transport/transport.h"

namespace kvstream::transport::ucx {

// The active-message id of notifications.
inline constexpr unsigned kNotifyAmId = 17;

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

struct UcxAddress {
  HostIdentity identity;
  std::string_view worker_address;  // into the blob decoded
};
std::string EncodeAddress(const HostIdentity& identity, const void* worker_address, size_t length);
Result<UcxAddress> DecodeAddress(const std::string& blob);  // kInvalidArgument when not one

struct UcxKey {
  std::string_view rkey;  // into the blob decoded
};
std::string EncodeKey(const void* rkey, size_t length);
Result<UcxKey> DecodeKey(const std::string& blob, const std::string& what);

// The notification's active-message header (its landed_seq is not carried: always 0).
std::string EncodeNotification(const Notification& n);
Result<Notification> DecodeNotification(std::string_view header);

}  // namespace kvstream::transport::ucx
