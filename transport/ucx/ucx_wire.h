// What the UCX backend publishes and sends besides the data (transport/core/envelope.h with the
// tag "KVUX"): its address (who and where the worker runs, then UCX's worker address), its
// memory keys (the memfd a same-host writer can map, then UCX's packed rkey) and the
// notification that follows a write (an active message's header).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"
#include "transport/transport.h"

namespace kvstream::transport::ucx {

// The active-message id of notifications.
inline constexpr unsigned kNotifyAmId = 17;

// Who and where a worker runs, carried in front of the ucp address so that a writer on the
// same host (same boot, same pid namespace) can copy with process_vm_writev (CMA) directly.
struct HostIdentity {
  char boot_id[40] = {};
  uint64_t pid_ns = 0;
  uint32_t pid = 0;
  uint64_t start_time = 0;  // /proc/<pid>/stat field 22: tells a reused pid apart
};
static_assert(sizeof(HostIdentity) == 64);

HostIdentity LocalHostIdentity();
// Same boot and pid namespace (and a boot id known at all).
bool SameHost(const HostIdentity& a, const HostIdentity& b);

// In front of the packed UCX rkey: where a same-host writer can map the region's memory
// (Allocate() backs it with a memfd; fd = -1 for memory the caller registered).
struct MemfdDescriptor {
  int32_t fd = -1;
  uint32_t reserved = 0;
  uint64_t ino = 0;
  uint64_t dev = 0;
  uint64_t base = 0;    // the owner's address of byte 0 of the file
  uint64_t length = 0;
};
static_assert(sizeof(MemfdDescriptor) == 40);

// Maps the whole memfd `f` of process `pid` (shared, read-write) when it is still the file the
// key names (inode and device) and covers region `r`; MAP_FAILED otherwise.
void* MapPeerMemfd(pid_t pid, const MemfdDescriptor& f, const RemoteRegion& r);

struct UcxAddress {
  HostIdentity identity;
  std::string_view worker_address;  // into the blob decoded
};
std::string EncodeAddress(const HostIdentity& identity, const void* worker_address, size_t length);
Result<UcxAddress> DecodeAddress(const std::string& blob);  // kInvalidArgument when not one

struct UcxKey {
  MemfdDescriptor memfd;
  std::string_view rkey;  // into the blob decoded
};
std::string EncodeKey(const MemfdDescriptor& memfd, const void* rkey, size_t length);
Result<UcxKey> DecodeKey(const std::string& blob, const std::string& what);

// The notification's active-message header (its landed_seq is not carried: always 0).
std::string EncodeNotification(const Notification& n);
Result<Notification> DecodeNotification(std::string_view header);

}  // namespace kvstream::transport::ucx
