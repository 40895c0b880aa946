// CUDA helpers shared by the GPU transport backends (cuda_ipc, ucx_staged, nccl). Internal to
// transport/; the daemons never include this.
//
// Guarantees:
//  - Every CUDA error becomes a kvstream::Status naming the call (never an exception, never
//    an abort).
//  - DeviceGuard restores the caller's current device on scope exit.
//  - EventPool hands out events created once (cudaEventDisableTiming) and reuses them; an
//    event goes back to the pool only when the caller releases it, and all are destroyed with
//    the pool.
//  - WaitStreamIdle never blocks past its deadline.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/time.h"

namespace kvstream::transport::cuda {

// kInternal "<what>: <cudaGetErrorName>: <cudaGetErrorString>" (OK on cudaSuccess).
Status CudaStatus(cudaError_t err, std::string_view what);

#define KV_CUDA_RETURN_IF_ERROR(expr, what)                                          \
  do {                                                                               \
    cudaError_t kv_cuda_err_ = (expr);                                               \
    if (kv_cuda_err_ != cudaSuccess) return ::kvstream::transport::cuda::CudaStatus( \
        kv_cuda_err_, what);                                                         \
  } while (0)

// OK with the number of usable devices (> 0), else kUnavailable saying why (no driver, no
// device, CUDA_VISIBLE_DEVICES empty, ...).
Result<int> UsableDeviceCount();

// The device a GPU backend is created on: `requested`, or the caller's current device when
// negative. kUnavailable when none is usable (UsableDeviceCount), kInvalidArgument
// "<backend>: device <n> does not exist (<count> visible)" when it is not one of them.
Result<int> ResolveDevice(int requested, std::string_view backend);

// Makes `device` ready for a backend created on it: its primary context initialised and every
// scatter-copy kernel loaded now (PreloadScatterKernels, kernels/scatter_copy.h), not at a first Write()
// issued behind running compute. The caller's current device is restored.
Status PrepareDevice(int device);

// Sets `device` current for the scope; restores the previous device afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  const Status& status() const { return status_; }

 private:
  int previous_ = -1;
  bool restore_ = false;
  Status status_;
};

class EventPool {
 public:
  explicit EventPool(int device) : device_(device) {}
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  Result<cudaEvent_t> Acquire();
  void Release(cudaEvent_t event);
  size_t created() const;

 private:
  int device_;
  mutable std::mutex mu_;
  std::vector<cudaEvent_t> free_;
  std::vector<cudaEvent_t> all_;
};

// An owned stream at the device's LOWEST priority (transfers must not delay compute).
class Stream {
 public:
  static Result<std::unique_ptr<Stream>> CreateLowestPriority(int device);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }
  int priority() const { return priority_; }

 private:
  Stream() = default;
  cudaStream_t stream_ = nullptr;
  int device_ = -1;
  int priority_ = 0;
};

// Polls the stream until it is idle or the deadline passes (kTimeout); a stream error is
// returned as is.
Status WaitStreamIdle(cudaStream_t stream, Deadline deadline);
// Same for one event.
Status WaitEvent(cudaEvent_t event, Deadline deadline);

// Pinned host memory (cudaHostAlloc, portable + mapped): visible to kernels through UVA.
class PinnedBuffer {
 public:
  static Result<std::unique_ptr<PinnedBuffer>> Allocate(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  PinnedBuffer() = default;
  void* data_ = nullptr;
  size_t size_ = 0;
};

// Device memory (cudaMalloc) owned for the object's lifetime.
class DeviceBuffer {
 public:
  static Result<std::unique_ptr<DeviceBuffer>> Allocate(int device, size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  DeviceBuffer() = default;
  void* data_ = nullptr;
  size_t size_ = 0;
  int device_ = -1;
};

struct DevicePointerInfo {
  int device = -1;
  uint64_t alloc_base = 0;   // start of the cudaMalloc allocation holding the pointer
  uint64_t alloc_size = 0;
};

// Checks that [ptr, ptr+length) is CUDA device memory inside one allocation; kInvalidArgument
// otherwise (host, managed or unregistered memory, or a range past the allocation's end).
Result<DevicePointerInfo> QueryDevicePointer(const void* ptr, size_t length);

// PCI bus id of a device ("0000:3b:00.0"), used to match devices across processes whose
// CUDA_VISIBLE_DEVICES differ.
Result<std::string> PciBusId(int device);

}  // namespace kvstream::transport::cuda
