// Which host (and boot) this process runs on, for backends that must tell a same-host peer from
// a remote one (cuda_ipc refuses keys from another host; nccl refuses two ranks on one GPU).
#pragma once

#include <string>

namespace kvstream::transport::core {

// The kernel's boot id (/proc/sys/kernel/random/boot_id): differs between hosts and between
// boots of one host. "unknown-boot-id" where it cannot be read. Read once per process.
std::string HostIdentity();

}  // namespace kvstream::transport::core
