// Small RAII helpers for the GPU tests.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace kvstream::testing_gpu {

#define ASSERT_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << #expr << ": " << cudaGetErrorString(cudaGetLastError())

// A device copy of a host vector (or zeroed storage), freed on destruction.
template <typename T>
class DeviceVec {
 public:
  explicit DeviceVec(size_t n) : n_(n) {
    if (cudaMalloc(reinterpret_cast<void**>(&p_), std::max<size_t>(n, 1) * sizeof(T)) != cudaSuccess) p_ = nullptr;
    if (p_) cudaMemset(p_, 0, std::max<size_t>(n, 1) * sizeof(T));
  }
  explicit DeviceVec(const std::vector<T>& h) : DeviceVec(h.size()) {
    if (p_ && !h.empty()) cudaMemcpy(p_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  DeviceVec(const DeviceVec&) = delete;
  DeviceVec& operator=(const DeviceVec&) = delete;
  ~DeviceVec() { if (p_) cudaFree(p_); }
  T* get() const { return p_; }
  size_t size() const { return n_; }
  std::vector<T> Download() const {
    std::vector<T> h(n_);
    if (p_ && n_) cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

}  // namespace kvstream::testing_gpu
