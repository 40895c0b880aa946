#include "kernels/kv_write.h"

#include "kernels/dtype_util.cuh"

namespace kvstream::kernels {
namespace {

__global__ void KvWriteKernel(KvWriteParams p) {
  const int width = p.num_kv_heads * p.head_dim;
  const size_t n = size_t(p.num_tokens) * width;
  const int64_t max_slot = int64_t(p.num_blocks) * p.block_size;
  for (size_t k = blockIdx.x * size_t(blockDim.x) + threadIdx.x; k < n;
       k += size_t(gridDim.x) * blockDim.x) {
    const int t = int(k / width);
    const int c = int(k % width);
    const int32_t s = p.slot_mapping[t];
    if (s < 0 || s >= max_slot) continue;
    const int block = s / p.block_size, slot = s % p.block_size;
    const int h = c / p.head_dim, d = c % p.head_dim;
    const size_t tile = size_t(p.block_size) * p.head_dim;
    const size_t kidx = (size_t(block) * 2 * p.num_kv_heads + h) * tile + size_t(slot) * p.head_dim + d;
    const size_t vidx = kidx + size_t(p.num_kv_heads) * tile;
    StoreF(p.kv_layer, p.dtype, kidx, p.k[size_t(t) * p.src_row_stride + c]);
    StoreF(p.kv_layer, p.dtype, vidx, p.v[size_t(t) * p.src_row_stride + c]);
  }
}

}  // namespace

cudaError_t KvWrite(const KvWriteParams& p, cudaStream_t stream) {
  if (p.num_tokens < 0 || p.num_kv_heads <= 0 || p.head_dim <= 0 || p.block_size <= 0 ||
      p.num_blocks <= 0 || (p.dtype != DType::kF16 && p.dtype != DType::kBF16) ||
      p.src_row_stride < size_t(p.num_kv_heads) * p.head_dim || !p.kv_layer || !p.k || !p.v ||
      !p.slot_mapping) {
    return p.num_tokens == 0 ? cudaSuccess : cudaErrorInvalidValue;
  }
  if (p.num_tokens == 0) return cudaSuccess;
  const size_t n = size_t(p.num_tokens) * p.num_kv_heads * p.head_dim;
  size_t blocks = (n + 255) / 256;
  if (blocks > 65535) blocks = 65535;
  KvWriteKernel<<<unsigned(blocks), 256, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kvstream::kernels
