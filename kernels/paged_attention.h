// Paged decode attention (one query token per sequence) over the KV pool layout of
// model/kv_cache.h, with an optional L2 prefetch of each warp's next KV block
// (cp.async.bulk.prefetch.L2.global, sm_90).
//
// Tensors (row-major, no padding):
//   q, out:        [num_seqs][num_heads][head_dim]                     dtype
//   kv_layer:      [num_blocks][2][num_kv_heads][block_size][head_dim] dtype  (one layer)
//   block_tables:  [num_seqs][max_blocks_per_seq]                      int32 (device)
//   context_lens:  [num_seqs]                                           int32 (device)
// Query head h reads KV head h / (num_heads / num_kv_heads).
//
// Guarantees: launches only (no synchronisation, no allocation); returns the launch error or
// cudaErrorInvalidValue for an unsupported shape (see PagedDecodeSupported); workspace must be
// at least PagedDecodeWorkspaceBytes(...) bytes of device memory, or null when that is 0.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace kvstream::kernels {

enum class Prefetch : int { kAuto = -1, kOff = 0, kOn = 1 };

struct PagedDecodeParams {
  void* out = nullptr;
  const void* q = nullptr;
  const void* kv_layer = nullptr;
  const int32_t* block_tables = nullptr;
  const int32_t* context_lens = nullptr;
  int num_seqs = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;
  int max_blocks_per_seq = 0;
  int max_context_len = 0;      // upper bound of context_lens (host-known), for split planning
  float scale = 0.f;            // softmax scale, usually 1/sqrt(head_dim)
  DType dtype = DType::kF16;    // kF16 or kBF16
  Prefetch prefetch = Prefetch::kAuto;
  int num_splits = 0;           // 0 = chosen by shape
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

bool PagedDecodeSupported(const PagedDecodeParams& p);
size_t PagedDecodeWorkspaceBytes(const PagedDecodeParams& p);
cudaError_t PagedDecodeAttention(const PagedDecodeParams& p, cudaStream_t stream);

}  // namespace kvstream::kernels
