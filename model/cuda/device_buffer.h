// Device and page-locked host buffers of the CUDA backend (grown, never shrunk).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "common/status.h"

namespace kvstream::model {

// Status of a CUDA call: kResourceExhausted for out-of-memory, else kInternal naming the call.
inline Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return OkStatus();
  if (e == cudaErrorMemoryAllocation) {
    return ResourceExhausted(std::string(what) + ": " + cudaGetErrorString(e));
  }
  return Internal(std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
                  ")");
}

// Owns one cudaMalloc'd region on the device that was current when it was allocated.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Free(); }
  // Grows to at least `bytes` (contents are not kept). The caller makes sure no queued work
  // still uses the old memory.
  Status Reserve(size_t bytes) {
    if (bytes <= size_) return OkStatus();
    Free();
    KV_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&ptr_, bytes), "cudaMalloc"));
    size_ = bytes;
    return OkStatus();
  }
  void Free() {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    size_ = 0;
  }
  void* get() const { return ptr_; }
  template <typename T> T* as() const { return static_cast<T*>(ptr_); }
  size_t size() const { return size_; }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

// Page-locked host staging memory (so async copies are truly asynchronous).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { Free(); }
  Status Reserve(size_t bytes) {
    if (bytes <= size_) return OkStatus();
    Free();
    KV_RETURN_IF_ERROR(CudaStatus(cudaMallocHost(&ptr_, bytes), "cudaMallocHost"));
    size_ = bytes;
    return OkStatus();
  }
  void Free() {
    if (ptr_) cudaFreeHost(ptr_);
    ptr_ = nullptr;
    size_ = 0;
  }
  template <typename T> T* as() const { return static_cast<T*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kvstream::model
