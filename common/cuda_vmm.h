// GPU memory that crosses processes only as a file descriptor (issue 15): made with the CUDA
// driver's virtual memory management (cuMemCreate with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
// cuMemAddressReserve, cuMemMap, cuMemSetAccess) instead of cudaMalloc, so that it can be exported
// as a descriptor (cuMemExportToShareableHandle) and handed to one peer over a Unix socket
// (SCM_RIGHTS). Whoever holds the descriptor can map the memory and nobody else can, unlike a
// legacy cudaIpcMemHandle, which any GPU process on the host that learns its bytes can open.
// The driver is reached through dlsym on libcuda.so.1 (nothing links libcuda); CUDA 12 and 13.
// Built only with CUDA (library kvstream_common_cuda_vmm); the header itself needs no CUDA.
//
// Guarantees:
//  - ShareableDeviceMemory: at least `bytes` (rounded up to the allocation granularity, 2 MiB on
//    current GPUs) of device memory, readable and writable from its device by any CUDA API
//    (copies, kernels, NCCL); contents unspecified. The destructor unmaps it and frees its
//    address range; the physical memory lives on while an importer still maps it.
//  - ExportShareable gives a new descriptor (close-on-exec, the caller closes it) for an address
//    inside ShareableDeviceMemory, or inside any cuMemCreate allocation made with POSIX
//    descriptor handles and mapped whole; kFailedPrecondition, naming why, for other memory
//    (cudaMalloc'd, or cuMem memory without POSIX descriptor handles).
//  - ImportedMapping maps a peer's exported allocation into this process for `device`, read and
//    write; the destructor unmaps it and frees the address range. The descriptor stays the
//    caller's (close it once Import returned).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/status.h"

namespace kvstream::cuda_vmm {

// OK when `device` can make and share such memory (the driver has virtual memory management
// and POSIX descriptor handles on it); kUnavailable naming what is missing otherwise.
Status Supported(int device);

class ShareableDeviceMemory {
 public:
  static Result<std::unique_ptr<ShareableDeviceMemory>> Allocate(int device, size_t bytes);
  ~ShareableDeviceMemory();
  ShareableDeviceMemory(const ShareableDeviceMemory&) = delete;
  ShareableDeviceMemory& operator=(const ShareableDeviceMemory&) = delete;
  void* data() const { return reinterpret_cast<void*>(base_); }
  size_t size() const { return size_; }  // the rounded-up size
  int device() const { return device_; }

 private:
  ShareableDeviceMemory() = default;
  uint64_t base_ = 0;
  size_t size_ = 0;
  int device_ = -1;
};

struct ExportedAllocation {
  int fd = -1;         // the allocation's descriptor, owned by the caller
  uint64_t base = 0;   // where the allocation is mapped in this process
  uint64_t size = 0;   // its mapped size (what an importer maps)
  int device = -1;     // the device it lives on
};
// The allocation that holds `ptr`, exported as a descriptor.
Result<ExportedAllocation> ExportShareable(const void* ptr);

class ImportedMapping {
 public:
  // Imports the allocation behind `fd` (exported by ExportShareable, possibly in another
  // process) and maps its first `size` bytes for `device`.
  static Result<std::unique_ptr<ImportedMapping>> Import(int fd, uint64_t size, int device);
  ~ImportedMapping();
  ImportedMapping(const ImportedMapping&) = delete;
  ImportedMapping& operator=(const ImportedMapping&) = delete;
  void* base() const { return reinterpret_cast<void*>(base_); }
  uint64_t size() const { return size_; }

 private:
  ImportedMapping() = default;
  uint64_t base_ = 0;
  uint64_t size_ = 0;
  int device_ = -1;
};

}  // namespace kvstream::cuda_vmm
