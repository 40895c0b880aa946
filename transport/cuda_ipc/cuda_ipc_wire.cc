#include "transport/cuda_ipc/cuda_ipc_wire.h"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/cuda_vmm.h"
#include "common/log.h"
#include "transport/core/host_identity.h"
#include "transport/cuda/cuda_util.h"

namespace kvstream::transport::cuda_ipc {
namespace {

constexpr char kKeyMagic[8] = {'K', 'V', 'I', 'P', 'C', 'K', '0', '2'};
constexpr uint32_t kKeyVersion = 2;
static_assert(sizeof(KeyWire) == 8 + 4 + 4 + 32 + 48 + 3 * 8);
static_assert(sizeof(GrantInfo) == 40);

Result<uint64_t> NewGrantId() {
  uint64_t id = 0;
  while (id == 0) {
    ssize_t r = ::getrandom(&id, sizeof(id), 0);
    if (r < 0 && errno == EINTR) continue;
    if (r != static_cast<ssize_t>(sizeof(id))) {
      return Internal(std::string("cuda_ipc: getrandom: ") + std::strerror(errno));
    }
  }
  return id;
}

}  // namespace

IpcRegistration::~IpcRegistration() {
  if (grant_id_ != 0) grants_->Remove(grant_id_);
}

Result<KeyWire> ParseKey(const std::string& key) {
  if (key.size() != sizeof(KeyWire)) {
    return InvalidArgument("cuda_ipc: remote key has " + std::to_string(key.size()) +
                           " bytes, expected " + std::to_string(sizeof(KeyWire)) +
                           " (not a cuda_ipc key?)");
  }
  KeyWire k;
  std::memcpy(&k, key.data(), sizeof(k));
  if (std::memcmp(k.magic, kKeyMagic, sizeof(kKeyMagic)) != 0) {
    return InvalidArgument("cuda_ipc: remote key has a bad magic (not a cuda_ipc key of this "
                           "version: keys with CUDA IPC handles are no longer accepted)");
  }
  if (k.version != kKeyVersion) {
    return InvalidArgument("cuda_ipc: remote key version " + std::to_string(k.version) +
                           ", this build speaks " + std::to_string(kKeyVersion));
  }
  if (k.length == 0 || k.offset + k.length < k.offset) {
    return InvalidArgument("cuda_ipc: remote key's region is empty or wraps around");
  }
  k.pci_bus_id[sizeof(k.pci_bus_id) - 1] = 0;
  k.host_id[sizeof(k.host_id) - 1] = 0;
  return k;
}

Result<GrantInfo> ParseGrantInfo(const std::string& info) {
  if (info.size() != sizeof(GrantInfo)) {
    return InvalidArgument("cuda_ipc: memory grant info has " + std::to_string(info.size()) +
                           " bytes, expected " + std::to_string(sizeof(GrantInfo)));
  }
  GrantInfo g;
  std::memcpy(&g, info.data(), sizeof(g));
  if (g.alloc_size == 0 || g.length == 0 || g.offset > g.alloc_size ||
      g.length > g.alloc_size - g.offset) {
    return InvalidArgument("cuda_ipc: memory grant's registration lies outside its allocation");
  }
  return g;
}

void GrantTable::Add(uint64_t id, int fd, const GrantInfo& info) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_[id] = Entry{fd, info};
}

void GrantTable::Remove(uint64_t id) {
  int fd = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) return;
    fd = it->second.fd;
    entries_.erase(it);
  }
  ::close(fd);
}

Result<cuda::MemoryGrant> GrantTable::Grant(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || id == 0) {
    return NotFound("no registration of this receiver has that grant id (a forged key, or one "
                    "whose registration is gone)");
  }
  cuda::MemoryGrant g;
  g.fd = ::fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
  if (g.fd < 0) return Unavailable(std::string("cuda_ipc: dup of a memory descriptor: ") + std::strerror(errno));
  g.info.assign(reinterpret_cast<const char*>(&it->second.info), sizeof(GrantInfo));
  return g;
}

Result<std::unique_ptr<Registration>> RegisterIpcRegion(const MemoryRegion& region,
                                                        std::shared_ptr<GrantTable> grants) {
  if (region.kind != MemoryKind::kCuda) {
    return NotSupported("cuda_ipc registers only CUDA device memory (kCuda), not host memory");
  }
  if (region.addr == nullptr || region.length == 0) {
    return InvalidArgument("cuda_ipc Register: null address or zero length");
  }
  const uint64_t addr = reinterpret_cast<uint64_t>(region.addr);
  if (addr + region.length < addr) return InvalidArgument("cuda_ipc Register: region wraps around");
  int device = -1;
  uint64_t alloc_base = 0, alloc_size = 0;
  int fd = -1;
  auto exported = cuda_vmm::ExportShareable(region.addr);
  if (exported.ok()) {
    fd = exported.value().fd;
    device = exported.value().device;
    alloc_base = exported.value().base;
    alloc_size = exported.value().size;
    if (addr + region.length > alloc_base + alloc_size) {
      ::close(fd);
      return InvalidArgument("cuda_ipc Register: the region runs past the end of its allocation");
    }
  } else {
    // Not shareable: registered for local use only (grant id 0 in the key).
    if (exported.status().code() != StatusCode::kFailedPrecondition) {
      KV_LOG_WARN << "cuda_ipc Register: memory not exported, usable as a source only: "
                  << exported.status().ToString();
    }
    KV_ASSIGN_OR_RETURN(cuda::DevicePointerInfo info,
                        cuda::QueryDevicePointer(region.addr, region.length));
    device = info.device;
    alloc_base = info.alloc_base;
    alloc_size = info.alloc_size;
  }
  struct CloseOnError {
    int* fd;
    ~CloseOnError() {
      if (*fd >= 0) ::close(*fd);
    }
  } close_on_error{&fd};
  if (region.device >= 0 && region.device != device) {
    return InvalidArgument("cuda_ipc Register: region says device " + std::to_string(region.device) +
                           " but the memory is on device " + std::to_string(device));
  }
  KeyWire k{};
  std::memcpy(k.magic, kKeyMagic, sizeof(kKeyMagic));
  k.version = kKeyVersion;
  k.device = device;
  KV_ASSIGN_OR_RETURN(std::string bus, cuda::PciBusId(device));
  std::strncpy(k.pci_bus_id, bus.c_str(), sizeof(k.pci_bus_id) - 1);
  std::strncpy(k.host_id, core::HostIdentity().c_str(), sizeof(k.host_id) - 1);
  k.offset = addr - alloc_base;
  k.length = region.length;
  if (fd >= 0) {
    KV_ASSIGN_OR_RETURN(k.grant_id, NewGrantId());
    GrantInfo g{alloc_base, alloc_size, k.offset, k.length, device, 0};
    grants->Add(k.grant_id, fd, g);
    fd = -1;  // the table's now
  }
  MemoryRegion r = region;
  r.device = device;
  return std::unique_ptr<Registration>(new IpcRegistration(
      r, std::string(reinterpret_cast<const char*>(&k), sizeof(k)), std::move(grants), k.grant_id));
}

}  // namespace kvstream::transport::cuda_ipc
