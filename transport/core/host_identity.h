// Which host (and boot) this process runs on, for backends that must tell a same-host peer from
// a remote one (cuda_ipc refuses keys from another host; nccl refuses two ranks on one GPU).
#pragma once

#include <string>

namespace kvstream::transport::core {

// The kernel's boot id (/proc/sys/kernel/random/boot_id): differs between hosts and between
// boots of one host. Read once per process. Where it cannot be read, an identity of this process
// alone (HostIdentityFromBootId("")), which no peer matches: same-host shortcuts are then refused
// rather than taken with a peer that may be on another host.
std::string HostIdentity();

// What HostIdentity() makes of the boot id file's first line: the line itself, or for an empty
// one "no-boot-id/" and 32 random hex digits, different at every call. At most 47 characters
// (the wire keys hold 48 bytes with the terminator).
std::string HostIdentityFromBootId(const std::string& boot_id);

}  // namespace kvstream::transport::core
