// Writes the K and V of new tokens into one layer of the paged KV pool (model/kv_cache.h).
//
// Tensors:
//   kv_layer:     [num_blocks][2 (K, V)][num_kv_heads][block_size][head_dim] dtype (one layer
//                 of the pool: KvPool::layer_base(l))
//   k, v:         f32; token t's kv head h starts at k + t * src_row_stride + h * head_dim (the
//                 k and v column ranges of the fused QKV projection output)
//   slot_mapping: [num_tokens] int32 device: block_id * block_size + slot of token t, or < 0
//                 to skip the token; a slot past num_blocks * block_size is skipped too.
//
// Guarantees: launches only; elements are rounded to nearest even in dtype; returns
// cudaErrorInvalidValue for a bad shape or dtype (nothing launched), else the launch error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace kvstream::kernels {

struct KvWriteParams {
  void* kv_layer = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  size_t src_row_stride = 0;
  const int32_t* slot_mapping = nullptr;
  int num_tokens = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;
  int num_blocks = 0;
  DType dtype = DType::kF16;  // kF16 or kBF16
};

cudaError_t KvWrite(const KvWriteParams& p, cudaStream_t stream);

}  // namespace kvstream::kernels
