// What cuda_ipc puts on the wire (internal to transport/cuda_ipc/): the RemoteKey of a
// registered region, and what a memory grant on the control socket says about the memory whose
// descriptor it carries (transport/cuda/control_socket.h). The notification frames are the
// control socket's.
//
// Key layout (fixed, host byte order: same host only):
//   magic "KVIPCK02" | u32 version | i32 device | char pci_bus_id[32] | char host_id[48] |
//   u64 grant_id | u64 offset | u64 length
// No handle travels: grant_id names the registration to the receiver, which hands the
// memory's descriptor only to a writer on its control socket (its uid, its token). grant_id 0:
// the memory is not shareable (not made with cuMemCreate and POSIX descriptor handles, e.g.
// cudaMalloc'd): usable as a local source, refused as a write target.
// Grant info: u64 alloc_id (the receiver's address of the allocation: which grants share one
// mapping) | u64 alloc_size | u64 offset | u64 length (the registration inside it) | i32 device |
// u32 0.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/status.h"
#include "transport/cuda/control_socket.h"
#include "transport/transport.h"

namespace kvstream::transport::cuda_ipc {

struct KeyWire {
  char magic[8];
  uint32_t version;
  int32_t device;
  char pci_bus_id[32];
  char host_id[48];
  uint64_t grant_id;
  uint64_t offset;
  uint64_t length;
};

struct GrantInfo {
  uint64_t alloc_id;
  uint64_t alloc_size;
  uint64_t offset;
  uint64_t length;
  int32_t device;
  uint32_t reserved;
};

// kInvalidArgument (naming what is wrong) for a blob that is not a cuda_ipc key of this version.
// The strings come back NUL-terminated.
Result<KeyWire> ParseKey(const std::string& key);
// kInvalidArgument for grant info that is malformed or whose registration lies outside its
// allocation.
Result<GrantInfo> ParseGrantInfo(const std::string& info);

// What a receiver hands out: its registrations that are shareable, by grant id.
class GrantTable {
 public:
  // `fd` is the allocation's descriptor, owned by the table until Remove(id).
  void Add(uint64_t id, int fd, const GrantInfo& info);
  void Remove(uint64_t id);  // closes the descriptor
  // A duplicate of the descriptor (the caller's) and the info, or kNotFound: the id is not a
  // registration of this transport (a forged key, or one whose registration is gone).
  Result<cuda::MemoryGrant> Grant(uint64_t id);

 private:
  struct Entry {
    int fd;
    GrantInfo info;
  };
  std::mutex mu_;
  std::map<uint64_t, Entry> entries_;
};

// A registration of cuda_ipc, entered in its transport's grant table while it lives (when
// shareable: grant_id != 0).
class IpcRegistration : public Registration {
 public:
  IpcRegistration(MemoryRegion region, std::string key, std::shared_ptr<GrantTable> grants,
                  uint64_t grant_id)
      : region_(region), key_(std::move(key)), grants_(std::move(grants)), grant_id_(grant_id) {}
  ~IpcRegistration() override;
  const MemoryRegion& region() const override { return region_; }
  std::string RemoteKey() const override { return key_; }

 private:
  MemoryRegion region_;
  std::string key_;
  std::shared_ptr<GrantTable> grants_;
  uint64_t grant_id_;
};

// Transport::Register for cuda_ipc: kNotSupported for host memory, kInvalidArgument for a bad
// region. Shareable device memory (common/cuda_vmm.h) is exported once and entered in `grants`
// under a random grant id until the registration goes; other device memory is registered for
// local use (as a write's source) with grant id 0.
Result<std::unique_ptr<Registration>> RegisterIpcRegion(const MemoryRegion& region,
                                                        std::shared_ptr<GrantTable> grants);

}  // namespace kvstream::transport::cuda_ipc
