// What cuda_ipc puts on the wire: the RemoteKey of a registered region (internal to
// transport/cuda_ipc/). The notification frames are the control socket's
// (transport/cuda/control_socket.h).
//
// Key layout (fixed, host byte order: same host only):
//   magic "KVIPCK01" | u32 version | i32 device | char pci_bus_id[32] | char host_id[48] |
//   u64 pid | u64 alloc_base | u64 alloc_size | u64 offset | u64 length | cudaIpcMemHandle_t
// offset and length place the region inside the allocation the handle opens.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "transport/transport.h"

namespace kvstream::transport::cuda_ipc {

struct KeyWire {
  char magic[8];
  uint32_t version;
  int32_t device;
  char pci_bus_id[32];
  char host_id[48];
  uint64_t pid;
  uint64_t alloc_base;
  uint64_t alloc_size;
  uint64_t offset;
  uint64_t length;
  cudaIpcMemHandle_t handle;
};

// kInvalidArgument (naming what is wrong) for a blob that is not a cuda_ipc key of this version
// or whose region lies outside its allocation. The strings come back NUL-terminated.
Result<KeyWire> ParseKey(const std::string& key);

// A registered cuda_ipc region: its key is made once, at Register.
class IpcRegistration : public Registration {
 public:
  IpcRegistration(MemoryRegion region, std::string key)
      : region_(region), key_(std::move(key)) {}
  const MemoryRegion& region() const override { return region_; }
  std::string RemoteKey() const override { return key_; }

 private:
  MemoryRegion region_;
  std::string key_;
};

// Transport::Register for cuda_ipc: kNotSupported for host memory or an allocation CUDA IPC
// cannot export, kInvalidArgument for a bad region.
Result<std::unique_ptr<Registration>> RegisterIpcRegion(const MemoryRegion& region);

}  // namespace kvstream::transport::cuda_ipc
