#include "kernels/layer_ops.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <climits>

#include "common/dummy_init.h"
#include "kernels/dtype_util.cuh"

namespace kvstream::kernels {
namespace {

constexpr int kThreads = 256;

unsigned BlocksFor(size_t n, int threads = kThreads) {
  size_t b = (n + threads - 1) / threads;
  // Grid-stride loops cover the rest; 64k blocks keep every SM busy.
  return static_cast<unsigned>(b > 65535 ? 65535 : (b == 0 ? 1 : b));
}

__global__ void EmbeddingKernel(float* out, const void* table, DType dt, const int32_t* tokens,
                                int vocab, int hidden) {
  const int t = blockIdx.x;
  const int32_t id = tokens[t];
  float* o = out + size_t(t) * hidden;
  if (id < 0 || id >= vocab) {
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) o[i] = 0.f;
    return;
  }
  const size_t base = size_t(id) * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) o[i] = LoadF(table, dt, base + i);
}

// Block-wide sum; every thread gets the result. blockDim.x is a multiple of 32, <= 1024.
__device__ float BlockSum(float v, float* scratch) {
  v = WarpSum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int nwarps = blockDim.x / 32;
  float s = 0.f;
  for (int w = 0; w < nwarps; ++w) s += scratch[w];
  return s;
}

__global__ void RmsNormKernel(void* out, DType odt, const float* x, size_t x_stride,
                              const void* w, DType wdt, int hidden, float eps) {
  __shared__ float scratch[32];
  const int r = blockIdx.x;
  const float* xr = x + size_t(r) * x_stride;
  float ss = 0.f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) ss += xr[i] * xr[i];
  ss = BlockSum(ss, scratch);
  const float inv = rsqrtf(ss / float(hidden) + eps);
  const size_t obase = size_t(r) * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    StoreF(out, odt, obase + i, xr[i] * inv * LoadF(w, wdt, i));
  }
}

__global__ void RopeTableKernel(float* table, const int32_t* positions, const int32_t* rows,
                                const double* inv_freq, int num_tokens, int half, double scale) {
  const size_t n = size_t(num_tokens) * half;
  for (size_t k = blockIdx.x * size_t(blockDim.x) + threadIdx.x; k < n;
       k += size_t(gridDim.x) * blockDim.x) {
    const int t = int(k / half), i = int(k % half);
    const size_t row = rows ? size_t(rows[t]) : 0;
    double s, c;
    sincos(double(positions[t]) * inv_freq[row * half + i], &s, &c);
    table[2 * k] = float(c * scale);
    table[2 * k + 1] = float(s * scale);
  }
}

// One thread per (token, rotated head, i < head_dim/2) pair; bias of v columns added by the
// threads of the k heads' partner range below.
__global__ void BiasRotaryKernel(float* qkv, const void* bias, DType bdt, const float* table,
                                 int num_tokens, int num_heads, int num_kv_heads, int head_dim) {
  const int half = head_dim / 2;
  const int rot_heads = num_heads + num_kv_heads;
  const int width = (num_heads + 2 * num_kv_heads) * head_dim;
  const size_t n_rot = size_t(num_tokens) * rot_heads * half;
  const size_t n_v = size_t(num_tokens) * num_kv_heads * head_dim;
  const size_t n = n_rot + (bias ? n_v : 0);
  for (size_t k = blockIdx.x * size_t(blockDim.x) + threadIdx.x; k < n;
       k += size_t(gridDim.x) * blockDim.x) {
    if (k < n_rot) {
      const int i = int(k % half);
      const size_t th = k / half;
      const int h = int(th % rot_heads);
      const int t = int(th / rot_heads);
      const int c0 = h * head_dim + i, c1 = c0 + half;
      float* row = qkv + size_t(t) * width;
      float x0 = row[c0], x1 = row[c1];
      if (bias) {
        x0 += LoadF(bias, bdt, c0);
        x1 += LoadF(bias, bdt, c1);
      }
      const float cs = table[(size_t(t) * half + i) * 2];
      const float sn = table[(size_t(t) * half + i) * 2 + 1];
      row[c0] = x0 * cs - x1 * sn;
      row[c1] = x1 * cs + x0 * sn;
    } else {
      const size_t kv = k - n_rot;
      const int c = (num_heads + num_kv_heads) * head_dim + int(kv % (size_t(num_kv_heads) * head_dim));
      const int t = int(kv / (size_t(num_kv_heads) * head_dim));
      qkv[size_t(t) * width + c] += LoadF(bias, bdt, c);
    }
  }
}

__global__ void SwiGluKernel(void* out, DType odt, const float* gate_up, int num_tokens,
                             int inter) {
  const size_t n = size_t(num_tokens) * inter;
  for (size_t k = blockIdx.x * size_t(blockDim.x) + threadIdx.x; k < n;
       k += size_t(gridDim.x) * blockDim.x) {
    const size_t t = k / inter, j = k % inter;
    const float g = gate_up[t * 2 * inter + j];
    const float u = gate_up[t * 2 * inter + inter + j];
    StoreF(out, odt, k, g / (1.f + expf(-g)) * u);
  }
}

__global__ void ResidualAddKernel(float* x, const float* y, size_t n) {
  for (size_t k = blockIdx.x * size_t(blockDim.x) + threadIdx.x; k < n;
       k += size_t(gridDim.x) * blockDim.x) {
    x[k] += y[k];
  }
}

__global__ void CopyWordsKernel(int32_t* __restrict__ dst, const int32_t* __restrict__ src,
                                size_t n) {
  for (size_t k = blockIdx.x * size_t(blockDim.x) + threadIdx.x; k < n;
       k += size_t(gridDim.x) * blockDim.x) {
    dst[k] = src[k];
  }
}

__device__ inline bool Better(float v, int i, float bv, int bi) {
  return v > bv || (v == bv && i < bi);
}

__global__ void ArgmaxKernel(int32_t* out, const float* logits, int vocab) {
  __shared__ float sv[1024];
  __shared__ int si[1024];
  const float* row = logits + size_t(blockIdx.x) * vocab;
  float bv = -INFINITY;
  int bi = INT_MAX;
  for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float v = row[j];
    if (Better(v, j, bv, bi)) {
      bv = v;
      bi = j;
    }
  }
  sv[threadIdx.x] = bv;
  si[threadIdx.x] = bi;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) {
      const float v = sv[threadIdx.x + s];
      const int i = si[threadIdx.x + s];
      if (Better(v, i, sv[threadIdx.x], si[threadIdx.x])) {
        sv[threadIdx.x] = v;
        si[threadIdx.x] = i;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = si[0] == INT_MAX ? 0 : si[0];
}

__global__ void ConvertKernel(void* dst, DType ddt, const void* src, DType sdt, size_t n) {
  for (size_t k = blockIdx.x * size_t(blockDim.x) + threadIdx.x; k < n;
       k += size_t(gridDim.x) * blockDim.x) {
    StoreF(dst, ddt, k, LoadF(src, sdt, k));
  }
}

__global__ void GatherRowsKernel(void* dst, DType ddt, const void* src, DType sdt,
                                 size_t src_stride, const int32_t* rows, int cols) {
  const size_t sbase = size_t(rows[blockIdx.x]) * src_stride;
  const size_t dbase = size_t(blockIdx.x) * cols;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    StoreF(dst, ddt, dbase + c, LoadF(src, sdt, sbase + c));
  }
}

__global__ void DummyFillKernel(void* dst, DType ddt, size_t n, uint64_t seed, uint64_t id,
                                uint64_t first, float scale, float offset) {
  for (size_t k = blockIdx.x * size_t(blockDim.x) + threadIdx.x; k < n;
       k += size_t(gridDim.x) * blockDim.x) {
    // __fadd_rn: never contracted into an FMA, so the sum rounds exactly as on the host.
    StoreF(dst, ddt, k, __fadd_rn(offset, DummyValue(seed, id, first + k, scale)));
  }
}

bool ValidDType(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

}  // namespace

cudaError_t EmbeddingGather(float* out, const void* table, DType table_dtype,
                            const int32_t* tokens, int num_tokens, int vocab, int hidden,
                            cudaStream_t stream) {
  if (num_tokens < 0 || vocab <= 0 || hidden <= 0 || !ValidDType(table_dtype)) {
    return cudaErrorInvalidValue;
  }
  if (num_tokens == 0) return cudaSuccess;
  EmbeddingKernel<<<num_tokens, kThreads, 0, stream>>>(out, table, table_dtype, tokens, vocab,
                                                         hidden);
  return cudaGetLastError();
}

cudaError_t RmsNorm(void* out, DType out_dtype, const float* x, size_t x_row_stride,
                    const void* w, DType w_dtype, int rows, int hidden, float eps,
                    cudaStream_t stream) {
  if (rows < 0 || hidden <= 0 || x_row_stride < size_t(hidden) || !ValidDType(out_dtype) ||
      !ValidDType(w_dtype)) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  const int threads = hidden >= 4096 ? 1024 : (hidden >= 1024 ? 512 : 128);
  RmsNormKernel<<<rows, threads, 0, stream>>>(out, out_dtype, x, x_row_stride, w, w_dtype,
                                               hidden, eps);
  return cudaGetLastError();
}

cudaError_t RopeTable(float* table, const int32_t* positions, const int32_t* rows,
                      const double* inv_freq, int num_tokens, int head_dim, double scale,
                      cudaStream_t stream) {
  if (num_tokens < 0 || head_dim <= 0 || head_dim % 2 != 0 || !inv_freq || !(scale > 0)) {
    return cudaErrorInvalidValue;
  }
  if (num_tokens == 0) return cudaSuccess;
  const size_t n = size_t(num_tokens) * (head_dim / 2);
  RopeTableKernel<<<BlocksFor(n), kThreads, 0, stream>>>(table, positions, rows, inv_freq,
                                                          num_tokens, head_dim / 2, scale);
  return cudaGetLastError();
}

cudaError_t BiasRotary(float* qkv, const void* bias, DType bias_dtype, const float* rope_table,
                       int num_tokens, int num_heads, int num_kv_heads, int head_dim,
                       cudaStream_t stream) {
  if (num_tokens < 0 || num_heads <= 0 || num_kv_heads <= 0 || head_dim <= 0 ||
      head_dim % 2 != 0 || (bias && !ValidDType(bias_dtype))) {
    return cudaErrorInvalidValue;
  }
  if (num_tokens == 0) return cudaSuccess;
  const size_t n = size_t(num_tokens) * (num_heads + num_kv_heads) * (head_dim / 2) +
                   (bias ? size_t(num_tokens) * num_kv_heads * head_dim : 0);
  BiasRotaryKernel<<<BlocksFor(n), kThreads, 0, stream>>>(qkv, bias, bias_dtype, rope_table,
                                                           num_tokens, num_heads, num_kv_heads,
                                                           head_dim);
  return cudaGetLastError();
}

cudaError_t SwiGlu(void* out, DType out_dtype, const float* gate_up, int num_tokens, int inter,
                   cudaStream_t stream) {
  if (num_tokens < 0 || inter <= 0 || !ValidDType(out_dtype)) return cudaErrorInvalidValue;
  if (num_tokens == 0) return cudaSuccess;
  const size_t n = size_t(num_tokens) * inter;
  SwiGluKernel<<<BlocksFor(n), kThreads, 0, stream>>>(out, out_dtype, gate_up, num_tokens,
                                                       inter);
  return cudaGetLastError();
}

cudaError_t ResidualAdd(float* x, const float* y, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ResidualAddKernel<<<BlocksFor(n), kThreads, 0, stream>>>(x, y, n);
  return cudaGetLastError();
}

cudaError_t CopyWords(int32_t* dst, const int32_t* src, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  CopyWordsKernel<<<BlocksFor(n), kThreads, 0, stream>>>(dst, src, n);
  return cudaGetLastError();
}

cudaError_t ArgmaxRows(int32_t* out, const float* logits, int rows, int vocab,
                       cudaStream_t stream) {
  if (rows < 0 || vocab <= 0) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  ArgmaxKernel<<<rows, 1024, 0, stream>>>(out, logits, vocab);
  return cudaGetLastError();
}

cudaError_t Convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n,
                    cudaStream_t stream) {
  if (!ValidDType(dst_dtype) || !ValidDType(src_dtype)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  ConvertKernel<<<BlocksFor(n), kThreads, 0, stream>>>(dst, dst_dtype, src, src_dtype, n);
  return cudaGetLastError();
}

cudaError_t GatherRows(void* dst, DType dst_dtype, const void* src, DType src_dtype,
                       size_t src_row_stride, const int32_t* rows, int num_rows, int cols,
                       cudaStream_t stream) {
  if (num_rows < 0 || cols <= 0 || src_row_stride < size_t(cols) || !ValidDType(dst_dtype) ||
      !ValidDType(src_dtype)) {
    return cudaErrorInvalidValue;
  }
  if (num_rows == 0) return cudaSuccess;
  GatherRowsKernel<<<num_rows, kThreads, 0, stream>>>(dst, dst_dtype, src, src_dtype,
                                                       src_row_stride, rows, cols);
  return cudaGetLastError();
}

cudaError_t DummyFill(void* dst, DType dst_dtype, size_t n, uint64_t seed, uint64_t tensor_id,
                      uint64_t first_index, float scale, float offset, cudaStream_t stream) {
  if (!ValidDType(dst_dtype)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  DummyFillKernel<<<BlocksFor(n), kThreads, 0, stream>>>(dst, dst_dtype, n, seed, tensor_id,
                                                          first_index, scale, offset);
  return cudaGetLastError();
}

}  // namespace kvstream::kernels
