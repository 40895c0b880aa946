// Causal attention for the new tokens of a batch of sequences (prefill, chunked prefill, or
// any number of new tokens per sequence), reading every key and value, old and new, from the
// paged KV pool (model/kv_cache.h). Tiled with an online softmax (FlashAttention-2 style): no
// score matrix is materialised; both products (Q K^T and P V) run on tensor cores (mma.sync
// m16n8k16, fp32 accumulation; P is rounded to the KV dtype for the second one); key tiles are
// gathered through the block table into shared memory with cp.async, double buffered; the K/V
// of one tile of keys is read once for the whole group of query heads that shares its KV head
// (GQA: a CTA's 128 rows are (token, query head of the group) pairs).
//
// Tensors (row-major, no padding):
//   q, out:       [num_tokens][num_heads][head_dim] dtype, 16-byte aligned; the rows of
//                 sequence s are [q_start[s], q_start[s + 1])
//   kv_layer:     [num_blocks][2 (K, V)][num_kv_heads][block_size][head_dim] dtype (one layer);
//                 16-byte aligned
//   block_tables: [num_seqs][max_blocks_per_seq] int32 device
//   q_start:      [num_seqs + 1] int32 device, non-decreasing, q_start[0] = 0
//   start_pos:    [num_seqs] int32 device: tokens of sequence s already in the cache. Row
//                 q_start[s] + i is the token at position start_pos[s] + i; it attends to the
//                 keys at positions [0, start_pos[s] + i], whose K/V must already be in the pool
//                 (write the new tokens' K/V first: kv_write.h).
// Query head h reads KV head h / (num_heads / num_kv_heads).
// Supported: head_dim 32, 64, 128, 256; dtype kF16 or kBF16; num_heads a multiple of num_kv_heads.
//
// Guarantees: launches only (no synchronisation, no allocation); returns cudaErrorInvalidValue
// for an unsupported shape (nothing launched), else the launch error. max_q_len must bound
// q_start[s + 1] - q_start[s] for every s (rows past it are not computed).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/dtype.h"

namespace kvstream::kernels {

struct PrefillAttentionParams {
  void* out = nullptr;
  const void* q = nullptr;
  const void* kv_layer = nullptr;
  const int32_t* block_tables = nullptr;
  const int32_t* q_start = nullptr;
  const int32_t* start_pos = nullptr;
  int num_seqs = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;
  int max_blocks_per_seq = 0;
  int max_q_len = 0;
  float scale = 0.f;  // softmax scale, usually 1/sqrt(head_dim)
  DType dtype = DType::kF16;
};

bool PrefillAttentionSupported(const PrefillAttentionParams& p);
cudaError_t PrefillAttention(const PrefillAttentionParams& p, cudaStream_t stream);

}  // namespace kvstream::kernels
