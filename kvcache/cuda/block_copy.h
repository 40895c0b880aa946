// Gathered block copies between a GPU KV pool and page-locked host memory, for the tiers below
// the pool (kvcache/cuda/pinned_tier.h).
//
// CopyBlocks copies, for every layer in [layer_begin, layer_end) and every i < n, the
// `block_bytes` run at src_base + layer * src_layer_stride + src_ids[i] * block_bytes to the
// same place of dst (dst_ids[i]): one kernel launch for all of them, whatever the ids, so a
// prefix of scattered blocks moves in one transfer per layer range instead of one copy per block
// and layer. Either side may be device memory or mapped page-locked host memory
// (cudaHostAllocMapped; read and written by the kernel over the link); the id arrays must be
// readable by the device (device or mapped host memory) until the copy has run.
// block_bytes must be a multiple of 16. `ctas` bounds the thread blocks (the copy's share of the
// SMs). Returns the launch's error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace kvstream::kvcache::cuda {

struct BlockCopy {
  const std::byte* src_base = nullptr;
  size_t src_layer_stride = 0;
  const int32_t* src_ids = nullptr;
  std::byte* dst_base = nullptr;
  size_t dst_layer_stride = 0;
  const int32_t* dst_ids = nullptr;
  int n = 0;
  size_t block_bytes = 0;
  int layer_begin = 0, layer_end = 1;
};

cudaError_t CopyBlocks(const BlockCopy& c, int ctas, cudaStream_t stream);

}  // namespace kvstream::kvcache::cuda
