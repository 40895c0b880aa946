// Paged decode attention: see paged_attention.h for the contract and docs/kernels.md for the
// design and the measurements behind its choices.
//
// Work decomposition. One CTA (4 warps) per (sequence, KV head, group chunk of <= 8 query heads,
// split). A "unit" is 16 consecutive tokens of one KV head (one 16-token tile of a block: a block
// of 16 is one unit, a block of 32 two). Warp w of a CTA takes the units u_begin + w,
// u_begin + w + 4, ... of its split, so each K/V byte of the KV head is read once for the whole
// group of query heads (GQA) - never once per query head.
//
// Per unit a warp does two m16n8k16 tensor-core products with fp32 accumulation:
//   S^T[16 tokens x 8 heads] = K[16 x D] . Q^T[D x 8]        (K straight from its 16-byte loads)
//   O^T[D x 8 heads]        += V^T[D x 16] . P^T[16 x 8]     (V transposed in registers by prmt)
// The query heads sit in the mma's n dimension (8 wide), so MHA wastes 7/8 of a tensor-core op
// that costs nothing here (the kernel is bound by HBM), and no register holds padding.
// The reduction dimension of both products may be permuted freely as long as both operands use
// the same permutation; that is what lets every operand come from plain 16-byte global loads
// (no shared-memory staging of K or V) - see the index comments in the loop.
//
// Online softmax in fp32 (base 2, the scale folded with log2(e)); per-warp (m, l, O) states are
// merged in shared memory at the end of the CTA, and split partials (normalised O and its
// log2-sum-exp) are merged by a second kernel launched with programmatic dependent launch.
#include "kernels/paged_attention.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace kvstream::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kUnitTokens = 16;
constexpr int kHeadsPerCta = 8;
constexpr int kMaxSplits = 128;
constexpr int kMinUnitsPerSplit = 4;
constexpr int kPStride = 24;  // tokens per row of the per-warp P^T staging (bank-conflict free)
constexpr int kDefaultPrefetchDistance = 1;

struct KernelArgs {
  void* out;
  const void* q;
  const void* kv;
  const int32_t* block_tables;
  const int32_t* context_lens;
  float* ws_o;    // [num_seqs][num_heads][num_splits][head_dim], normalised partial outputs
  float* ws_lse;  // [num_seqs][num_heads][num_splits], log2(sum exp2) of each partial
  int num_heads;
  int num_kv_heads;
  int group;        // query heads per KV head
  int head_chunks;  // ceil(group / 8)
  int block_size;
  int max_blocks_per_seq;
  int num_splits;
  int units_per_split;
  int prefetch_distance;  // in warp strides
  float scale_log2;       // scale * log2(e)
};

template <bool kBf16>
using Elem = std::conditional_t<kBf16, __nv_bfloat16, __half>;

template <bool kBf16>
__device__ __forceinline__ void Mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  if constexpr (kBf16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ uint32_t Word(const uint4& v, int i) {
  return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

// HBM -> L2 bulk prefetch (sm_90). The address must be 16-byte aligned and the size a multiple
// of 16: every tile is block-aligned and 16 * head_dim * 2 bytes long (2, 4 or 8 KiB).
__device__ __forceinline__ void PrefetchL2(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(__cvta_generic_to_global(p)),
               "r"(bytes)
               : "memory");
#endif
}

// Lets the dependent (combine) grid be scheduled once every CTA of this grid has started; its
// griddepcontrol.wait still waits for this grid's completion and memory.
__device__ __forceinline__ void AllowDependentLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void WaitPrimaryGrid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

template <bool kBf16>
__device__ __forceinline__ float ToF(Elem<kBf16> x) {
  if constexpr (kBf16) {
    return __bfloat162float(x);
  } else {
    return __half2float(x);
  }
}
template <bool kBf16>
__device__ __forceinline__ Elem<kBf16> FromF(float x) {
  if constexpr (kBf16) {
    return __float2bfloat16_rn(x);
  } else {
    return __float2half_rn(x);
  }
}

// ---- Hopper async-copy primitives (sm_90): mbarrier + bulk copy global -> shared -------------

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void MbarInit(uint64_t* bar, uint32_t count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(SmemAddr(bar)), "r"(count) : "memory");
#endif
}

// Makes initialised mbarriers visible to the async proxy (the bulk copies complete on them).
__device__ __forceinline__ void FenceMbarInit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void MbarArriveExpectTx(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(SmemAddr(bar)), "r"(bytes)
               : "memory");
#endif
}

__device__ __forceinline__ void MbarWait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t addr = SmemAddr(bar);
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  }
#endif
}

// 1-D bulk copy (TMA) of `bytes` (multiple of 16, 16-byte-aligned ends) into this CTA's shared
// memory; completes `bytes` of the mbarrier's transaction count.
__device__ __forceinline__ void BulkCopyG2S(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          SmemAddr(dst)),
      "l"(__cvta_generic_to_global(src)), "r"(bytes), "r"(SmemAddr(bar))
      : "memory");
#endif
}

// ---- the per-unit math, shared by both kernels ------------------------------------------------

template <bool kBf16, int D>
struct WarpState {
  float o[D / 16][4];  // O^T m-tiles (see ConsumeUnit)
  float m0, m1, l0, l1;  // heads 2c and 2c+1 of this lane
  __device__ __forceinline__ void Init() {
#pragma unroll
    for (int j = 0; j < D / 16; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    m0 = m1 = -INFINITY;
    l0 = l1 = 0.f;
  }
};

// B operand of S^T = K Q^T for k-steps 2s and 2s+1: Q[head g][32s + 8c .. 32s + 8c + 8), from
// global memory; heads past the group chunk are zero.
template <bool kBf16, int D>
__device__ __forceinline__ void LoadQ(uint4 (&qr)[D / 32], const KernelArgs& a, int seq, int h0, int nh,
                                      int g, int c) {
  using T = Elem<kBf16>;
  const uint4* qg = reinterpret_cast<const uint4*>(
      static_cast<const T*>(a.q) + (size_t(seq) * a.num_heads + h0 + min(g, nh - 1)) * D);
#pragma unroll
  for (int s = 0; s < D / 32; ++s) qr[s] = g < nh ? __ldg(qg + 4 * s + c) : make_uint4(0, 0, 0, 0);
}

// One 16-token unit of one warp. `kp`/`vp` point at the unit's K and V tiles (16 rows of
// `kStride` elements, global or shared memory: same addressing); `freed` is called once every
// K/V fragment sits in registers (the ring kernel refills the stage there). `p_w` is the warp's
// 8 x kPStride staging tile for P.
template <bool kBf16, int D, int kStride, bool kGlobal, typename Freed>
__device__ __forceinline__ void ConsumeUnit(WarpState<kBf16, D>& st, const uint4 (&qr)[D / 32],
                                            const Elem<kBf16>* kp, const Elem<kBf16>* vp, int tok0,
                                            int len, float scale_log2, Elem<kBf16>* p_w, int g, int c,
                                            Freed freed) {
  using T = Elem<kBf16>;
  constexpr int kKLoads = D / 32;     // 16-byte K loads per row pair (a 32-dim chunk each)
  constexpr int kVChunks = D / 64;    // 64-dim chunks of V
  constexpr int kMTiles = D / 16;     // O^T m-tiles
  constexpr bool kVEarly = D <= 128;  // load V with K (registers permitting)
  auto ld = [](const T* p) {
    if constexpr (kGlobal) {
      return __ldg(reinterpret_cast<const uint4*>(p));
    } else {
      return *reinterpret_cast<const uint4*>(p);
    }
  };
  // K as the A operand (rows = tokens g and g+8). Register kr[s][r] holds
  // K[token g + 8r][32s + 8c .. +8): words 0,1 feed k-step 2s (k = 2c.., 2c+8..),
  // words 2,3 k-step 2s+1. The dims are thereby permuted within each k-step; qr uses the
  // same permutation, so the dot products are unchanged.
  uint4 kr[kKLoads][2];
#pragma unroll
  for (int s = 0; s < kKLoads; ++s) {
    kr[s][0] = ld(kp + g * kStride + 32 * s + 8 * c);
    kr[s][1] = ld(kp + (g + 8) * kStride + 32 * s + 8 * c);
  }
  // V as the A operand of O^T = V^T P^T (rows = dims, k = tokens). vr[qc][t] holds
  // V[token tok(t)][64qc + 8g .. +8) with tok = 2c, 2c+1, 2c+8, 2c+9.
  uint4 vr[kVChunks][4];
  auto load_v = [&]() {
#pragma unroll
    for (int qc = 0; qc < kVChunks; ++qc) {
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const int tok = 2 * c + (t & 1) + (t >> 1) * 8;
        vr[qc][t] = ld(vp + tok * kStride + 64 * qc + 8 * g);
      }
    }
  };
  if constexpr (kVEarly) {
    load_v();
    freed();
  }

  // Two accumulators halve the chain of dependent mmas (latency, not throughput, matters).
  float sc[4] = {0.f, 0.f, 0.f, 0.f}, sd[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int s = 0; s < kKLoads; ++s) {
    Mma16816<kBf16>(sc, Word(kr[s][0], 0), Word(kr[s][1], 0), Word(kr[s][0], 1), Word(kr[s][1], 1),
                    Word(qr[s], 0), Word(qr[s], 1));
    Mma16816<kBf16>(sd, Word(kr[s][0], 2), Word(kr[s][1], 2), Word(kr[s][0], 3), Word(kr[s][1], 3),
                    Word(qr[s], 2), Word(qr[s], 3));
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) sc[i] += sd[i];
  if constexpr (!kVEarly) {
    load_v();
    freed();
  }

  // sc: [0] = S[token g][head 2c], [1] = S[g][2c+1], [2] = S[g+8][2c], [3] = S[g+8][2c+1].
  const bool ok_lo = tok0 + g < len, ok_hi = tok0 + g + 8 < len;
  const float x0 = ok_lo ? sc[0] * scale_log2 : -INFINITY;
  const float x1 = ok_lo ? sc[1] * scale_log2 : -INFINITY;
  const float x2 = ok_hi ? sc[2] * scale_log2 : -INFINITY;
  const float x3 = ok_hi ? sc[3] * scale_log2 : -INFINITY;
  float mx0 = fmaxf(x0, x2), mx1 = fmaxf(x1, x3);
#pragma unroll
  for (int off = 4; off < 32; off <<= 1) {
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
  }
  // Token 0 of every processed unit is valid, so mx* is finite.
  const float mn0 = fmaxf(st.m0, mx0), mn1 = fmaxf(st.m1, mx1);
  const float al0 = exp2f(st.m0 - mn0), al1 = exp2f(st.m1 - mn1);
  st.m0 = mn0;
  st.m1 = mn1;
  // P rounded to the KV type (the mma's input); l sums the rounded values for consistency.
  const T p0 = FromF<kBf16>(exp2f(x0 - mn0)), p1 = FromF<kBf16>(exp2f(x1 - mn1));
  const T p2 = FromF<kBf16>(exp2f(x2 - mn0)), p3 = FromF<kBf16>(exp2f(x3 - mn1));
  st.l0 = st.l0 * al0 + ToF<kBf16>(p0) + ToF<kBf16>(p2);
  st.l1 = st.l1 * al1 + ToF<kBf16>(p1) + ToF<kBf16>(p3);
#pragma unroll
  for (int j = 0; j < kMTiles; ++j) {
    st.o[j][0] *= al0;
    st.o[j][1] *= al1;
    st.o[j][2] *= al0;
    st.o[j][3] *= al1;
  }
  // P^T as the B operand needs P[head g][tokens 2c, 2c+1 | 2c+8, 2c+9]: transpose through a
  // per-warp 8 x 16 staging tile.
  p_w[(2 * c) * kPStride + g] = p0;
  p_w[(2 * c + 1) * kPStride + g] = p1;
  p_w[(2 * c) * kPStride + g + 8] = p2;
  p_w[(2 * c + 1) * kPStride + g + 8] = p3;
  __syncwarp();
  const uint32_t pb0 = *reinterpret_cast<const uint32_t*>(&p_w[g * kPStride + 2 * c]);
  const uint32_t pb1 = *reinterpret_cast<const uint32_t*>(&p_w[g * kPStride + 2 * c + 8]);
  __syncwarp();

  if (tok0 + kUnitTokens > len) {
    // Tail unit: slots past the context hold whatever the pool holds (maybe NaN); P is 0 there
    // but 0 * NaN is not, so zero those V rows.
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const int tok = 2 * c + (t & 1) + (t >> 1) * 8;
      if (tok0 + tok >= len) {
#pragma unroll
        for (int qc = 0; qc < kVChunks; ++qc) vr[qc][t] = make_uint4(0, 0, 0, 0);
      }
    }
  }
  // m-tile j = 4qc + w: row g <-> dim 64qc + 8g + 2w, row g+8 <-> the dim after it, so
  // a0/a1 are the low/high halves of word w of tokens 2c and 2c+1 (a2/a3: 2c+8, 2c+9).
#pragma unroll
  for (int qc = 0; qc < kVChunks; ++qc) {
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint32_t t0 = Word(vr[qc][0], w), t1 = Word(vr[qc][1], w);
      const uint32_t t8 = Word(vr[qc][2], w), t9 = Word(vr[qc][3], w);
      Mma16816<kBf16>(st.o[4 * qc + w], __byte_perm(t0, t1, 0x5410), __byte_perm(t0, t1, 0x7632),
                      __byte_perm(t8, t9, 0x5410), __byte_perm(t8, t9, 0x7632), pb0, pb1);
    }
  }
}

// End of a CTA: merges its warps' (m, l, O) states through shared memory (o_s: [kWarps][8][D]
// floats, ml_s: [kWarps][8]) and writes the output (one split) or this split's partial.
// Starts with a __syncthreads (o_s may alias memory the warps were still reading).
template <bool kBf16, int D>
__device__ __forceinline__ void MergeWarpsAndStore(WarpState<kBf16, D>& st, float* o_s, float2* ml_s,
                                                   const KernelArgs& a, int seq, int split, int h0,
                                                   int nh) {
  using T = Elem<kBf16>;
  constexpr int kVChunks = D / 64;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, c = lane & 3;
  // l: per-thread partial sums over its tokens -> sum over the 8 groups.
#pragma unroll
  for (int off = 4; off < 32; off <<= 1) {
    st.l0 += __shfl_xor_sync(0xffffffffu, st.l0, off);
    st.l1 += __shfl_xor_sync(0xffffffffu, st.l1, off);
  }
  __syncthreads();
  // o[j]: [0] = O[head 2c][dim], [2] = O[head 2c][dim+1], [1]/[3] the same for head 2c+1,
  // dim = 64qc + 8g + 2w.
  float* ow = o_s + size_t(warp) * kHeadsPerCta * D;
#pragma unroll
  for (int qc = 0; qc < kVChunks; ++qc) {
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const int d = 64 * qc + 8 * g + 2 * w;
      *reinterpret_cast<float2*>(&ow[(2 * c) * D + d]) = make_float2(st.o[4 * qc + w][0], st.o[4 * qc + w][2]);
      *reinterpret_cast<float2*>(&ow[(2 * c + 1) * D + d]) = make_float2(st.o[4 * qc + w][1], st.o[4 * qc + w][3]);
    }
  }
  if (g == 0) {
    ml_s[warp * kHeadsPerCta + 2 * c] = make_float2(st.m0, st.l0);
    ml_s[warp * kHeadsPerCta + 2 * c + 1] = make_float2(st.m1, st.l1);
  }
  __syncthreads();

  for (int i = threadIdx.x; i < nh * D; i += kThreads) {
    const int hh = i / D, d = i % D;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, ml_s[w * kHeadsPerCta + hh].x);
    float acc = 0.f, sum = 0.f;
    if (mx != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float2 ml = ml_s[w * kHeadsPerCta + hh];
        const float f = ml.x == -INFINITY ? 0.f : exp2f(ml.x - mx);
        acc += f * o_s[(size_t(w) * kHeadsPerCta + hh) * D + d];
        sum += f * ml.y;
      }
    }
    const float val = sum > 0.f ? acc / sum : 0.f;
    const int h = h0 + hh;
    if (a.num_splits == 1) {
      static_cast<T*>(a.out)[(size_t(seq) * a.num_heads + h) * D + d] = FromF<kBf16>(val);
    } else {
      const size_t row = (size_t(seq) * a.num_heads + h) * a.num_splits + split;
      a.ws_o[row * D + d] = val;
      if (d == 0) a.ws_lse[row] = sum > 0.f ? mx + log2f(sum) : -INFINITY;
    }
  }
}

// ---- kernel 1: register landing (every K/V byte LDG.128 straight into registers) ------------

// 128 registers at head 128 (4 CTAs = 16 warps per SM), both variants alike.
constexpr int MinCtasPerSm(int d) { return d <= 64 ? 5 : (d <= 128 ? 4 : 1); }

template <bool kBf16, int D, bool kPrefetch>
__global__ void __launch_bounds__(kThreads, MinCtasPerSm(D)) PagedDecodeKernel(const KernelArgs a) {
  using T = Elem<kBf16>;
  constexpr uint32_t kTileBytes = kUnitTokens * D * sizeof(T);

  __shared__ __align__(16) T p_s[kWarps][kHeadsPerCta][kPStride];
  __shared__ __align__(16) float o_s[kWarps][kHeadsPerCta][D];
  __shared__ float2 ml_s[kWarps][kHeadsPerCta];

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane >> 2;  // mma group id
  const int c = lane & 3;   // thread in group
  if (a.num_splits > 1) AllowDependentLaunch();
  const int split = blockIdx.x;
  const int kvh = blockIdx.y / a.head_chunks;
  const int chunk = blockIdx.y % a.head_chunks;
  const int seq = blockIdx.z;
  const int h0 = kvh * a.group + chunk * kHeadsPerCta;
  const int nh = min(kHeadsPerCta, a.group - chunk * kHeadsPerCta);

  int len = a.context_lens[seq];
  len = max(0, min(len, a.max_blocks_per_seq * a.block_size));
  const int n_units = (len + kUnitTokens - 1) / kUnitTokens;
  const int u_begin = split * a.units_per_split;
  const int u_end =
      split == a.num_splits - 1 ? n_units : min(n_units, u_begin + a.units_per_split);

  uint4 qr[D / 32];
  LoadQ<kBf16, D>(qr, a, seq, h0, nh, g, c);

  const T* kv = static_cast<const T*>(a.kv);
  const int32_t* bt = a.block_tables + size_t(seq) * a.max_blocks_per_seq;
  const int tiles_per_block = a.block_size / kUnitTokens;
  const size_t head_stride = size_t(a.block_size) * D;               // one K (or V) tile row set
  const size_t v_offset = size_t(a.num_kv_heads) * head_stride;      // K -> V of the same block
  const size_t block_stride = 2 * v_offset;
  auto unit_ptr = [&](int blk, int u) {
    return kv + size_t(blk) * block_stride + size_t(kvh) * head_stride +
           size_t(u % tiles_per_block) * kUnitTokens * D;
  };
  auto unit_k_ptr = [&](int u) { return unit_ptr(__ldg(bt + u / tiles_per_block), u); };

  WarpState<kBf16, D> st;
  st.Init();

  const int stride = kWarps;
  int u = u_begin + warp;
  if constexpr (kPrefetch) {
    // Prologue for lookahead distances > 1: the units this warp reaches before its first
    // in-loop prefetch lands.
    if (lane == 0) {
      for (int k = 1; k < a.prefetch_distance; ++k) {
        const int un = u + k * stride;
        if (un < u_end) {
          const T* kp = unit_k_ptr(un);
          PrefetchL2(kp, kTileBytes);
          PrefetchL2(kp + v_offset, kTileBytes);
        }
      }
    }
  }
  // The block id of the warp's next unit is read one iteration early, so that the table lookup
  // is not a dependent load in front of every unit's KV loads.
  int blk = u < u_end ? __ldg(bt + u / tiles_per_block) : 0;
  for (; u < u_end; u += stride) {
    const int blk_next = u + stride < u_end ? __ldg(bt + (u + stride) / tiles_per_block) : 0;
    const T* kp = unit_ptr(blk, u);
    if constexpr (kPrefetch) {
      // The paper's two lines: the unit this warp processes `distance` iterations from now,
      // K tile and V tile, one lane, guarded at the end of the split.
      const int un = u + a.prefetch_distance * stride;
      if (lane == 0 && un < u_end) {
        const T* nkp = unit_k_ptr(un);
        PrefetchL2(nkp, kTileBytes);
        PrefetchL2(nkp + v_offset, kTileBytes);
      }
    }
    ConsumeUnit<kBf16, D, D, true>(st, qr, kp, kp + v_offset, u * kUnitTokens, len, a.scale_log2,
                                   &p_s[warp][0][0], g, c, [] {});
    blk = blk_next;
  }
  MergeWarpsAndStore<kBf16, D>(st, &o_s[0][0][0], &ml_s[0][0], a, seq, split, h0, nh);
}

// ---- kernel 2: per-warp ring of shared-memory stages filled by bulk copies (TMA) -------------
//
// Each warp owns kRingStages stages; a stage holds one unit's K tile and V tile (each 16 rows,
// contiguous in the pool, so one bulk copy each) and has an mbarrier that the copies complete.
// The warp keeps kRingStages - 1 units in flight while it computes one: at the start it issues
// its first kRingStages units at once (its whole split at batch-1 GQA shapes), and a stage is
// refilled with the unit kRingStages strides ahead as soon as its fragments sit in registers.
// The math reads the same 16-byte fragments as kernel 1, from shared memory.
constexpr int kRingStages = 3;
constexpr int RingMinCtasPerSm(int d) { return d <= 64 ? 3 : (d <= 128 ? 2 : 1); }
constexpr size_t RingStageBytes(int d) { return size_t(2) * kUnitTokens * d * 2; }
constexpr size_t RingBytes(int d) { return size_t(kWarps) * kRingStages * RingStageBytes(d); }
constexpr size_t RingSmemBytes(int d) {
  return RingBytes(d) + size_t(kWarps) * kRingStages * 8 +   // mbarriers
         size_t(kWarps) * kHeadsPerCta * kPStride * 2 +      // P staging
         size_t(kWarps) * kHeadsPerCta * sizeof(float2);     // (m, l) merge
}
static_assert(RingBytes(64) >= size_t(kWarps) * kHeadsPerCta * 64 * sizeof(float),
              "the warp-merge buffer aliases the ring");

template <bool kBf16, int D, bool kPrefetch>
__global__ void __launch_bounds__(kThreads, RingMinCtasPerSm(D)) PagedDecodeRingKernel(const KernelArgs a) {
  using T = Elem<kBf16>;
  constexpr int S = kRingStages;
  constexpr uint32_t kTileBytes = kUnitTokens * D * sizeof(T);
  constexpr int kStageElems = 2 * kUnitTokens * D;
  extern __shared__ __align__(128) unsigned char smem[];
  T* ring = reinterpret_cast<T*>(smem);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + RingBytes(D));
  T* p_s = reinterpret_cast<T*>(smem + RingBytes(D) + size_t(kWarps) * S * 8);
  float2* ml_s = reinterpret_cast<float2*>(smem + RingBytes(D) + size_t(kWarps) * S * 8 +
                                           size_t(kWarps) * kHeadsPerCta * kPStride * 2);
  float* o_s = reinterpret_cast<float*>(smem);  // after the loop only (aliases the ring)

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane >> 2;
  const int c = lane & 3;
  if (a.num_splits > 1) AllowDependentLaunch();
  const int split = blockIdx.x;
  const int kvh = blockIdx.y / a.head_chunks;
  const int chunk = blockIdx.y % a.head_chunks;
  const int seq = blockIdx.z;
  const int h0 = kvh * a.group + chunk * kHeadsPerCta;
  const int nh = min(kHeadsPerCta, a.group - chunk * kHeadsPerCta);

  const T* kv = static_cast<const T*>(a.kv);
  const int32_t* bt = a.block_tables + size_t(seq) * a.max_blocks_per_seq;
  const int tiles_per_block = a.block_size / kUnitTokens;
  const int table_units = a.max_blocks_per_seq * tiles_per_block;
  const size_t head_stride = size_t(a.block_size) * D;
  const size_t v_offset = size_t(a.num_kv_heads) * head_stride;
  const size_t block_stride = 2 * v_offset;
  const int stride = kWarps;
  const int u0 = split * a.units_per_split + warp;

  // The length, the block ids of the first S units (in bounds of the table row whatever the
  // length) and q are independent loads: issued together, one memory latency for all.
  const int len_raw = __ldg(a.context_lens + seq);
  int blk0[S];
#pragma unroll
  for (int k = 0; k < S; ++k) {
    const int uk = u0 + k * stride;
    blk0[k] = uk < table_units ? __ldg(bt + uk / tiles_per_block) : 0;
  }
  uint4 qr[D / 32];
  LoadQ<kBf16, D>(qr, a, seq, h0, nh, g, c);

  T* wring = ring + size_t(warp) * S * kStageElems;
  uint64_t* wbars = bars + warp * S;
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < S; ++k) MbarInit(&wbars[k], 1);
    FenceMbarInit();
  }
  __syncwarp();

  const int len = max(0, min(len_raw, table_units * kUnitTokens));
  const int n_units = (len + kUnitTokens - 1) / kUnitTokens;
  const int u_begin = split * a.units_per_split;
  const int u_end =
      split == a.num_splits - 1 ? n_units : min(n_units, u_begin + a.units_per_split);

  auto unit_src = [&](int blk, int u) {
    return kv + size_t(blk) * block_stride + size_t(kvh) * head_stride +
           size_t(u % tiles_per_block) * kUnitTokens * D;
  };
  // Lane 0 fills stage k with unit u (K tile, then V tile: two bulk copies on one mbarrier).
  auto issue = [&](int k, int blk, int u) {
    const T* src = unit_src(blk, u);
    T* dst = wring + k * kStageElems;
    MbarArriveExpectTx(&wbars[k], 2 * kTileBytes);
    BulkCopyG2S(dst, src, kTileBytes, &wbars[k]);
    BulkCopyG2S(dst + kUnitTokens * D, src + v_offset, kTileBytes, &wbars[k]);
  };
  auto prefetch = [&](int u) {
    const T* src = unit_src(__ldg(bt + u / tiles_per_block), u);
    PrefetchL2(src, kTileBytes);
    PrefetchL2(src + v_offset, kTileBytes);
  };
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < S; ++k) {
      const int uk = u0 + k * stride;
      if (uk < u_end) issue(k, blk0[k], uk);
    }
    if constexpr (kPrefetch) {
      // The L2 prefetch runs `distance` strides ahead of the newest unit in the ring; this
      // prologue covers the units the loop's first prefetches would skip.
      for (int k = 1; k < a.prefetch_distance; ++k) {
        const int un = u0 + (S + k) * stride;
        if (un < u_end) prefetch(un);
      }
    }
  }

  WarpState<kBf16, D> st;
  st.Init();
  int k = 0;
  uint32_t phase = 0;
  for (int u = u0; u < u_end; u += stride) {
    // Block id of the unit that refills this stage, read before the wait (off the critical path).
    const int ur = u + S * stride;
    const int blk_r = lane == 0 && ur < u_end ? __ldg(bt + ur / tiles_per_block) : 0;
    MbarWait(&wbars[k], phase);
    const T* kp = wring + k * kStageElems;
    ConsumeUnit<kBf16, D, D, false>(st, qr, kp, kp + kUnitTokens * D, u * kUnitTokens, len,
                                    a.scale_log2, p_s + warp * kHeadsPerCta * kPStride, g, c, [&] {
                                      // Every lane's fragments of this stage are in registers.
                                      __syncwarp();
                                      if (lane == 0 && ur < u_end) issue(k, blk_r, ur);
                                    });
    if constexpr (kPrefetch) {
      const int un = u + (S + a.prefetch_distance) * stride;
      if (lane == 0 && un < u_end) prefetch(un);
    }
    if (++k == S) {
      k = 0;
      phase ^= 1u;
    }
  }
  MergeWarpsAndStore<kBf16, D>(st, o_s, ml_s, a, seq, split, h0, nh);
}

// One CTA per (sequence, query head): out = sum_s 2^(lse_s - M) O_s / sum_s 2^(lse_s - M).
// Latency-bound (the partials are small): the split weights are computed once in parallel, and
// the weighted sum runs over float4 columns with the splits spread over thread groups, so that
// many independent loads are in flight instead of a serial chain per split.
constexpr int kCombineThreads = 256;
template <bool kBf16>
__global__ void __launch_bounds__(kCombineThreads) CombineSplitsKernel(void* out, const float* ws_o,
                                                                       const float* ws_lse,
                                                                       int num_splits, int head_dim) {
  using T = Elem<kBf16>;
  __shared__ float w_s[kMaxSplits];
  __shared__ float red_s[kCombineThreads / 32];
  __shared__ float4 acc_s[kCombineThreads];
  WaitPrimaryGrid();
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const size_t row0 = size_t(blockIdx.x) * num_splits;
  const float lse = tid < num_splits ? ws_lse[row0 + tid] : -INFINITY;
  float mx = lse;
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  if (lane == 0) red_s[warp] = mx;
  __syncthreads();
  mx = red_s[0];
  for (int w = 1; w < kCombineThreads / 32; ++w) mx = fmaxf(mx, red_s[w]);
  const float wt = (lse == -INFINITY || mx == -INFINITY) ? 0.f : exp2f(lse - mx);
  if (tid < num_splits) w_s[tid] = wt;
  float sum = wt;
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  __syncthreads();  // everyone has read red_s (max) before it is reused for the sums
  if (lane == 0) red_s[warp] = sum;
  __syncthreads();
  sum = 0.f;
  for (int w = 0; w < kCombineThreads / 32; ++w) sum += red_s[w];

  const int cols = head_dim / 4;
  const int groups = kCombineThreads / cols;
  const int col = tid % cols, grp = tid / cols;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  if (grp < groups) {
    const float4* o4 = reinterpret_cast<const float4*>(ws_o) + row0 * cols + col;
#pragma unroll 4
    for (int s = grp; s < num_splits; s += groups) {
      const float f = w_s[s];
      const float4 v = o4[size_t(s) * cols];
      acc.x += f * v.x;
      acc.y += f * v.y;
      acc.z += f * v.z;
      acc.w += f * v.w;
    }
  }
  acc_s[tid] = acc;
  __syncthreads();
  if (tid < cols) {
    float4 t = acc_s[tid];
    for (int gidx = 1; gidx < groups; ++gidx) {
      const float4 v = acc_s[gidx * cols + tid];
      t.x += v.x;
      t.y += v.y;
      t.z += v.z;
      t.w += v.w;
    }
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    T* o = static_cast<T*>(out) + size_t(blockIdx.x) * head_dim + 4 * tid;
    o[0] = FromF<kBf16>(t.x * inv);
    o[1] = FromF<kBf16>(t.y * inv);
    o[2] = FromF<kBf16>(t.z * inv);
    o[3] = FromF<kBf16>(t.w * inv);
  }
}

struct Plan {
  bool ring = false;  // which kernel: the TMA ring (true) or register landing
  int head_chunks = 1;
  int num_splits = 1;
  int units_per_split = 1;
};

// The ring kernel needs more than the default 48 KiB of dynamic shared memory: raise the limit
// once per kernel instantiation and device.
template <bool kBf16, int D, bool kPrefetch>
cudaError_t PrepareRing() {
  static std::atomic<uint64_t> done{0};
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (done.load(std::memory_order_acquire) & bit) return cudaSuccess;
  e = cudaFuncSetAttribute(PagedDecodeRingKernel<kBf16, D, kPrefetch>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, int(RingSmemBytes(D)));
  if (e == cudaSuccess) done.fetch_or(bit, std::memory_order_acq_rel);
  return e;
}

template <bool kBf16, int D, bool kRing>
int CtasPerSm() {
  static const int n = [] {
    int v = 0;
    cudaError_t e = cudaSuccess;
    if constexpr (kRing) {
      e = PrepareRing<kBf16, D, false>();
      if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, PagedDecodeRingKernel<kBf16, D, false>,
                                                          kThreads, RingSmemBytes(D));
    } else {
      e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, PagedDecodeKernel<kBf16, D, false>,
                                                        kThreads, 0);
    }
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      v = 0;
    }
    return std::max(v, 1);
  }();
  return n;
}

template <bool kRing>
int CtasPerSmFor(DType dt, int d) {
  // Planned from the prefetch-off variant for both variants, so that both split a context the
  // same way and produce bit-identical outputs.
  const bool bf = dt == DType::kBF16;
  switch (d) {
    case 64: return bf ? CtasPerSm<true, 64, kRing>() : CtasPerSm<false, 64, kRing>();
    case 128: return bf ? CtasPerSm<true, 128, kRing>() : CtasPerSm<false, 128, kRing>();
    default: return bf ? CtasPerSm<true, 256, kRing>() : CtasPerSm<false, 256, kRing>();
  }
}

int UnitsFor(int tokens) { return std::max(1, (tokens + kUnitTokens - 1) / kUnitTokens); }

Plan MakePlan(const PagedDecodeParams& p, int sm_count, int ctas_per_sm, bool ring) {
  Plan plan;
  plan.ring = ring;
  const int group = p.num_heads / p.num_kv_heads;
  plan.head_chunks = (group + kHeadsPerCta - 1) / kHeadsPerCta;
  const int units = UnitsFor(p.max_context_len);
  const long base = long(p.num_seqs) * p.num_kv_heads * plan.head_chunks;
  int splits = 1;
  if (p.num_splits > 0) {
    splits = std::min({p.num_splits, units, kMaxSplits});
  } else {
    // Fill whole waves of resident CTAs: the smallest split count whose last wave is >= 90%
    // full, with at least kMinUnitsPerSplit units (one per warp) per split.
    const long slots = long(std::max(sm_count, 1)) * ctas_per_sm;
    const int max_splits = std::clamp(units / kMinUnitsPerSplit, 1, kMaxSplits);
    double best_eff = -1.0;
    for (int s = 1; s <= max_splits; ++s) {
      const long ctas = base * s;
      const long waves = (ctas + slots - 1) / slots;
      const double eff = double(ctas) / double(waves * slots);
      if (eff >= 0.9) {
        splits = s;
        break;
      }
      if (eff > best_eff + 1e-9) {
        best_eff = eff;
        splits = s;
      }
    }
  }
  plan.units_per_split = (units + splits - 1) / splits;
  plan.num_splits = (units + plan.units_per_split - 1) / plan.units_per_split;
  return plan;
}

size_t AlignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

struct WorkspaceLayout {
  size_t o_bytes = 0;
  size_t total = 0;
};

WorkspaceLayout LayoutFor(const PagedDecodeParams& p, const Plan& plan) {
  WorkspaceLayout w;
  if (plan.num_splits <= 1) return w;
  const size_t rows = size_t(p.num_seqs) * p.num_heads * plan.num_splits;
  w.o_bytes = AlignUp(rows * p.head_dim * sizeof(float), 256);
  w.total = w.o_bytes + AlignUp(rows * sizeof(float), 256);
  return w;
}

bool UseRing(const PagedDecodeParams& p) {
  return p.kernel == DecodeKernel::kRing ||
         (p.kernel == DecodeKernel::kAuto && PagedDecodeAutoKernel(p) == DecodeKernel::kRing);
}

bool PlanFor(const PagedDecodeParams& p, Plan* plan) {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  const bool ring = UseRing(p);
  *plan = MakePlan(p, sms, ring ? CtasPerSmFor<true>(p.dtype, p.head_dim)
                                : CtasPerSmFor<false>(p.dtype, p.head_dim), ring);
  return true;
}

template <bool kBf16, int D, bool kPrefetch>
cudaError_t LaunchMain(const Plan& plan, const KernelArgs& a, dim3 grid, cudaStream_t stream) {
  if (plan.ring) {
    const cudaError_t e = PrepareRing<kBf16, D, kPrefetch>();
    if (e != cudaSuccess) return e;
    PagedDecodeRingKernel<kBf16, D, kPrefetch><<<grid, kThreads, RingSmemBytes(D), stream>>>(a);
  } else {
    PagedDecodeKernel<kBf16, D, kPrefetch><<<grid, kThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

template <bool kBf16, int D>
cudaError_t Launch(const PagedDecodeParams& p, const Plan& plan, bool prefetch,
                   cudaStream_t stream) {
  const WorkspaceLayout wl = LayoutFor(p, plan);
  KernelArgs a{};
  a.out = p.out;
  a.q = p.q;
  a.kv = p.kv_layer;
  a.block_tables = p.block_tables;
  a.context_lens = p.context_lens;
  a.ws_o = wl.total ? static_cast<float*>(p.workspace) : nullptr;
  a.ws_lse = wl.total ? reinterpret_cast<float*>(static_cast<char*>(p.workspace) + wl.o_bytes)
                      : nullptr;
  a.num_heads = p.num_heads;
  a.num_kv_heads = p.num_kv_heads;
  a.group = p.num_heads / p.num_kv_heads;
  a.head_chunks = plan.head_chunks;
  a.block_size = p.block_size;
  a.max_blocks_per_seq = p.max_blocks_per_seq;
  a.num_splits = plan.num_splits;
  a.units_per_split = plan.units_per_split;
  a.prefetch_distance = p.prefetch_distance > 0 ? p.prefetch_distance : kDefaultPrefetchDistance;
  a.scale_log2 = p.scale * 1.4426950408889634f;
  const dim3 grid(plan.num_splits, p.num_kv_heads * plan.head_chunks, p.num_seqs);
  cudaError_t err = prefetch ? LaunchMain<kBf16, D, true>(plan, a, grid, stream)
                             : LaunchMain<kBf16, D, false>(plan, a, grid, stream);
  if (err != cudaSuccess || plan.num_splits == 1) return err;

  // The combine kernel may start launching while the last CTAs of the main kernel drain; it
  // waits (griddepcontrol.wait) for the main grid's memory before reading the partials.
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(p.num_seqs) * unsigned(p.num_heads));
  cfg.blockDim = dim3(kCombineThreads);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  err = cudaLaunchKernelEx(&cfg, CombineSplitsKernel<kBf16>, p.out,
                           static_cast<const float*>(a.ws_o), static_cast<const float*>(a.ws_lse),
                           plan.num_splits, p.head_dim);
  if (err != cudaSuccess) (void)cudaGetLastError();
  return err;
}

}  // namespace

bool PagedDecodeSupported(const PagedDecodeParams& p) {
  if (p.dtype != DType::kF16 && p.dtype != DType::kBF16) return false;
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256) return false;
  if (p.block_size != 16 && p.block_size != 32) return false;
  if (p.num_seqs < 0 || p.num_seqs > 65535) return false;
  if (p.num_heads <= 0 || p.num_kv_heads <= 0 || p.num_heads % p.num_kv_heads != 0) return false;
  const int group = p.num_heads / p.num_kv_heads;
  if (long(p.num_kv_heads) * ((group + kHeadsPerCta - 1) / kHeadsPerCta) > 65535) return false;
  if (p.max_blocks_per_seq <= 0) return false;
  if (p.max_context_len < 0 || long(p.max_context_len) > long(p.max_blocks_per_seq) * p.block_size)
    return false;
  if (!std::isfinite(p.scale)) return false;
  if (p.num_splits < 0 || p.prefetch_distance < 0 || p.prefetch_distance > 16) return false;
  if (p.prefetch != Prefetch::kAuto && p.prefetch != Prefetch::kOff && p.prefetch != Prefetch::kOn)
    return false;
  if (p.kernel != DecodeKernel::kAuto && p.kernel != DecodeKernel::kRegisters &&
      p.kernel != DecodeKernel::kRing)
    return false;
  if (p.num_seqs > 0 && (!p.out || !p.q || !p.kv_layer || !p.block_tables || !p.context_lens))
    return false;
  // 16-byte vector access to q, out and KV tiles (also the bulk copies' alignment).
  auto aligned = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; };
  if (!aligned(p.q) || !aligned(p.kv_layer) || !aligned(p.out)) return false;
  return true;
}

size_t PagedDecodeWorkspaceBytes(const PagedDecodeParams& p) {
  if (!PagedDecodeSupported(p) || p.num_seqs == 0) return 0;
  Plan plan;
  if (!PlanFor(p, &plan)) return 0;
  return LayoutFor(p, plan).total;
}

int PagedDecodeNumSplits(const PagedDecodeParams& p) {
  if (!PagedDecodeSupported(p) || p.num_seqs == 0) return 0;
  Plan plan;
  if (!PlanFor(p, &plan)) return 0;
  return plan.num_splits;
}

DecodeKernel PagedDecodeAutoKernel(const PagedDecodeParams& p) {
  (void)p;
  return DecodeKernel::kRing;
}

bool PagedDecodeAutoPrefetch(const PagedDecodeParams& p) {
  // The variant that measured faster, by (MHA | GQA) x batch class x context class, from
  // bench/decode_attention on an H200 (bench/results/decode_attention_2026-11-29.md, fp16,
  // head 128, block 16, KV rotated over >= 320 MiB). Columns: batch 1 | 2-8 | 9-32 | > 32;
  // rows: context < 4096 | < 16384 | longer.
  static constexpr bool kTable[2][3][4] = {
      {{false, false, false, false}, {false, false, false, false}, {false, false, false, false}},  // MHA
      {{false, false, false, false}, {false, false, false, false}, {false, false, false, false}},  // GQA
  };
  const bool gqa = p.num_kv_heads > 0 && p.num_heads != p.num_kv_heads;
  const int bcls = p.num_seqs <= 1 ? 0 : (p.num_seqs <= 8 ? 1 : (p.num_seqs <= 32 ? 2 : 3));
  const int ccls = p.max_context_len < 4096 ? 0 : (p.max_context_len < 16384 ? 1 : 2);
  return kTable[gqa ? 1 : 0][ccls][bcls];
}

cudaError_t PagedDecodeAttention(const PagedDecodeParams& p, cudaStream_t stream) {
  if (!PagedDecodeSupported(p)) return cudaErrorInvalidValue;
  if (p.num_seqs == 0) return cudaSuccess;
  Plan plan;
  if (!PlanFor(p, &plan)) return cudaErrorInvalidDevice;
  const WorkspaceLayout wl = LayoutFor(p, plan);
  if (wl.total > 0 && (p.workspace == nullptr || p.workspace_bytes < wl.total))
    return cudaErrorInvalidValue;
  const bool prefetch = p.prefetch == Prefetch::kOn ||
                        (p.prefetch == Prefetch::kAuto && PagedDecodeAutoPrefetch(p));
  const bool bf = p.dtype == DType::kBF16;
  switch (p.head_dim) {
    case 64: return bf ? Launch<true, 64>(p, plan, prefetch, stream) : Launch<false, 64>(p, plan, prefetch, stream);
    case 128: return bf ? Launch<true, 128>(p, plan, prefetch, stream) : Launch<false, 128>(p, plan, prefetch, stream);
    default: return bf ? Launch<true, 256>(p, plan, prefetch, stream) : Launch<false, 256>(p, plan, prefetch, stream);
  }
}

}  // namespace kvstream::kernels
