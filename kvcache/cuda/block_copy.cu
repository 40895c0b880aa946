#include "kvcache/cuda/block_copy.h"

namespace kvstream::kvcache::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // 16-byte loads in flight per thread: enough to cover the link's latency

__global__ void CopyBlocksKernel(BlockCopy c, size_t items_per_block, size_t items_per_layer,
                                 size_t total_items) {
  const size_t vec_per_block = c.block_bytes / 16;
  for (size_t item = blockIdx.x; item < total_items; item += gridDim.x) {
    const size_t layer = c.layer_begin + item / items_per_layer;
    const size_t rest = item % items_per_layer;
    const size_t i = rest / items_per_block;
    const size_t first = (rest % items_per_block) * size_t(kThreads * kUnroll);
    const uint4* src = reinterpret_cast<const uint4*>(c.src_base + layer * c.src_layer_stride +
                                                      size_t(c.src_ids[i]) * c.block_bytes);
    uint4* dst = reinterpret_cast<uint4*>(c.dst_base + layer * c.dst_layer_stride +
                                          size_t(c.dst_ids[i]) * c.block_bytes);
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t k = first + size_t(u) * kThreads + threadIdx.x;
      if (k < vec_per_block) v[u] = src[k];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t k = first + size_t(u) * kThreads + threadIdx.x;
      if (k < vec_per_block) dst[k] = v[u];
    }
  }
}

}  // namespace

cudaError_t CopyBlocks(const BlockCopy& c, int ctas, cudaStream_t stream) {
  if (c.n <= 0 || c.layer_end <= c.layer_begin) return cudaSuccess;
  if (c.block_bytes == 0 || c.block_bytes % 16 != 0) return cudaErrorInvalidValue;
  const size_t vec_per_block = c.block_bytes / 16;
  const size_t items_per_block = (vec_per_block + kThreads * kUnroll - 1) / (kThreads * kUnroll);
  const size_t items_per_layer = items_per_block * size_t(c.n);
  const size_t total = items_per_layer * size_t(c.layer_end - c.layer_begin);
  const unsigned grid = unsigned(total < size_t(ctas > 0 ? ctas : 1) ? total : size_t(ctas > 0 ? ctas : 1));
  CopyBlocksKernel<<<grid, kThreads, 0, stream>>>(c, items_per_block, items_per_layer, total);
  return cudaGetLastError();
}

}  // namespace kvstream::kvcache::cuda
