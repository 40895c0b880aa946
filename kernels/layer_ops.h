// The small element-wise and row-wise ops of a Llama-family decoder layer on the GPU
// (embedding gather, RMSNorm, bias + rotary, SwiGLU, residual add, argmax, dtype conversion,
// dummy-weight fill). The GEMMs between them run in cuBLAS; attention and the KV write have
// files of their own (prefill_attention.h, kv_write.h, paged_attention.h).
//
// Conventions for every launcher here:
//  - All pointers are device pointers; tensors are row-major without padding unless a row
//    stride is given (in elements).
//  - "act" tensors (the residual stream, GEMM outputs) are fp32; "dtype" tensors (weights,
//    GEMM inputs, attention inputs) are DType::kF16 or DType::kBF16 (kF32 also accepted where
//    noted).
//  - Launches only: no synchronisation, no allocation. Returns cudaErrorInvalidValue for a bad
//    shape or dtype (nothing launched), otherwise the launch error (cudaGetLastError).
//  - n == 0 (rows, tokens, elements) launches nothing and returns cudaSuccess.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace kvstream::kernels {

// out[t][h] = float(table[tokens[t]][h]).
//   tokens: [num_tokens] int32, each in [0, vocab) (checked by the caller; an id out of range
//           writes zeros instead of reading out of bounds)
//   table:  [vocab][hidden] dtype (f16, bf16 or f32)
//   out:    [num_tokens][hidden] f32
cudaError_t EmbeddingGather(float* out, const void* table, DType table_dtype,
                            const int32_t* tokens, int num_tokens, int vocab, int hidden,
                            cudaStream_t stream);

// HF Llama RMSNorm with fp32 accumulation:
//   out[r][i] = to_dtype( x[r][i] * rsqrt(mean_i(x[r][i]^2) + eps) * w[i] )
//   x:   [rows] rows of `hidden` f32, row r starting at x + r * x_row_stride
//   w:   [hidden] w_dtype (f16, bf16 or f32)
//   out: [rows][hidden] out_dtype (f16, bf16 or f32), packed
cudaError_t RmsNorm(void* out, DType out_dtype, const float* x, size_t x_row_stride,
                    const void* w, DType w_dtype, int rows, int hidden, float eps,
                    cudaStream_t stream);

// Rotary table for a batch of tokens (HF rotate_half convention) from inverse frequencies
// computed on the host (model/rope.h's RopeFrequencies: every rope type, once, for every
// backend):
//   table[t][i] = {cos(a) * scale, sin(a) * scale},  a = positions[t] * inv_freq[rows[t]][i]
//   positions: [num_tokens] int32 >= 0; rows: [num_tokens] int32, the inv_freq row of each
//   token (null: row 0 for all); inv_freq: [rows][head_dim/2] double;
//   table: [num_tokens][head_dim/2][2] f32.
//   The angle, its sine/cosine and the scaling are computed in double, then rounded to float.
cudaError_t RopeTable(float* table, const int32_t* positions, const int32_t* rows,
                      const double* inv_freq, int num_tokens, int head_dim, double scale,
                      cudaStream_t stream);

// In place on the fused QKV projection output of num_tokens tokens:
//   qkv: [num_tokens][(num_heads + 2 * num_kv_heads) * head_dim] f32, columns
//        [q heads | k heads | v heads], each head head_dim wide.
//   bias (optional, null = none): [(num_heads + 2 * num_kv_heads) * head_dim] bias_dtype,
//        added to every column first (Qwen2's q/k/v biases).
//   Then every q and k head of token t is rotated with table[t] (RopeTable):
//     y[i] = x[i] cos - x[i + d/2] sin,   y[i + d/2] = x[i + d/2] cos + x[i] sin,  i < d/2.
//   head_dim must be even.
cudaError_t BiasRotary(float* qkv, const void* bias, DType bias_dtype, const float* rope_table,
                       int num_tokens, int num_heads, int num_kv_heads, int head_dim,
                       cudaStream_t stream);

// out[t][j] = to_dtype( silu(gate_up[t][j]) * gate_up[t][inter + j] ),  silu(g) = g / (1 + e^-g)
//   gate_up: [num_tokens][2 * inter] f32 (gate columns first, then up)
//   out:     [num_tokens][inter] out_dtype (f16, bf16 or f32)
cudaError_t SwiGlu(void* out, DType out_dtype, const float* gate_up, int num_tokens, int inter,
                   cudaStream_t stream);

// x[i] += y[i] for i < n (f32). The backend folds its residual adds into cuBLAS (beta = 1);
// this is the stand-alone op for callers that cannot.
cudaError_t ResidualAdd(float* x, const float* y, size_t n, cudaStream_t stream);

// out[r] = argmax_j logits[r][j]; the lowest index wins ties, NaNs never win (a row of only
// NaNs gives 0).
//   logits: [rows][vocab] f32, out: [rows] int32
cudaError_t ArgmaxRows(int32_t* out, const float* logits, int rows, int vocab,
                       cudaStream_t stream);

// dst[i] = convert(src[i]) for i < n; any pair of f32/f16/bf16 (round to nearest even).
cudaError_t Convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n,
                    cudaStream_t stream);

// Row gather with conversion: dst[r][c] = convert(src[rows[r] * src_row_stride + c]) for
// c < cols; dst packed [num_rows][cols].
cudaError_t GatherRows(void* dst, DType dst_dtype, const void* src, DType src_dtype,
                       size_t src_row_stride, const int32_t* rows, int num_rows, int cols,
                       cudaStream_t stream);

// dst[i] = to_dtype(offset + DummyValue(seed, tensor_id, first_index + i, scale)) for i < n
// (common/dummy_init.h): bit-identical to the host computing the same expression in float and
// rounding it with common/dtype.h.
cudaError_t DummyFill(void* dst, DType dst_dtype, size_t n, uint64_t seed, uint64_t tensor_id,
                      uint64_t first_index, float scale, float offset, cudaStream_t stream);

// dst[i] = src[i] for i < n, 32-bit words, copied by the SMs on `stream`. `src` may be page-locked
// host memory (cudaMallocHost: mapped under unified addressing): a small upload that does not
// queue behind other streams' bulk copies on the copy engines (e.g. a KV tier's prefetch).
cudaError_t CopyWords(int32_t* dst, const int32_t* src, size_t n, cudaStream_t stream);

}  // namespace kvstream::kernels
