// Causal prefill attention on tensor cores: see prefill_attention.h for the contract.
//
// One CTA = one sequence, one KV head, kRows = 128 consecutive rows r = token * group + g (query
// head kv_head * group + g), 8 warps of 16 rows. Per key tile (kKeys keys, gathered from the
// paged pool by cp.async into a swizzled, double-buffered shared-memory tile):
//   S[16 rows x kKeys] = Q K^T      mma m16n8k16: A = Q (ldmatrix), B = K rows (ldmatrix)
//   online softmax in fp32, base 2 (scale folded with log2(e)), causal mask near the diagonal
//   O[16 rows x HD]   += P V        A = P straight from S's accumulators (the m16n8 C layout of
//                                   two adjacent key n-tiles is the m16k16 A layout), B = V rows
//                                   (ldmatrix.trans)
// CTAs are launched heaviest (latest rows, most keys) first, so the causal triangle's long rows
// do not trail the grid.
#include "kernels/prefill_attention.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace kvstream::kernels {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = kWarps * 16;  // (token, head-of-group) rows per CTA
constexpr float kLog2e = 1.4426950408889634f;

template <int HD>
struct Shape {
  // Head 128 (llama-3-8b's shape): 64 keys per tile with Q's fragments held in registers and one
  // CTA per SM; 32-key tiles, or two CTAs per SM (which spill at 128 registers), were slower
  // (docs/kernels.md, prefill attention, has the tile variants side by side). The other head
  // sizes take what fits their register budget without spilling: head 256 keeps Q in shared
  // memory (its O accumulators alone take 128 registers), head 64 runs 32-key tiles at two CTAs
  // per SM.
  static constexpr int kKeys = HD == 32 || HD == 128 ? 64 : 32;  // keys per tile
  static constexpr bool kQInRegs = HD == 128;
  static constexpr int kChunks = HD / 8;             // 16-byte chunks per row
  static constexpr size_t kSmem = sizeof(uint16_t) * size_t(HD) * (kRows + 4 * kKeys);
  static constexpr int kMinCtas = HD <= 64 ? 2 : 1;  // 8 or 16 warps per SM
};

// Physical 16-byte chunk of logical chunk `ch` in row `r`: an XOR swizzle so that the 8 rows an
// ldmatrix phase reads at one logical chunk hit 8 distinct bank groups.
template <int HD>
__device__ __forceinline__ int Swz(int r, int ch) {
  if constexpr (HD / 8 >= 8) {
    return ch ^ (r & 7);
  } else {
    return ch ^ ((r >> 1) & 3);  // 64-byte rows: two rows per 128-byte bank window
  }
}

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; src_bytes 0 writes zeros (and reads nothing).
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(dst)), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void Ldsm4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
}
__device__ __forceinline__ void Ldsm4T(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
}

template <typename T>
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

template <typename T>
__device__ __forceinline__ uint32_t Pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

template <typename T, int HD>
__global__ void __launch_bounds__(kThreads, Shape<HD>::kMinCtas)
PrefillAttentionKernel(PrefillAttentionParams p) {
  static_assert(HD % 32 == 0, "head_dim");
  constexpr int kKeys = Shape<HD>::kKeys;
  constexpr int kCh = Shape<HD>::kChunks;
  constexpr int kNT = kKeys / 8;  // key n-tiles of S
  constexpr int kDT = HD / 8;     // dim n-tiles of O
  extern __shared__ uint4 smem4[];
  T* q_s = reinterpret_cast<T*>(smem4);  // [kRows][HD]
  T* k_s = q_s + kRows * HD;             // [2][kKeys][HD]
  T* v_s = k_s + 2 * kKeys * HD;         // [2][kKeys][HD]

  const int s = blockIdx.z;
  const int kvh = blockIdx.y;
  const int group = p.num_heads / p.num_kv_heads;
  const int q0 = p.q_start[s];
  const int total_rows = (p.q_start[s + 1] - q0) * group;
  const int row0 = (gridDim.x - 1 - blockIdx.x) * kRows;  // heaviest tiles first
  if (row0 >= total_rows) return;
  const int pos0 = p.start_pos[s];
  const int last_row = min(row0 + kRows, total_rows) - 1;
  const int kv_len = pos0 + last_row / group + 1;  // keys any row of this CTA may read
  const int n_tiles = (kv_len + kKeys - 1) / kKeys;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const T* q = static_cast<const T*>(p.q);
  const T* kv = static_cast<const T*>(p.kv_layer);
  const int32_t* table = p.block_tables + size_t(s) * p.max_blocks_per_seq;
  const size_t tile = size_t(p.block_size) * HD;
  const size_t v_off = size_t(p.num_kv_heads) * tile;

  // Q rows (zeros past the sequence's rows).
  for (int idx = tid; idx < kRows * kCh; idx += kThreads) {
    const int r = idx / kCh, ch = idx % kCh;
    const int row = row0 + r;
    const bool ok = row < total_rows;
    const T* src = ok ? q + (size_t(q0 + row / group) * p.num_heads + kvh * group + row % group) * HD + ch * 8
                      : q;
    CpAsync16(q_s + r * HD + Swz<HD>(r, ch) * 8, src, ok ? 16 : 0);
  }
  auto load_kv = [&](int t, int buf) {
    T* kd = k_s + buf * kKeys * HD;
    T* vd = v_s + buf * kKeys * HD;
#pragma unroll 1
    for (int idx = tid; idx < kKeys * kCh; idx += kThreads) {
      const int r = idx / kCh, ch = idx % kCh;
      const int key = t * kKeys + r;
      const bool ok = key < kv_len;
      const T* src = kv;
      if (ok) {
        const int block = table[key / p.block_size];
        src = kv + (size_t(block) * 2 * p.num_kv_heads + kvh) * tile +
              size_t(key % p.block_size) * HD + ch * 8;
      }
      const int off = r * HD + Swz<HD>(r, ch) * 8;
      CpAsync16(kd + off, src, ok ? 16 : 0);
      CpAsync16(vd + off, ok ? src + v_off : kv, ok ? 16 : 0);
    }
  };
  load_kv(0, 0);
  CpAsyncCommit();

  // This thread's two rows: 16 * warp + g and + 8 (g = lane / 4); -1 = not a row.
  const int g = lane >> 2, c = lane & 3;
  int pos_lo, pos_hi;
  {
    const int rlo = row0 + 16 * warp + g, rhi = rlo + 8;
    pos_lo = rlo < total_rows ? pos0 + rlo / group : -1;
    pos_hi = rhi < total_rows ? pos0 + rhi / group : -1;
  }
  const int wr0 = row0 + 16 * warp;
  const int warp_min_pos = wr0 < total_rows ? pos0 + wr0 / group : -1;
  const int warp_max_pos = wr0 < total_rows ? pos0 + (min(wr0 + 15, total_rows - 1)) / group : -1;
  const float scale = p.scale * kLog2e;

  float o[kDT][4];
#pragma unroll
  for (int n = 0; n < kDT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;

  const T* qw = q_s + 16 * warp * HD;
  constexpr bool kQRegs = Shape<HD>::kQInRegs;
  uint32_t qf[kQRegs ? HD / 16 : 1][4];  // A fragments of every k-step, loaded once (tile 0's wait covers Q)
  bool q_loaded = false;
  for (int t = 0; t < n_tiles; ++t) {
    if (t + 1 < n_tiles) {
      load_kv(t + 1, (t + 1) & 1);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    const int kt0 = t * kKeys;
    if (kt0 <= warp_max_pos) {  // warp-uniform: some row of this warp sees a key of the tile
      const T* kb = k_s + (t & 1) * kKeys * HD;
      const T* vb = v_s + (t & 1) * kKeys * HD;
      float sc[kNT][4];
#pragma unroll
      for (int j = 0; j < kNT; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
      if constexpr (kQRegs) {
        if (!q_loaded) {
          const int r = lane & 15;
#pragma unroll
          for (int ks = 0; ks < HD / 16; ++ks) {
            Ldsm4(qf[ks], qw + r * HD + Swz<HD>(16 * warp + r, 2 * ks + (lane >> 4)) * 8);
          }
          q_loaded = true;
        }
      }
#pragma unroll
      for (int kk = 0; kk < HD / 32; ++kk) {
        uint32_t qa[4], qb[4];  // A fragments of k-steps 2kk and 2kk+1
        if constexpr (kQRegs) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            qa[i] = qf[2 * kk][i];
            qb[i] = qf[2 * kk + 1][i];
          }
        } else {
          const int r = lane & 15;
          Ldsm4(qa, qw + r * HD + Swz<HD>(16 * warp + r, 4 * kk + (lane >> 4)) * 8);
          Ldsm4(qb, qw + r * HD + Swz<HD>(16 * warp + r, 4 * kk + 2 + (lane >> 4)) * 8);
        }
#pragma unroll
        for (int j = 0; j < kNT; ++j) {
          const int r = 8 * j + (lane & 7);
          uint32_t kb4[4];
          Ldsm4(kb4, kb + r * HD + Swz<HD>(r, 4 * kk + (lane >> 3)) * 8);
          Mma<T>(sc[j], qa, kb4[0], kb4[1]);
          Mma<T>(sc[j], qb, kb4[2], kb4[3]);
        }
      }
      // Scale, causal mask (only where the tile reaches past the warp's first row), row max.
      const bool mask = kt0 + kKeys - 1 > warp_min_pos;
      float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = kt0 + 8 * j + 2 * c + e;
          float xl = sc[j][e] * scale, xh = sc[j][2 + e] * scale;
          if (mask) {
            if (key > pos_lo) xl = -INFINITY;
            if (key > pos_hi) xh = -INFINITY;
          }
          sc[j][e] = xl;
          sc[j][2 + e] = xh;
          mx_lo = fmaxf(mx_lo, xl);
          mx_hi = fmaxf(mx_hi, xh);
        }
      }
#pragma unroll
      for (int off = 1; off < 4; off <<= 1) {
        mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, off));
        mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, off));
      }
      const float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
      // A row that has seen no key yet (or is not a row) keeps m = -inf: use 0 as the base so
      // that exp2 sees -inf - 0 = -inf (-> 0), never -inf - -inf.
      const float b_lo = mn_lo == -INFINITY ? 0.f : mn_lo;
      const float b_hi = mn_hi == -INFINITY ? 0.f : mn_hi;
      const float al_lo = exp2f(m_lo - b_lo), al_hi = exp2f(m_hi - b_hi);
      m_lo = mn_lo;
      m_hi = mn_hi;
      float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        sc[j][0] = exp2f(sc[j][0] - b_lo);
        sc[j][1] = exp2f(sc[j][1] - b_lo);
        sc[j][2] = exp2f(sc[j][2] - b_hi);
        sc[j][3] = exp2f(sc[j][3] - b_hi);
        sum_lo += sc[j][0] + sc[j][1];
        sum_hi += sc[j][2] + sc[j][3];
      }
      l_lo = l_lo * al_lo + sum_lo;
      l_hi = l_hi * al_hi + sum_hi;
#pragma unroll
      for (int n = 0; n < kDT; ++n) {
        o[n][0] *= al_lo;
        o[n][1] *= al_lo;
        o[n][2] *= al_hi;
        o[n][3] *= al_hi;
      }
      // O += P V, 16 keys per k-step.
#pragma unroll
      for (int ks = 0; ks < kKeys / 16; ++ks) {
        const uint32_t pa[4] = {Pack2<T>(sc[2 * ks][0], sc[2 * ks][1]),
                                Pack2<T>(sc[2 * ks][2], sc[2 * ks][3]),
                                Pack2<T>(sc[2 * ks + 1][0], sc[2 * ks + 1][1]),
                                Pack2<T>(sc[2 * ks + 1][2], sc[2 * ks + 1][3])};
        const int r = 16 * ks + (lane & 7) + 8 * ((lane >> 3) & 1);
#pragma unroll
        for (int dq = 0; dq < HD / 16; ++dq) {
          uint32_t vb4[4];
          Ldsm4T(vb4, vb + r * HD + Swz<HD>(r, 2 * dq + (lane >> 4)) * 8);
          Mma<T>(o[2 * dq], pa, vb4[0], vb4[1]);
          Mma<T>(o[2 * dq + 1], pa, vb4[2], vb4[3]);
        }
      }
    }
    __syncthreads();  // the buffer of tile t is reloaded by iteration t + 1
  }

#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, off);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, off);
  }
  T* out = static_cast<T*>(p.out);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + 16 * warp + g + 8 * half;
    if (row >= total_rows) continue;
    const float l = half ? l_hi : l_lo;
    const float inv = l > 0.f ? 1.f / l : 0.f;
    T* orow = out + (size_t(q0 + row / group) * p.num_heads + kvh * group + row % group) * HD;
#pragma unroll
    for (int n = 0; n < kDT; ++n) {
      *reinterpret_cast<uint32_t*>(orow + 8 * n + 2 * c) =
          Pack2<T>(o[n][2 * half] * inv, o[n][2 * half + 1] * inv);
    }
  }
}

template <typename T, int HD>
cudaError_t Launch(const PrefillAttentionParams& p, cudaStream_t stream) {
  constexpr size_t smem = Shape<HD>::kSmem;
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(PrefillAttentionKernel<T, HD>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) return e;
  }
  const int group = p.num_heads / p.num_kv_heads;
  const int64_t rows = int64_t(p.max_q_len) * group;
  const dim3 grid(unsigned((rows + kRows - 1) / kRows), unsigned(p.num_kv_heads),
                  unsigned(p.num_seqs));
  PrefillAttentionKernel<T, HD><<<grid, kThreads, smem, stream>>>(p);
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
  // 16-byte cp.async of q rows, K/V rows and 4-byte stores of out pairs.
  auto aligned = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; };
  if (!aligned(p.kv_layer) || !aligned(p.q) || !aligned(p.out)) return false;
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
