#include "kernels/prefill_attention.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/dtype_util.cuh"

namespace kvstream::kernels {
namespace {

constexpr int kWarps = 8;
constexpr int kRowsPerWarp = 4;
constexpr int kRows = kWarps * kRowsPerWarp;  // (token, head-of-group) rows per CTA
constexpr int kKeys = 32;                     // keys per tile: one per lane
constexpr float kLog2e = 1.4426950408889634f;

template <int HD>
constexpr size_t SmemBytes() {
  return sizeof(float) * (size_t(kRows) * HD + size_t(kKeys) * (HD + 4) + size_t(kKeys) * HD);
}

// One CTA: one sequence, one KV head, kRows consecutive rows r = token * group + g (query head
// kv_head * group + g). Each warp owns kRowsPerWarp rows; lane j scores key j of the tile, and
// lane l accumulates output dims l, l + 32, ...
template <typename T, int HD>
__global__ void __launch_bounds__(kWarps * 32, 2)
PrefillAttentionKernel(PrefillAttentionParams p) {
  static_assert(HD % 32 == 0 && HD % 8 == 0, "head_dim");
  constexpr int kC = HD / 32;
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  // Rows of k_s are padded by 4 floats: lane j reads key j's row 16 bytes at a time, and the
  // 8 lanes of each quarter-warp then hit distinct banks.
  constexpr int kKStride = HD + 4;
  float* q_s = smem;                        // [kRows][HD], pre-scaled by scale * log2(e)
  float* k_s = q_s + kRows * HD;            // [kKeys][kKStride]
  float* v_s = k_s + kKeys * kKStride;      // [kKeys][HD]

  const int s = blockIdx.z;
  const int kvh = blockIdx.y;
  const int group = p.num_heads / p.num_kv_heads;
  const int q0 = p.q_start[s];
  const int n_new = p.q_start[s + 1] - q0;
  const int total_rows = n_new * group;
  const int row0 = blockIdx.x * kRows;
  if (row0 >= total_rows) return;
  const int pos0 = p.start_pos[s];
  const int last_row = min(row0 + kRows, total_rows) - 1;
  const int kv_len = pos0 + last_row / group + 1;  // keys any row of this CTA may read

  const T* q = static_cast<const T*>(p.q);
  const float qscale = p.scale * kLog2e;
  for (int idx = threadIdx.x; idx < kRows * HD; idx += blockDim.x) {
    const int r = idx / HD, d = idx % HD;
    const int row = row0 + r;
    float v = 0.f;
    if (row < total_rows) {
      const int head = kvh * group + row % group;
      v = ToF(q[(size_t(q0 + row / group) * p.num_heads + head) * HD + d]) * qscale;
    }
    q_s[idx] = v;
  }

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wrow = warp * kRowsPerWarp;
  int pos[kRowsPerWarp];
  int warp_max_pos = -1;
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int row = row0 + wrow + i;
    pos[i] = row < total_rows ? pos0 + row / group : -1;
    warp_max_pos = max(warp_max_pos, pos[i]);
  }
  float m[kRowsPerWarp], l[kRowsPerWarp], o[kRowsPerWarp][kC];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int c = 0; c < kC; ++c) o[i][c] = 0.f;
  }

  const T* kv = static_cast<const T*>(p.kv_layer);
  const int32_t* table = p.block_tables + size_t(s) * p.max_blocks_per_seq;
  const size_t tile = size_t(p.block_size) * HD;
  const size_t v_off = size_t(p.num_kv_heads) * tile;
  constexpr int kVec = 8;  // elements per 16-byte load

  for (int kt0 = 0; kt0 < kv_len; kt0 += kKeys) {
    __syncthreads();  // the previous tile is no longer read
    for (int idx = threadIdx.x; idx < kKeys * (HD / kVec); idx += blockDim.x) {
      const int j = idx / (HD / kVec);
      const int d = (idx % (HD / kVec)) * kVec;
      const int key = kt0 + j;
      float kf[kVec], vf[kVec];
      if (key < kv_len) {
        const int block = table[key / p.block_size];
        const size_t base = (size_t(block) * 2 * p.num_kv_heads + kvh) * tile +
                            size_t(key % p.block_size) * HD + d;
        const uint4 kraw = *reinterpret_cast<const uint4*>(kv + base);
        const uint4 vraw = *reinterpret_cast<const uint4*>(kv + base + v_off);
        const T* ke = reinterpret_cast<const T*>(&kraw);
        const T* ve = reinterpret_cast<const T*>(&vraw);
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          kf[e] = ToF(ke[e]);
          vf[e] = ToF(ve[e]);
        }
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e) kf[e] = vf[e] = 0.f;
      }
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        k_s[j * kKStride + d + e] = kf[e];
        v_s[j * HD + d + e] = vf[e];
      }
    }
    __syncthreads();
    if (warp_max_pos < kt0) continue;  // warp-uniform: every row of this warp is done

    float sc[kRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) sc[i] = 0.f;
    const float4* krow = reinterpret_cast<const float4*>(k_s + lane * kKStride);
    const float4* qrows = reinterpret_cast<const float4*>(q_s + wrow * HD);
#pragma unroll 4
    for (int d4 = 0; d4 < HD / 4; ++d4) {
      const float4 kd = krow[d4];
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) {
        const float4 qd = qrows[i * (HD / 4) + d4];  // same address for every lane: broadcast
        sc[i] += qd.x * kd.x + qd.y * kd.y + qd.z * kd.z + qd.w * kd.w;
      }
    }
    const int key = kt0 + lane;
    float pr[kRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const bool valid = key <= pos[i];
      const float sv = valid ? sc[i] : -INFINITY;
      const float m_new = fmaxf(m[i], WarpMax(sv));
      if (m_new == -INFINITY) {  // no visible key yet (padding row): leave the row as is
        pr[i] = 0.f;
        continue;
      }
      pr[i] = valid ? exp2f(sv - m_new) : 0.f;
      const float alpha = exp2f(m[i] - m_new);  // m = -inf on the first tile: alpha = 0
      l[i] = l[i] * alpha + WarpSum(pr[i]);
      m[i] = m_new;
#pragma unroll
      for (int c = 0; c < kC; ++c) o[i][c] *= alpha;
    }
#pragma unroll 4
    for (int j = 0; j < kKeys; ++j) {
      float vj[kC];
#pragma unroll
      for (int c = 0; c < kC; ++c) vj[c] = v_s[j * HD + lane + 32 * c];
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) {
        const float pj = __shfl_sync(0xffffffffu, pr[i], j);
#pragma unroll
        for (int c = 0; c < kC; ++c) o[i][c] += pj * vj[c];
      }
    }
  }

  T* out = static_cast<T*>(p.out);
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int row = row0 + wrow + i;
    if (row >= total_rows) continue;
    const int head = kvh * group + row % group;
    const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
    T* orow = out + (size_t(q0 + row / group) * p.num_heads + head) * HD;
#pragma unroll
    for (int c = 0; c < kC; ++c) orow[lane + 32 * c] = FromF<T>(o[i][c] * inv);
  }
}

template <typename T, int HD>
cudaError_t Launch(const PrefillAttentionParams& p, cudaStream_t stream) {
  constexpr size_t smem = SmemBytes<HD>();
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(PrefillAttentionKernel<T, HD>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) return e;
  }
  const int group = p.num_heads / p.num_kv_heads;
  const int64_t rows = int64_t(p.max_q_len) * group;
  const dim3 grid(unsigned((rows + kRows - 1) / kRows), unsigned(p.num_kv_heads),
                  unsigned(p.num_seqs));
  PrefillAttentionKernel<T, HD><<<grid, kWarps * 32, smem, stream>>>(p);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchDtype(const PrefillAttentionParams& p, cudaStream_t stream) {
  switch (p.head_dim) {
    case 32: return Launch<T, 32>(p, stream);
    case 64: return Launch<T, 64>(p, stream);
    case 128: return Launch<T, 128>(p, stream);
    case 256: return Launch<T, 256>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

bool PrefillAttentionSupported(const PrefillAttentionParams& p) {
  if (p.head_dim != 32 && p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256) {
    return false;
  }
  if (p.dtype != DType::kF16 && p.dtype != DType::kBF16) return false;
  if (p.num_seqs < 0 || p.num_seqs > 65535 || p.num_heads <= 0 || p.num_kv_heads <= 0 ||
      p.num_kv_heads > 65535 || p.num_heads % p.num_kv_heads != 0) {
    return false;
  }
  if (p.block_size <= 0 || p.max_blocks_per_seq < 0 || p.max_q_len < 0) return false;
  if (int64_t(p.max_q_len) * (p.num_heads / p.num_kv_heads) / kRows >= (int64_t(1) << 31)) {
    return false;
  }
  if (reinterpret_cast<uintptr_t>(p.kv_layer) % 16 != 0) return false;
  return true;
}

cudaError_t PrefillAttention(const PrefillAttentionParams& p, cudaStream_t stream) {
  if (!PrefillAttentionSupported(p)) return cudaErrorInvalidValue;
  if (p.num_seqs == 0 || p.max_q_len == 0) return cudaSuccess;
  if (!p.out || !p.q || !p.kv_layer || !p.block_tables || !p.q_start || !p.start_pos) {
    return cudaErrorInvalidValue;
  }
  return p.dtype == DType::kF16 ? LaunchDtype<__half>(p, stream)
                                : LaunchDtype<__nv_bfloat16>(p, stream);
}

}  // namespace kvstream::kernels
