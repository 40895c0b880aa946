#include "transport/cuda_ipc/cuda_ipc_wire.h"

#include <unistd.h>

#include <cstring>

#include "transport/core/host_identity.h"
#include "transport/cuda/cuda_util.h"

namespace kvstream::transport::cuda_ipc {
namespace {

constexpr char kKeyMagic[8] = {'K', 'V', 'I', 'P', 'C', 'K', '0', '1'};
constexpr uint32_t kKeyVersion = 1;

}  // namespace

Result<KeyWire> ParseKey(const std::string& key) {
  if (key.size() != sizeof(KeyWire)) {
    return InvalidArgument("cuda_ipc: remote key has " + std::to_string(key.size()) +
                           " bytes, expected " + std::to_string(sizeof(KeyWire)) +
                           " (not a cuda_ipc key?)");
  }
  KeyWire k;
  std::memcpy(&k, key.data(), sizeof(k));
  if (std::memcmp(k.magic, kKeyMagic, sizeof(kKeyMagic)) != 0) {
    return InvalidArgument("cuda_ipc: remote key has a bad magic (not a cuda_ipc key)");
  }
  if (k.version != kKeyVersion) {
    return InvalidArgument("cuda_ipc: remote key version " + std::to_string(k.version) +
                           ", this build speaks " + std::to_string(kKeyVersion));
  }
  if (k.length == 0 || k.offset > k.alloc_size || k.length > k.alloc_size - k.offset) {
    return InvalidArgument("cuda_ipc: remote key's region lies outside its allocation");
  }
  k.pci_bus_id[sizeof(k.pci_bus_id) - 1] = 0;
  k.host_id[sizeof(k.host_id) - 1] = 0;
  return k;
}

Result<std::unique_ptr<Registration>> RegisterIpcRegion(const MemoryRegion& region) {
  if (region.kind != MemoryKind::kCuda) {
    return NotSupported("cuda_ipc registers only CUDA device memory (kCuda), not host memory");
  }
  if (region.addr == nullptr || region.length == 0) {
    return InvalidArgument("cuda_ipc Register: null address or zero length");
  }
  KV_ASSIGN_OR_RETURN(cuda::DevicePointerInfo info,
                      cuda::QueryDevicePointer(region.addr, region.length));
  if (region.device >= 0 && region.device != info.device) {
    return InvalidArgument("cuda_ipc Register: region says device " +
                           std::to_string(region.device) + " but the memory is on device " +
                           std::to_string(info.device));
  }
  cuda::DeviceGuard guard(info.device);
  KV_RETURN_IF_ERROR(guard.status());
  KeyWire k{};
  std::memcpy(k.magic, kKeyMagic, sizeof(kKeyMagic));
  k.version = kKeyVersion;
  k.device = info.device;
  KV_ASSIGN_OR_RETURN(std::string bus, cuda::PciBusId(info.device));
  std::strncpy(k.pci_bus_id, bus.c_str(), sizeof(k.pci_bus_id) - 1);
  std::strncpy(k.host_id, core::HostIdentity().c_str(), sizeof(k.host_id) - 1);
  k.pid = static_cast<uint64_t>(::getpid());
  k.alloc_base = info.alloc_base;
  k.alloc_size = info.alloc_size;
  k.offset = reinterpret_cast<uint64_t>(region.addr) - info.alloc_base;
  k.length = region.length;
  cudaError_t err = cudaIpcGetMemHandle(&k.handle, reinterpret_cast<void*>(info.alloc_base));
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return NotSupported(std::string("cuda_ipc Register: cudaIpcGetMemHandle refused this "
                                    "allocation (allocate it with cudaMalloc): ") +
                        cudaGetErrorName(err));
  }
  MemoryRegion r = region;
  r.device = info.device;
  return std::unique_ptr<Registration>(
      new IpcRegistration(r, std::string(reinterpret_cast<const char*>(&k), sizeof(k))));
}

}  // namespace kvstream::transport::cuda_ipc
