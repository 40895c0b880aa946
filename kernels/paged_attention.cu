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
// log2-sum-exp) are merged by a second kernel launched with programmatic dependent launch, or
// (fused schedules) by the last CTA of each (sequence, KV head), or (cluster schedules, where
// one cluster holds every split) through distributed shared memory. The schedules (Schedule in the
// header; 4- or 16-warp CTAs, split plan, merge, PDL, early L2 prefetch) change only the layout
// of this work, and kAuto picks one per shape from kAutoTable (measured).
#include "kernels/paged_attention.h"
#include "kernels/paged_attention_timeline.h"

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace kvstream::kernels {
namespace {

constexpr int kWarps = 4;        // warps per CTA of the 4-warp kernel (kWide: kWideWarps)
constexpr int kWideWarps = 16;   // one CTA of 16 warps per SM (fewer splits at small batch)
constexpr int kUnitTokens = 16;
constexpr int kHeadsPerCta = 8;
constexpr int kMaxSplits = 128;
constexpr int kMinUnitsPerSplit = 4;
constexpr int kPStride = 24;  // tokens per row of the per-warp P^T staging (bank-conflict free)
constexpr int kDefaultPrefetchDistance = 1;
// Fused combine: one arrival counter per (sequence, KV head, head chunk) at the start of the
// workspace; the region has a fixed size so that launches of different shapes sharing one
// workspace never put partials where another shape keeps its counters.
constexpr int kMaxFusedCounters = 4096;
constexpr size_t kCounterBytes = kMaxFusedCounters * sizeof(unsigned);
constexpr int kMaxEarlyUnits = 4;      // early L2 prefetch: at most a warp's first 4 units
// One unit (8 KiB per warp at head 128): measured 1.00-1.06x against two at batch 1-8 GQA, where
// deeper prefetches compete with the previous call's tail for DRAM and L2 (four: 0.91-1.07x of
// none; bench/results/decode_attention_2026-11-29_v5.md).
constexpr int kDefaultEarlyUnits = 1;

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
  unsigned* counters;     // fused combine: [num_seqs][num_kv_heads * head_chunks], zero between launches
  int fused;              // the last CTA of each (sequence, KV head, chunk) merges the splits
  int trigger;            // let the next PDL-launched grid be scheduled from this grid's start
  int early_units;        // 0..kMaxEarlyUnits: first units per warp prefetched before the wait
  int num_blocks;         // pool size in blocks (bounds the early prefetch's addresses)
  int cluster;            // CTAs per cluster (all splits, merged through DSMEM); 1 = no cluster
};

template <bool kBf16>
using Elem = std::conditional_t<kBf16, __nv_bfloat16, __half>;

// Per-CTA timestamps (paged_attention_timeline.h): compiled in only with KVSTREAM_PA_TIMELINE.
#ifdef KVSTREAM_PA_TIMELINE
// In constant memory: a mark reads it through the constant cache, which the KV loads do not
// evict (a global variable missed L1 at every mark: ~1 us per call added, and inside the
// measured intervals).
__constant__ unsigned long long* g_timeline = nullptr;
__device__ __forceinline__ unsigned long long* TimelineRow(long base) {
  const long cta = blockIdx.x + long(gridDim.x) * (blockIdx.y + long(gridDim.y) * blockIdx.z);
  if (g_timeline == nullptr || cta >= timeline::kMaxMainCtas) return nullptr;
  return g_timeline + (base + cta) * timeline::kMainSlots;
}
// Thread 0: event `ev` of this CTA (main kernel: base 0; combine: kMaxMainCtas).
__device__ __forceinline__ void TimelineMark(int ev, long base = 0) {
  if (threadIdx.x != 0) return;
  unsigned long long* r = TimelineRow(base);
  if (r == nullptr) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  r[ev] = t;
  if (base == 0 && ev <= timeline::kWritten) r[timeline::kClock + ev] = clock64();
}
__device__ __forceinline__ void TimelineValue(int slot, unsigned long long v, long base = 0) {
  unsigned long long* r = TimelineRow(base);
  if (r != nullptr) r[slot] = v;
}
__device__ __forceinline__ unsigned SmId() {
  unsigned id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}
#define KVSTREAM_TL(...) __VA_ARGS__
#else
#define KVSTREAM_TL(...)
#endif

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

// 128 registers at head 128 (4 CTAs = 16 warps per SM), both variants alike; the 16-warp CTA
// (head <= 128 only) gets the same 128 registers with one CTA per SM.
constexpr int MinCtasPerSm(int d, int warps) {
  return warps == kWideWarps ? 1 : (d <= 64 ? 5 : (d <= 128 ? 4 : 1));
}
// Dynamic shared memory of a CTA: the warps' (unnormalised) O for the CTA merge, reused by the
// fused combine for the split weights and the per-thread partial sums.
constexpr size_t OSmemBytes(int d, int warps) { return size_t(warps) * 8 * d * sizeof(float); }
// Cluster schedules add the CTA's merged output [8][d] and its per-head lse [8] after it, read
// by the other CTAs of the cluster.
constexpr size_t ClusterSmemBytes(int d) { return size_t(kHeadsPerCta) * (d + 1) * sizeof(float); }
// The kernel's dynamic shared-memory attribute: the largest size any schedule launches it with
// (set to this one value wherever it is set, so that no setter shrinks another's launch).
constexpr size_t MaxSmemBytes(int d, int warps) { return OSmemBytes(d, warps) + ClusterSmemBytes(d); }

template <bool kBf16, int D, int W>
__device__ void FusedMerge(const KernelArgs& a, float* smem, int seq, int h0, int nh);
template <bool kBf16, int D, int W>
__device__ void ClusterMerge(const KernelArgs& a, float* red_s, float* lse_s, int seq, int h0, int nh);

template <bool kBf16, int D, bool kPrefetch, int W>
__global__ void __launch_bounds__(W * 32, MinCtasPerSm(D, W)) PagedDecodeKernel(const KernelArgs a) {
  using T = Elem<kBf16>;
  KVSTREAM_TL(TimelineMark(timeline::kEntry));
  constexpr int kThreads = W * 32;
  static_assert((kHeadsPerCta * kMaxSplits + 4 * kThreads) * sizeof(float) <= OSmemBytes(64, W),
                "fused merge scratch fits the O staging");
  constexpr int kKLoads = D / 32;  // 16-byte K loads per token row-pair (a 32-dim chunk each)
  constexpr int kVChunks = D / 64;  // 64-dim chunks of V
  constexpr int kMTiles = D / 16;   // O^T m-tiles
  constexpr bool kVEarly = D <= 128;  // issue V's loads with K's (registers permitting)
  constexpr uint32_t kTileBytes = kUnitTokens * D * sizeof(T);

  __shared__ __align__(16) T p_s[W][kHeadsPerCta][kPStride];
  extern __shared__ __align__(16) float dyn_smem[];
  float(*o_s)[kHeadsPerCta][D] = reinterpret_cast<float(*)[kHeadsPerCta][D]>(dyn_smem);
  // Cluster schedules: this CTA's merged output [8][D] and per-head lse [8], after the O staging.
  float* const red_s = dyn_smem + W * kHeadsPerCta * D;
  float* const lse_s = red_s + kHeadsPerCta * D;
  __shared__ float2 ml_s[W][kHeadsPerCta];
  __shared__ float wt_s[W][kHeadsPerCta];  // CTA merge: warp w's normalised weight for head hh
  __shared__ float lse_cta_s[kHeadsPerCta];  // CTA merge: log2-sum-exp of the merged state

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane >> 2;  // mma group id
  const int c = lane & 3;   // thread in group
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
  const int u_begin = split * a.units_per_split;

  if (a.early_units > 0) {
    // Early L2 prefetch: while the previous grid in the stream may still run, pull this warp's
    // first KV tiles towards L2. Only a hint: the length and block ids read here may be stale
    // (they are read again after the wait), so a block id outside the pool is skipped, and
    // ld.global.cg keeps these reads out of L1 so no stale line can be read after the wait.
    // L2 is the point of coherence: a tile written after its prefetch is still read fresh.
    if (lane == 0) {
      const int len_pre = max(0, min(__ldcg(a.context_lens + seq), table_units * kUnitTokens));
      const int n_pre = (len_pre + kUnitTokens - 1) / kUnitTokens;
      const int end_pre = split == a.num_splits - 1 ? n_pre : min(n_pre, u_begin + a.units_per_split);
      int bpre[kMaxEarlyUnits];
#pragma unroll
      for (int k = 0; k < kMaxEarlyUnits; ++k) {
        const int un = u_begin + warp + k * W;
        bpre[k] = k < a.early_units && un < table_units ? __ldcg(bt + un / tiles_per_block) : -1;
      }
#pragma unroll
      for (int k = 0; k < kMaxEarlyUnits; ++k) {
        const int un = u_begin + warp + k * W;
        if (k < a.early_units && un < end_pre && unsigned(bpre[k]) < unsigned(a.num_blocks)) {
          const T* kp = kv + size_t(bpre[k]) * 2 * a.num_kv_heads * a.block_size * D +
                        size_t(kvh) * a.block_size * D + size_t(un % tiles_per_block) * kUnitTokens * D;
          PrefetchL2(kp, kUnitTokens * D * sizeof(T));
          PrefetchL2(kp + size_t(a.num_kv_heads) * a.block_size * D, kUnitTokens * D * sizeof(T));
        }
      }
    }
  }
  // Launched with programmatic dependent launch (PDL), this grid may be resident before the
  // previous grid in the stream has finished: apart from the early prefetch's hints above,
  // nothing is read or written before this wait.
  WaitPrimaryGrid();
  if (a.trigger) AllowDependentLaunch();
  KVSTREAM_TL(TimelineMark(timeline::kWaited));

  // The length, the block id of the warp's first unit (read if it lies inside the table row,
  // used only if it lies below the length) and q are independent loads, issued together: one
  // memory latency in front of the first KV loads, not two (length, then block id).
  const int len_raw = __ldg(a.context_lens + seq);
  int u = u_begin + warp;
  int blk = u < table_units ? __ldg(bt + u / tiles_per_block) : 0;

  // B operand of S^T = K Q^T for k-steps 2s and 2s+1: Q[head g][32s + 8c .. 32s + 8c + 8),
  // straight from global memory (no shared-memory staging, no barrier before the first KV
  // loads); heads past the group are zero.
  uint4 qr[kKLoads];
  {
    const uint4* qg = reinterpret_cast<const uint4*>(
        static_cast<const T*>(a.q) + (size_t(seq) * a.num_heads + h0 + min(g, nh - 1)) * D);
#pragma unroll
    for (int s = 0; s < kKLoads; ++s) qr[s] = g < nh ? __ldg(qg + 4 * s + c) : make_uint4(0, 0, 0, 0);
  }

  const int len = max(0, min(len_raw, table_units * kUnitTokens));
  const int n_units = (len + kUnitTokens - 1) / kUnitTokens;
  const int u_end =
      split == a.num_splits - 1 ? n_units : min(n_units, u_begin + a.units_per_split);

  const size_t head_stride = size_t(a.block_size) * D;               // one K (or V) tile row set
  const size_t v_offset = size_t(a.num_kv_heads) * head_stride;      // K -> V of the same block
  const size_t block_stride = 2 * v_offset;
  auto unit_ptr = [&](int b, int un) {
    return kv + size_t(b) * block_stride + size_t(kvh) * head_stride +
           size_t(un % tiles_per_block) * kUnitTokens * D;
  };
  auto unit_k_ptr = [&](int un) { return unit_ptr(__ldg(bt + un / tiles_per_block), un); };

  float o[kMTiles][4];
#pragma unroll
  for (int j = 0; j < kMTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // heads 2c and 2c+1

  const int stride = W;
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
  for (; u < u_end; u += stride) {
    const int blk_next = u + stride < u_end ? __ldg(bt + (u + stride) / tiles_per_block) : 0;
    const T* kp = unit_ptr(blk, u);
    const T* vp = kp + v_offset;
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
    // K as the A operand (rows = tokens g and g+8). Register kr[s][r] holds
    // K[token g + 8r][32s + 8c .. +8): words 0,1 feed k-step 2s (k = 2c.., 2c+8..),
    // words 2,3 k-step 2s+1. The dims are thereby permuted within each k-step; qr uses the
    // same permutation, so the dot products are unchanged.
    uint4 kr[kKLoads][2];
#pragma unroll
    for (int s = 0; s < kKLoads; ++s) {
      kr[s][0] = __ldg(reinterpret_cast<const uint4*>(kp + g * D + 32 * s + 8 * c));
      kr[s][1] = __ldg(reinterpret_cast<const uint4*>(kp + (g + 8) * D + 32 * s + 8 * c));
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
          vr[qc][t] = __ldg(reinterpret_cast<const uint4*>(vp + tok * D + 64 * qc + 8 * g));
        }
      }
    };
    if constexpr (kVEarly) load_v();

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
    // (The condition reads sc, so the mark waits for the mma, which waits for the K loads.)
    KVSTREAM_TL(if (u == u_begin && __float_as_uint(sc[0]) != 0xffffffffu) TimelineMark(timeline::kFirstData));
    if constexpr (!kVEarly) load_v();

    // sc: [0] = S[token g][head 2c], [1] = S[g][2c+1], [2] = S[g+8][2c], [3] = S[g+8][2c+1].
    const int tok0 = u * kUnitTokens;
    const bool ok_lo = tok0 + g < len, ok_hi = tok0 + g + 8 < len;
    float x0 = ok_lo ? sc[0] * a.scale_log2 : -INFINITY;
    float x1 = ok_lo ? sc[1] * a.scale_log2 : -INFINITY;
    float x2 = ok_hi ? sc[2] * a.scale_log2 : -INFINITY;
    float x3 = ok_hi ? sc[3] * a.scale_log2 : -INFINITY;
    float mx0 = fmaxf(x0, x2), mx1 = fmaxf(x1, x3);
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
    }
    // Token 0 of every processed unit is valid, so mx* is finite.
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    const float al0 = exp2f(m0 - mn0), al1 = exp2f(m1 - mn1);
    m0 = mn0;
    m1 = mn1;
    // P rounded to the KV type (the mma's input); l sums the rounded values for consistency.
    const T p0 = FromF<kBf16>(exp2f(x0 - mn0)), p1 = FromF<kBf16>(exp2f(x1 - mn1));
    const T p2 = FromF<kBf16>(exp2f(x2 - mn0)), p3 = FromF<kBf16>(exp2f(x3 - mn1));
    l0 = l0 * al0 + ToF<kBf16>(p0) + ToF<kBf16>(p2);
    l1 = l1 * al1 + ToF<kBf16>(p1) + ToF<kBf16>(p3);
#pragma unroll
    for (int j = 0; j < kMTiles; ++j) {
      o[j][0] *= al0;
      o[j][1] *= al1;
      o[j][2] *= al0;
      o[j][3] *= al1;
    }
    // P^T as the B operand needs P[head g][tokens 2c, 2c+1 | 2c+8, 2c+9]: transpose through a
    // per-warp 8 x 16 staging tile.
    p_s[warp][2 * c][g] = p0;
    p_s[warp][2 * c + 1][g] = p1;
    p_s[warp][2 * c][g + 8] = p2;
    p_s[warp][2 * c + 1][g + 8] = p3;
    __syncwarp();
    const uint32_t pb0 = *reinterpret_cast<const uint32_t*>(&p_s[warp][g][2 * c]);
    const uint32_t pb1 = *reinterpret_cast<const uint32_t*>(&p_s[warp][g][2 * c + 8]);
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
        Mma16816<kBf16>(o[4 * qc + w], __byte_perm(t0, t1, 0x5410), __byte_perm(t0, t1, 0x7632),
                        __byte_perm(t8, t9, 0x5410), __byte_perm(t8, t9, 0x7632), pb0, pb1);
      }
    }
    blk = blk_next;
  }
  KVSTREAM_TL({
    TimelineMark(timeline::kWarp0Done);
    if (lane == 0) {
      unsigned long long t;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
      TimelineValue(timeline::kWarpDone + warp, t);
    }
    if (threadIdx.x == 0)
      TimelineValue(timeline::kUnits, u_end > u_begin ? (u_end - u_begin + stride - 1) / stride : 0);
  });

  // l: per-thread partial sums over its tokens -> sum over the 8 groups.
#pragma unroll
  for (int off = 4; off < 32; off <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, off);
    l1 += __shfl_xor_sync(0xffffffffu, l1, off);
  }
  // o[j]: [0] = O[head 2c][dim], [2] = O[head 2c][dim+1], [1]/[3] the same for head 2c+1,
  // dim = 64qc + 8g + 2w.
#pragma unroll
  for (int qc = 0; qc < kVChunks; ++qc) {
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const int d = 64 * qc + 8 * g + 2 * w;
      *reinterpret_cast<float2*>(&o_s[warp][2 * c][d]) = make_float2(o[4 * qc + w][0], o[4 * qc + w][2]);
      *reinterpret_cast<float2*>(&o_s[warp][2 * c + 1][d]) =
          make_float2(o[4 * qc + w][1], o[4 * qc + w][3]);
    }
  }
  if (g == 0) {
    ml_s[warp][2 * c] = make_float2(m0, l0);
    ml_s[warp][2 * c + 1] = make_float2(m1, l1);
  }
  __syncthreads();
  KVSTREAM_TL(TimelineMark(timeline::kAllDone));

  // Merge the warps' states: out = sum_w 2^(m_w - M) O_w / sum_w 2^(m_w - M) l_w per head. The
  // weights depend on (warp, head) only, so they are computed once, all at the same time: thread
  // (hh, w) of the first W * nh threads (W consecutive lanes per head) takes warp w's state of
  // head hh and reduces max and sum over its head's lanes with shuffles. The element loop is
  // then W shared loads and FMAs per output. (It used to evaluate every weight again for each
  // of the head's D elements: 1.1 M warp instructions per call at qwen2.5-7b batch 1, ncu.)
  static_assert(32 % W == 0, "a head's W lanes lie in one warp (the shuffles stay inside it)");
  {
    const bool mine = threadIdx.x < W * nh;
    const unsigned lanes = __ballot_sync(0xffffffffu, mine);
    if (mine) {
      const int hh = threadIdx.x / W, w = threadIdx.x % W;
      const float2 ml = ml_s[w][hh];
      float mx = ml.x;
#pragma unroll
      for (int off = W / 2; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(lanes, mx, off));
      const float f = ml.x == -INFINITY ? 0.f : exp2f(ml.x - mx);  // (mx = -inf only if ml.x is)
      float sum = f * ml.y;
#pragma unroll
      for (int off = W / 2; off > 0; off >>= 1) sum += __shfl_xor_sync(lanes, sum, off);
      wt_s[w][hh] = sum > 0.f ? f / sum : 0.f;
      if (w == 0) lse_cta_s[hh] = sum > 0.f ? mx + log2f(sum) : -INFINITY;
    }
  }
  __syncthreads();
  KVSTREAM_TL(TimelineMark(timeline::kWeighted));
  // Write the output (one split) or this split's partial.
  for (int i = threadIdx.x; i < nh * D; i += kThreads) {
    const int hh = i / D, d = i % D;
    float val = 0.f;
#pragma unroll
    for (int w = 0; w < W; ++w) val += wt_s[w][hh] * o_s[w][hh][d];
    const int h = h0 + hh;
    if (a.cluster > 1) {
      // Kept in shared memory for the cluster merge below.
      red_s[hh * D + d] = val;
      if (d == 0) lse_s[hh] = lse_cta_s[hh];
    } else if (a.num_splits == 1) {
      static_cast<T*>(a.out)[(size_t(seq) * a.num_heads + h) * D + d] = FromF<kBf16>(val);
    } else {
      const size_t row = (size_t(seq) * a.num_heads + h) * a.num_splits + split;
      a.ws_o[row * D + d] = val;
      if (d == 0) a.ws_lse[row] = lse_cta_s[hh];
    }
  }
  KVSTREAM_TL({
    TimelineMark(timeline::kWritten);
    if (threadIdx.x == 0) TimelineValue(timeline::kSm, SmId());
  });
  if (a.cluster > 1) {
    ClusterMerge<kBf16, D, W>(a, red_s, lse_s, seq, h0, nh);
    KVSTREAM_TL(TimelineMark(timeline::kMerged));
    return;
  }
  if (!a.fused) return;

  // Fused combine: count this CTA's partial in; the CTA that brings the count to num_splits
  // is the last of its (sequence, KV head, chunk), resets the counter for the next launch and
  // merges all partials (they sit in L2). Every CTA of the grid arrives exactly once (no CTA
  // leaves earlier), and nobody waits on anybody, so there is no deadlock whatever the order
  // the CTAs run in.
  __shared__ int last_s;
  __threadfence();  // this CTA's partial is visible device-wide before it is counted
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned* ctr = a.counters + size_t(seq) * gridDim.y + blockIdx.y;
    const unsigned prev = atomicAdd(ctr, 1u);
    last_s = prev == unsigned(a.num_splits - 1);
    if (last_s) atomicExch(ctr, 0u);
  }
  __syncthreads();
  if (!last_s) return;
  __threadfence();
  FusedMerge<kBf16, D, W>(a, dyn_smem, seq, h0, nh);
  KVSTREAM_TL(TimelineMark(timeline::kMerged));
}

// The split merge of the fused combine, run by the last CTA of a (sequence, KV head, chunk):
// out[h] = sum_s w_s O_s with w_s = 2^(lse_s - M) / sum_s' 2^(lse_s' - M), over the CTA's nh
// query heads. All lse values and the first batch of partials are loaded before anything
// that depends on a loaded value (one L2 round trip); each output float4 column gets
// G = min(splits, threads / columns) threads that take every G-th split, summed in a fixed
// order (deterministic). __ldcg: the partials were written by other SMs in this grid.
template <bool kBf16, int D, int W>
__device__ void FusedMerge(const KernelArgs& a, float* smem, int seq, int h0, int nh) {
  using T = Elem<kBf16>;
  constexpr int kThreads = W * 32;
  constexpr int kBatch = 16;                      // partial float4 loads in flight per thread
  constexpr int kLsePer = kHeadsPerCta * kMaxSplits / kThreads;
  const int S = a.num_splits;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int cols = nh * (D / 4);
  const int G = max(1, min(S, kThreads / cols));
  float* w_s = smem;                                        // [nh][S]
  float4* part_s = reinterpret_cast<float4*>(smem + kHeadsPerCta * kMaxSplits);  // [G][cols]
  const size_t row0 = size_t(seq) * a.num_heads + h0;       // first (sequence, head) row

  float lr[kLsePer];
#pragma unroll
  for (int k = 0; k < kLsePer; ++k) {
    const int i = tid + k * kThreads;
    lr[k] = i < nh * S ? __ldcg(a.ws_lse + row0 * S + i) : -INFINITY;
  }
  // First batch of this thread's first column, issued before the weights are known.
  int idx = tid;
  int col = idx % cols, g = idx / cols;
  const float4* o4 = reinterpret_cast<const float4*>(a.ws_o);
  float4 v[kBatch];
  auto load_batch = [&](int sp0) {
    const int hh = col / (D / 4), c4 = col % (D / 4);
    const float4* src = o4 + (row0 + hh) * S * (D / 4) + c4;
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int sp = sp0 + k * G;
      v[k] = sp < S ? __ldcg(src + size_t(sp) * (D / 4)) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };
  if (idx < cols * G) load_batch(g);
#pragma unroll
  for (int k = 0; k < kLsePer; ++k) {
    const int i = tid + k * kThreads;
    if (i < nh * S) w_s[i] = lr[k];
  }
  __syncthreads();
  for (int hh = warp; hh < nh; hh += W) {
    float* w = w_s + hh * S;
    float mx = -INFINITY;
    for (int sp = lane; sp < S; sp += 32) mx = fmaxf(mx, w[sp]);
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    float sum = 0.f;
    for (int sp = lane; sp < S; sp += 32) {
      const float f = (w[sp] == -INFINITY || mx == -INFINITY) ? 0.f : exp2f(w[sp] - mx);
      w[sp] = f;
      sum += f;
    }
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    __syncwarp();
    for (int sp = lane; sp < S; sp += 32) w[sp] *= inv;
  }
  __syncthreads();

  auto store = [&](int c, const float4& acc) {
    const int hh = c / (D / 4), c4 = c % (D / 4);
    T* o = static_cast<T*>(a.out) + (row0 + hh) * D + 4 * c4;
    o[0] = FromF<kBf16>(acc.x);
    o[1] = FromF<kBf16>(acc.y);
    o[2] = FromF<kBf16>(acc.z);
    o[3] = FromF<kBf16>(acc.w);
  };
  for (; idx < cols * G; idx += kThreads) {
    col = idx % cols;
    g = idx / cols;
    const float* w = w_s + (col / (D / 4)) * S;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int sp0 = g; sp0 < S; sp0 += kBatch * G) {
      if (sp0 != g) load_batch(sp0);
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int sp = sp0 + k * G;
        const float f = sp < S ? w[sp] : 0.f;
        acc.x += f * v[k].x;
        acc.y += f * v[k].y;
        acc.z += f * v[k].z;
        acc.w += f * v[k].w;
      }
    }
    if (G == 1) {
      store(col, acc);
    } else {
      part_s[idx] = acc;
    }
    // The next column's first batch (only when a thread holds several columns: G == 1).
    if (idx + kThreads < cols * G) {
      col = (idx + kThreads) % cols;
      g = (idx + kThreads) / cols;
      load_batch(g);
    }
  }
  if (G > 1) {
    __syncthreads();
    for (int c = tid; c < cols; c += kThreads) {
      float4 acc = part_s[c];
      for (int gg = 1; gg < G; ++gg) {
        const float4 x = part_s[gg * cols + c];
        acc.x += x.x;
        acc.y += x.y;
        acc.z += x.z;
        acc.w += x.w;
      }
      store(c, acc);
    }
  }
}

// The cluster schedules' merge (one cluster holds every split of a (sequence, KV head,
// chunk)). Each CTA of the cluster holds its split's normalised output red_s[nh][D] and
// per-head lse_s[nh]; after a cluster barrier, the 32-dim slices (head hh, dims 32j..32j+32)
// are dealt to the cluster's warps (slice p to rank p % cs), and each lane reads its dim from
// all cs CTAs' shared memory at once (DSMEM), merges them and writes the output. A second
// barrier keeps every CTA's shared memory alive until the whole cluster has read it.
template <bool kBf16, int D, int W>
__device__ void ClusterMerge(const KernelArgs& a, float* red_s, float* lse_s, int seq, int h0, int nh) {
  namespace cg = cooperative_groups;
  using T = Elem<kBf16>;
  constexpr int kSlices = D / 32;
  cg::cluster_group cl = cg::this_cluster();
  cl.sync();
  const int cs = a.cluster;
  const int rank = int(cl.block_rank());
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int pieces = nh * kSlices;
  for (int p = rank + cs * warp; p < pieces; p += cs * W) {
    const int hh = p / kSlices, d = (p % kSlices) * 32 + lane;
    // Two passes over the cluster's lse (the max, then the weights), so that no per-rank array
    // stays live in registers (the 4-warp kernel at head 64 runs at 5 CTAs per SM).
    float mx = -INFINITY;
    for (int r = 0; r < cs; ++r) mx = fmaxf(mx, cl.map_shared_rank(lse_s, r)[hh]);
    float sum = 0.f, acc = 0.f;
    for (int r = 0; r < cs; ++r) {
      const float l = cl.map_shared_rank(lse_s, r)[hh];
      const float f = (l == -INFINITY || mx == -INFINITY) ? 0.f : exp2f(l - mx);
      sum += f;
      acc += f * cl.map_shared_rank(red_s, r)[hh * D + d];
    }
    static_cast<T*>(a.out)[(size_t(seq) * a.num_heads + h0 + hh) * D + d] = FromF<kBf16>(sum > 0.f ? acc / sum : 0.f);
  }
  cl.sync();
}

// Merges the split partials: out = sum_s 2^(lse_s - M) O_s / sum_s 2^(lse_s - M), one CTA per
// (sequence, query head, kDims-dim slice: 32, or 128 for fewer CTAs - each then holds up to 16
// partial float4 per thread). The kernel is pure latency (the partials are a few KiB
// per head and sit in L2, just written), so every load it needs - all splits' lse and this
// slice of all their partials, at most kCombinePer float4 per thread - is issued at once, before
// anything that depends on a loaded value: one memory round trip, then block reductions. (The
// previous version loaded the partials in a loop behind the weights: several dependent round
// trips, more with more splits; 2.5x this one's time at 114 splits.)
constexpr int kCombineThreads = 256;
static_assert(kMaxSplits <= kCombineThreads, "one lse per thread");
template <bool kBf16, int kCombineDims>
__global__ void __launch_bounds__(kCombineThreads) CombineSplitsKernel(void* out, const float* ws_o,
                                                                       const float* ws_lse,
                                                                       int num_splits, int head_dim) {
  using T = Elem<kBf16>;
  constexpr int kCombineCols = kCombineDims / 4;                   // float4 columns per CTA
  constexpr int kCombineGroups = kCombineThreads / kCombineCols;  // split groups (32 or 8)
  constexpr int kCombinePer = kMaxSplits / kCombineGroups;         // partials per thread (4 or 16)
  constexpr int kW = kCombineThreads / 32;
  __shared__ float w_s[kMaxSplits];
  __shared__ float max_s[kW], sum_s[kW];
  __shared__ float4 acc_s[kW][kCombineCols];
  KVSTREAM_TL(TimelineMark(timeline::kEntry, timeline::kMaxMainCtas));
  AllowDependentLaunch();
  WaitPrimaryGrid();
  KVSTREAM_TL(TimelineMark(timeline::kWaited, timeline::kMaxMainCtas));
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int col = tid % kCombineCols, grp = tid / kCombineCols;
  const int cols = head_dim / 4;
  const size_t row0 = size_t(blockIdx.x) * num_splits;
  const float4* o4 =
      reinterpret_cast<const float4*>(ws_o) + row0 * cols + blockIdx.y * kCombineCols + col;
  float4 v[kCombinePer];
#pragma unroll
  for (int i = 0; i < kCombinePer; ++i) {
    const int sp = grp + i * kCombineGroups;
    v[i] = sp < num_splits ? o4[size_t(sp) * cols] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  const float lse = tid < num_splits ? ws_lse[row0 + tid] : -INFINITY;

  float mx = lse;
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  if (lane == 0) max_s[warp] = mx;
  __syncthreads();
  mx = max_s[0];
#pragma unroll
  for (int w = 1; w < kW; ++w) mx = fmaxf(mx, max_s[w]);
  const float wt = (lse == -INFINITY || mx == -INFINITY) ? 0.f : exp2f(lse - mx);
  if (tid < kMaxSplits) w_s[tid] = wt;
  float sum = wt;
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (lane == 0) sum_s[warp] = sum;
  __syncthreads();
  sum = 0.f;
#pragma unroll
  for (int w = 0; w < kW; ++w) sum += sum_s[w];

  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int i = 0; i < kCombinePer; ++i) {
    const int sp = grp + i * kCombineGroups;
    const float f = sp < num_splits ? w_s[sp] : 0.f;
    acc.x += f * v[i].x;
    acc.y += f * v[i].y;
    acc.z += f * v[i].z;
    acc.w += f * v[i].w;
  }
  // 32-dim slices: lanes l, l^8, l^16, l^24 of a warp hold the same column (4 split groups
  // per warp); 128-dim slices: one group per warp.
  for (int off = kCombineCols; off < 32; off <<= 1) {
    acc.x += __shfl_xor_sync(0xffffffffu, acc.x, off);
    acc.y += __shfl_xor_sync(0xffffffffu, acc.y, off);
    acc.z += __shfl_xor_sync(0xffffffffu, acc.z, off);
    acc.w += __shfl_xor_sync(0xffffffffu, acc.w, off);
  }
  if (lane < kCombineCols) acc_s[warp][lane] = acc;
  __syncthreads();
  if (tid < kCombineCols) {
    float4 t = acc_s[0][tid];
#pragma unroll
    for (int w = 1; w < kW; ++w) {
      const float4 x = acc_s[w][tid];
      t.x += x.x;
      t.y += x.y;
      t.z += x.z;
      t.w += x.w;
    }
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    T* o = static_cast<T*>(out) + size_t(blockIdx.x) * head_dim + blockIdx.y * kCombineDims + 4 * tid;
    o[0] = FromF<kBf16>(t.x * inv);
    o[1] = FromF<kBf16>(t.y * inv);
    o[2] = FromF<kBf16>(t.z * inv);
    o[3] = FromF<kBf16>(t.w * inv);
  }
  KVSTREAM_TL({
    TimelineMark(timeline::kWritten, timeline::kMaxMainCtas);
    if (threadIdx.x == 0) TimelineValue(timeline::kSm, SmId(), timeline::kMaxMainCtas);
  });
}

// The same merge for few splits (<= kFewSplits): one thread per output float4 of a (sequence,
// query head) row, computing that row's weights itself from its <= 8 lse values (read by all
// threads of the row: L1 broadcasts) - no block reductions, all loads at once, and as many
// threads as output columns (the 32-dim-slice kernel would launch 32 split groups per slice,
// nearly all idle, for the many rows of a large batch).
constexpr int kFewSplits = 8;
template <bool kBf16>
__global__ void __launch_bounds__(kCombineThreads) CombineFewSplitsKernel(void* out, const float* ws_o,
                                                                          const float* ws_lse,
                                                                          int num_splits, int head_dim,
                                                                          int rows) {
  using T = Elem<kBf16>;
  AllowDependentLaunch();
  WaitPrimaryGrid();
  const int cols = head_dim / 4;
  const size_t i = size_t(blockIdx.x) * kCombineThreads + threadIdx.x;
  const size_t row = i / cols;
  const int col = int(i % cols);
  if (row >= size_t(rows)) return;
  const size_t row0 = row * num_splits;
  const float4* o4 = reinterpret_cast<const float4*>(ws_o) + row0 * cols + col;
  float lse[kFewSplits];
  float4 v[kFewSplits];
#pragma unroll
  for (int sp = 0; sp < kFewSplits; ++sp) {
    lse[sp] = sp < num_splits ? ws_lse[row0 + sp] : -INFINITY;
    v[sp] = sp < num_splits ? o4[size_t(sp) * cols] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  float mx = lse[0];
#pragma unroll
  for (int sp = 1; sp < kFewSplits; ++sp) mx = fmaxf(mx, lse[sp]);
  float sum = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int sp = 0; sp < kFewSplits; ++sp) {
    const float f = (lse[sp] == -INFINITY || mx == -INFINITY) ? 0.f : exp2f(lse[sp] - mx);
    sum += f;
    acc.x += f * v[sp].x;
    acc.y += f * v[sp].y;
    acc.z += f * v[sp].z;
    acc.w += f * v[sp].w;
  }
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  T* o = static_cast<T*>(out) + row * head_dim + 4 * col;
  o[0] = FromF<kBf16>(acc.x * inv);
  o[1] = FromF<kBf16>(acc.y * inv);
  o[2] = FromF<kBf16>(acc.z * inv);
  o[3] = FromF<kBf16>(acc.w * inv);
}

struct Plan {
  Schedule schedule = Schedule::kV2;  // resolved (never kAuto)
  int warps = kWarps;
  int head_chunks = 1;
  int num_splits = 1;
  int units_per_split = 1;
  bool fused = false;  // the last CTA merges (no combine kernel); only with num_splits > 1
  bool pdl = false;    // main (and combine) kernel launched with programmatic dependent launch
  bool early = false;  // early L2 prefetch before griddepcontrol.wait
  int cluster = 1;     // cluster schedules: CTAs per cluster, >= num_splits (grid x = cluster)
  int combine_dims = 32;  // > kFewSplits splits: dims per combine CTA (32 or 128)
};

template <bool kBf16, int D, int W>
int CtasPerSm() {
  static const int n = [] {
    int v = 0;
    auto* k = PagedDecodeKernel<kBf16, D, false, W>;
    const size_t smem = OSmemBytes(D, W);
    // The occupancy of the plain schedules' size.
    if ((MaxSmemBytes(D, W) > 48 * 1024 &&
         cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(MaxSmemBytes(D, W))) !=
             cudaSuccess) ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, k, W * 32, smem) != cudaSuccess) {
      (void)cudaGetLastError();
      v = 0;
    }
    return std::max(v, 1);
  }();
  return n;
}

int CtasPerSmFor(DType dt, int d, int warps) {
  // Planned from the prefetch-off variant for both variants, so that both split a context the
  // same way and produce bit-identical outputs.
  const bool bf = dt == DType::kBF16;
  if (warps == kWideWarps) {
    if (d == 64) return bf ? CtasPerSm<true, 64, kWideWarps>() : CtasPerSm<false, 64, kWideWarps>();
    return bf ? CtasPerSm<true, 128, kWideWarps>() : CtasPerSm<false, 128, kWideWarps>();
  }
  switch (d) {
    case 64: return bf ? CtasPerSm<true, 64, kWarps>() : CtasPerSm<false, 64, kWarps>();
    case 128: return bf ? CtasPerSm<true, 128, kWarps>() : CtasPerSm<false, 128, kWarps>();
    default: return bf ? CtasPerSm<true, 256, kWarps>() : CtasPerSm<false, 256, kWarps>();
  }
}

int UnitsFor(int tokens) { return std::max(1, (tokens + kUnitTokens - 1) / kUnitTokens); }

// True when the host lengths describe an uneven batch (the longest > 1.5x the mean).
bool UnevenBatch(const PagedDecodeParams& p) {
  if (p.host_context_lens == nullptr || p.num_seqs <= 1 || p.num_seqs > 1024) return false;
  long sum = 0;
  int mx = 0;
  for (int i = 0; i < p.num_seqs; ++i) {
    const int l = std::clamp(p.host_context_lens[i], 0, p.max_context_len);
    sum += l;
    mx = std::max(mx, l);
  }
  return sum > 0 && 2 * long(mx) * p.num_seqs > 3 * sum;
}

// A batch whose longest context is far above the mean: the wave-filling plan above, made for
// max_context_len as if every sequence were that long, gives the long sequences a few CTAs that
// each run many times longer than everyone else's (one landed 16k prompt among 4k streams: 2
// CTAs of 512 units per head while the others hold 128-256). Choose instead the split count
// that minimises an estimate of the kernel's time: waves of real CTAs x (units per CTA + a
// CTA's fixed cost), plus the CTAs that find their sequence already covered and exit at once.
// Costs are in units (one unit ~ 1 us of a CTA's time at full-device bandwidth).
int UnevenBatchSplits(const PagedDecodeParams& p, int units, long ctas_per_seq_split, long slots,
                      int even_plan) {
  constexpr double kCtaCost = 5.0, kEmptyCtaCost = 1.0;
  auto units_of = [&](int i) {
    return (std::clamp(p.host_context_lens[i], 0, p.max_context_len) + kUnitTokens - 1) / kUnitTokens;
  };
  long sum_units = 0;
  int max_units = 0;
  for (int i = 0; i < p.num_seqs; ++i) {
    const int u = units_of(i);
    sum_units += u;
    max_units = std::max(max_units, u);
  }
  if (sum_units == 0 || 2 * long(max_units) * p.num_seqs <= 3 * sum_units) return even_plan;
  const int max_splits = std::clamp(units / kMinUnitsPerSplit, 1, kMaxSplits);
  int best = even_plan;
  double best_cost = 1e300;
  // Candidates grow geometrically (35 of them up to 128 splits): this runs on the host at
  // every launch, O(candidates x num_seqs).
  for (int s = 1; s <= max_splits; s = std::max(s + 1, s * 9 / 8)) {
    const int ups = (units + s - 1) / s;
    long real = 0;
    for (int i = 0; i < p.num_seqs; ++i) real += std::max(1, (units_of(i) + ups - 1) / ups);
    const int launched_splits = (units + ups - 1) / ups;
    const long empty = (long(launched_splits) * p.num_seqs - real) * ctas_per_seq_split;
    real *= ctas_per_seq_split;
    const long waves = (real + slots - 1) / slots;
    const double cost = double(waves) * (ups + kCtaCost) + kEmptyCtaCost * double(empty) / slots;
    if (cost < best_cost - 1e-9) {
      best_cost = cost;
      best = s;
    }
  }
  return best;
}

// v2's plan: fill whole waves of resident CTAs - the smallest split count whose last wave is
// >= 90% full, with at least kMinUnitsPerSplit units (one per warp) per split.
int WaveFillSplits(long base, int units, long slots) {
  const int max_splits = std::clamp(units / kMinUnitsPerSplit, 1, kMaxSplits);
  int splits = 1;
  double best_eff = -1.0;
  for (int s = 1; s <= max_splits; ++s) {
    const long ctas = base * s;
    const long waves = (ctas + slots - 1) / slots;
    const double eff = double(ctas) / double(waves * slots);
    if (eff >= 0.9) return s;
    if (eff > best_eff + 1e-9) {
      best_eff = eff;
      splits = s;
    }
  }
  return splits;
}

// v3's plan where one wave of CTAs holds every split (base < slots): the fewest loads-then-
// compute rounds per warp (units per split rounded up to whole rounds of `warps` units) among
// the split counts whose CTAs fit one wave, then the fewest splits. v2 took 57 splits of 18
// units at llama-3-8b batch 1 ctx 16k (rounds 5,5,4,4 per warp: the last one half empty); this
// takes 64 of 16 (4 rounds each, 512 CTAs of 528 slots).
int OneWaveSplits(long base, int units, long slots, int warps) {
  const int max_splits = std::clamp(units / warps, 1, kMaxSplits);
  int best = 1;
  long best_rounds = (units + warps - 1) / warps;
  for (int s = 2; s <= max_splits; ++s) {
    const int ups = ((units + s - 1) / s + warps - 1) / warps * warps;
    const int ns = (units + ups - 1) / ups;
    if (base * ns > slots) break;
    const long rounds = ups / warps;
    if (rounds < best_rounds) {
      best_rounds = rounds;
      best = ns;
    }
  }
  return best;
}

bool ScheduleWide(Schedule s) {
  return s == Schedule::kWideKernel || s == Schedule::kWideFused || s == Schedule::kWideCluster;
}
bool ScheduleFused(Schedule s) { return s == Schedule::kFused || s == Schedule::kWideFused; }
bool ScheduleCluster(Schedule s) { return s == Schedule::kCluster || s == Schedule::kWideCluster; }
// The 4-warp / 16-warp counterpart a schedule falls back to.
Schedule KernelCombineOf(Schedule s) { return ScheduleWide(s) ? Schedule::kWideKernel : Schedule::kKernel; }

// How many clusters of `cs` CTAs of the main kernel the device holds at once (0: none, or the
// query failed). Clusters of 16 are "non-portable" and need the kernel attribute set first.
template <bool kBf16, int D, int W>
int MaxActiveClusters(int cs) {
  static int cache[5] = {-1, -1, -1, -1, -1};  // cs = 1, 2, 4, 8, 16
  const int idx = cs == 16 ? 4 : (cs == 8 ? 3 : (cs == 4 ? 2 : (cs == 2 ? 1 : 0)));
  if (cache[idx] >= 0) return cache[idx];
  int n = 0;
  bool ok = true;
  for (auto* k : {PagedDecodeKernel<kBf16, D, false, W>, PagedDecodeKernel<kBf16, D, true, W>}) {
    const size_t smem = MaxSmemBytes(D, W);
    ok = ok && cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)) == cudaSuccess;
    if (cs > 8) ok = ok && cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess;
    if (!ok) break;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(cs);
    cfg.blockDim = dim3(W * 32);
    cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cs;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int v = 0;
    ok = cudaOccupancyMaxActiveClusters(&v, k, &cfg) == cudaSuccess;
    n = n == 0 ? v : std::min(n, v);
  }
  if (!ok) {
    (void)cudaGetLastError();
    n = 0;
  }
  cache[idx] = n;
  return n;
}

int MaxActiveClustersFor(DType dt, int d, int warps, int cs) {
  const bool bf = dt == DType::kBF16;
  if (warps == kWideWarps) {
    if (d == 64) return bf ? MaxActiveClusters<true, 64, kWideWarps>(cs) : MaxActiveClusters<false, 64, kWideWarps>(cs);
    return bf ? MaxActiveClusters<true, 128, kWideWarps>(cs) : MaxActiveClusters<false, 128, kWideWarps>(cs);
  }
  switch (d) {
    case 64: return bf ? MaxActiveClusters<true, 64, kWarps>(cs) : MaxActiveClusters<false, 64, kWarps>(cs);
    case 128: return bf ? MaxActiveClusters<true, 128, kWarps>(cs) : MaxActiveClusters<false, 128, kWarps>(cs);
    default: return bf ? MaxActiveClusters<true, 256, kWarps>(cs) : MaxActiveClusters<false, 256, kWarps>(cs);
  }
}

// The cluster schedules' cluster size: the smallest power of two >= the split count (at most
// 16) if the device holds every cluster of the launch at once where the plan fits one wave (else
// at least one cluster); 1 = no cluster (the schedule falls back to its kernel-combine
// counterpart). Where a head's splits would span several clusters, the cross-cluster merge
// (partials in global memory, the last arrival of each slice merging them) measured slower than
// the combine kernel at every shape (bench/results/decode_attention_2026-11-29_v4.md), so
// there is none.
int ClusterSizeFor(const PagedDecodeParams& p, const Plan& plan, long base, long slots) {
  int cs = 2;
  while (cs < plan.num_splits) cs *= 2;
  if (cs > 16) return 1;
  const long ctas = base * cs;
  const int active = MaxActiveClustersFor(p.dtype, p.head_dim, plan.warps, cs);
  if (active <= 0 || (ctas <= slots && long(active) * cs < ctas)) return 1;
  return cs;
}

// kAuto's choice by (MHA | GQA) x batch class x context class: the schedule and early-prefetch
// setting that measured fastest on an H200, each variant timed against v2 and the others in the
// same process (bench/results/decode_attention_2026-11-29_v3.md for batch 1-8, v4 (call 2) for
// every class, derived with bench/auto_table.py: per class the choice whose worst ratio to the
// fastest variant over the class's shapes is highest; measured at batch 1, 8, 32, 64, 128 and
// ctx 1k, 4k, 8k, 16k, 32k; fp16, head 128, block 16). Where nothing beat v2 by more than the
// run-to-run spread (~1 %), v2 stays; where a new choice tied the v3 one within the spread, the
// v3 one stays. Uneven batches keep v2 (their planner was measured there).
// Classes: batch 1 | 2-8 | 9-32 | > 32; context < 4096 | < 8192 | < 16384 | longer.
struct AutoChoice {
  Schedule schedule;
  bool early;
};
constexpr AutoChoice kV2Choice{Schedule::kV2, false};
constexpr AutoChoice kWide{Schedule::kWideKernel, false};
constexpr AutoChoice kWideEarly{Schedule::kWideKernel, true};
constexpr AutoChoice kKernelEarly{Schedule::kKernel, true};
constexpr AutoChoice kWideCl{Schedule::kWideCluster, false};
constexpr AutoChoice kWideClEarly{Schedule::kWideCluster, true};
constexpr AutoChoice kAutoTable[2][4][4] = {
    // MHA. B1: wide 1.06x (1k), wide+early 1.01-1.03x; B8 >= 8k: wide 1.02-1.03x;
    // B32 >= 8k: wide (one split) 1.01-1.02x; B > 32 >= 16k: wide 1.01x.
    {{kWide, kWideEarly, kWideEarly, kWideEarly},
     {kV2Choice, kV2Choice, kWide, kWide},
     {kV2Choice, kV2Choice, kWide, kWide},
     {kV2Choice, kV2Choice, kV2Choice, kWide}},
    // GQA. B1: kernel+early 1.17-1.22x (1k), wide+early 1.02-1.12x (4k-32k). B8: the wide
    // cluster merge where a cluster holds all splits (llama-3-8b: 2 splits, 1.04-1.10x over
    // wide+early at 1k-4k; not qwen2.5-7b's 4), with the early prefetch from 4k (1.00-1.03x;
    // at 1k it cost llama-3-8b 9 %, and qwen2.5-7b, which falls back to wide, loses 5 % without
    // it). B32: wide (one split) 1.15x at qwen2.5-7b 1k (llama-3-8b 0.98x), wide+early 1.16x at
    // qwen2.5-7b 4k (llama-3-8b 1.00x), wide 1.02-1.05x from 8k (0.995x at qwen2.5-7b 32k).
    // B > 32 >= 8k: wide 1.00-1.03x.
    {{kKernelEarly, kWideEarly, kWideEarly, kWideEarly},
     {kWideCl, kWideClEarly, kWideClEarly, kWideClEarly},
     {kWide, kWideEarly, kWide, kWide},
     {kV2Choice, kV2Choice, kWide, kWide}},
};

const AutoChoice& AutoFor(const PagedDecodeParams& p) {
  const bool gqa = p.num_kv_heads > 0 && p.num_heads != p.num_kv_heads;
  const int bcls = p.num_seqs <= 1 ? 0 : (p.num_seqs <= 8 ? 1 : (p.num_seqs <= 32 ? 2 : 3));
  const int ccls = p.max_context_len < 4096   ? 0
                   : p.max_context_len < 8192  ? 1
                   : p.max_context_len < 16384 ? 2
                                               : 3;
  return kAutoTable[gqa ? 1 : 0][bcls][ccls];
}

Schedule AutoSchedule(const PagedDecodeParams& p) { return AutoFor(p).schedule; }

bool AutoEarlyPrefetch(const PagedDecodeParams& p, const Plan& plan) {
  (void)plan;
  return p.schedule == Schedule::kAuto && !UnevenBatch(p) && AutoFor(p).early;
}

Plan MakePlan(const PagedDecodeParams& p, int sm_count) {
  Plan plan;
  Schedule sched = p.schedule != Schedule::kAuto ? p.schedule
                   : UnevenBatch(p)                ? Schedule::kV2
                                                   : AutoSchedule(p);
  // Uneven batches keep the 4-warp kernel (their planner's costs are made for it); the 16-warp
  // CTA needs head <= 128 (registers).
  if (ScheduleWide(sched) && (p.head_dim > 128 || UnevenBatch(p)))
    sched = sched == Schedule::kWideFused     ? Schedule::kFused
            : sched == Schedule::kWideCluster ? Schedule::kCluster
                                              : Schedule::kKernel;
  plan.schedule = sched;
  plan.warps = ScheduleWide(sched) ? kWideWarps : kWarps;
  plan.pdl = sched != Schedule::kV2;
  const int ctas_per_sm = CtasPerSmFor(p.dtype, p.head_dim, plan.warps);
  const int group = p.num_heads / p.num_kv_heads;
  plan.head_chunks = (group + kHeadsPerCta - 1) / kHeadsPerCta;
  const int units = UnitsFor(p.max_context_len);
  const long base = long(p.num_seqs) * p.num_kv_heads * plan.head_chunks;
  const long slots = long(std::max(sm_count, 1)) * ctas_per_sm;
  int splits = 1;
  if (p.num_splits > 0) {
    splits = std::min({p.num_splits, units, kMaxSplits});
  } else if (sched != Schedule::kV2 && base < slots) {
    splits = OneWaveSplits(base, units, slots, plan.warps);
  } else {
    splits = WaveFillSplits(base, units, slots);
  }
  if (p.num_splits <= 0 && !ScheduleWide(sched) && UnevenBatch(p)) {
    splits = UnevenBatchSplits(p, units, base / p.num_seqs, slots, splits);
  }
  plan.units_per_split = (units + splits - 1) / splits;
  plan.num_splits = (units + plan.units_per_split - 1) / plan.units_per_split;
  plan.fused = plan.num_splits > 1 && ScheduleFused(sched) &&
               long(p.num_seqs) * p.num_kv_heads * plan.head_chunks <= kMaxFusedCounters;
  if (ScheduleCluster(sched)) {
    plan.cluster = plan.num_splits > 1 ? ClusterSizeFor(p, plan, base, slots) : 1;
    if (plan.cluster == 1) plan.schedule = KernelCombineOf(sched);
  }
  plan.combine_dims = p.combine_dims == 128 && p.head_dim >= 128 ? 128 : 32;
  plan.early = plan.pdl && p.num_blocks > 0 &&
               (p.early_prefetch == Prefetch::kOn ||
                (p.early_prefetch == Prefetch::kAuto && AutoEarlyPrefetch(p, plan)));
  return plan;
}

size_t AlignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

// Units per warp the early L2 prefetch covers in this plan (0: none).
int EarlyUnits(const PagedDecodeParams& p, const Plan& plan) {
  return plan.early ? (p.early_prefetch_units > 0 ? p.early_prefetch_units : kDefaultEarlyUnits) : 0;
}

// Workspace when the context is split: [counters: kCounterBytes][partial O][partial lse].
struct WorkspaceLayout {
  size_t o_offset = 0;
  size_t lse_offset = 0;
  size_t total = 0;
};

WorkspaceLayout LayoutFor(const PagedDecodeParams& p, const Plan& plan) {
  WorkspaceLayout w;
  if (plan.num_splits <= 1 || plan.cluster > 1) return w;  // (clusters merge in shared memory)
  const size_t rows = size_t(p.num_seqs) * p.num_heads * plan.num_splits;
  w.o_offset = kCounterBytes;
  w.lse_offset = w.o_offset + AlignUp(rows * p.head_dim * sizeof(float), 256);
  w.total = w.lse_offset + AlignUp(rows * sizeof(float), 256);
  return w;
}

bool PlanFor(const PagedDecodeParams& p, Plan* plan) {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  *plan = MakePlan(p, sms);
  return true;
}

template <bool kBf16, int D, bool kPrefetch, int W>
cudaError_t LaunchMain(const KernelArgs& a, const Plan& plan, dim3 grid, cudaStream_t stream) {
  auto* k = PagedDecodeKernel<kBf16, D, kPrefetch, W>;
  const size_t smem = plan.cluster > 1 ? MaxSmemBytes(D, W) : OSmemBytes(D, W);
  if (MaxSmemBytes(D, W) > 48 * 1024) {
    static const cudaError_t attr_err =
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(MaxSmemBytes(D, W)));
    if (attr_err != cudaSuccess) return attr_err;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(W * 32);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (plan.pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (plan.cluster > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = unsigned(plan.cluster);
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, k, a);
}

template <bool kBf16, int D>
cudaError_t Launch(const PagedDecodeParams& p, const Plan& plan, bool prefetch,
                   cudaStream_t stream) {
  const WorkspaceLayout wl = LayoutFor(p, plan);
  char* ws = static_cast<char*>(p.workspace);
  KernelArgs a{};
  a.out = p.out;
  a.q = p.q;
  a.kv = p.kv_layer;
  a.block_tables = p.block_tables;
  a.context_lens = p.context_lens;
  a.ws_o = wl.total ? reinterpret_cast<float*>(ws + wl.o_offset) : nullptr;
  a.ws_lse = wl.total ? reinterpret_cast<float*>(ws + wl.lse_offset) : nullptr;
  a.counters = wl.total ? reinterpret_cast<unsigned*>(ws) : nullptr;
  a.fused = plan.fused ? 1 : 0;
  // v2 let only its combine kernel start early; v3 lets whatever PDL-launched grid comes next.
  a.trigger = plan.pdl || plan.num_splits > 1;
  a.early_units = EarlyUnits(p, plan);
  a.num_blocks = p.num_blocks;
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
  a.cluster = plan.cluster;
  // A cluster launch needs whole clusters: the CTAs past the last split find no units and
  // contribute nothing (lse -inf) to their cluster's merge.
  const dim3 grid(plan.cluster > 1 ? plan.cluster : plan.num_splits,
                  p.num_kv_heads * plan.head_chunks, p.num_seqs);
  cudaError_t err;
  if constexpr (D <= 128) {
    if (plan.warps == kWideWarps) {
      err = prefetch ? LaunchMain<kBf16, D, true, kWideWarps>(a, plan, grid, stream)
                     : LaunchMain<kBf16, D, false, kWideWarps>(a, plan, grid, stream);
    } else {
      err = prefetch ? LaunchMain<kBf16, D, true, kWarps>(a, plan, grid, stream)
                     : LaunchMain<kBf16, D, false, kWarps>(a, plan, grid, stream);
    }
  } else {
    err = prefetch ? LaunchMain<kBf16, D, true, kWarps>(a, plan, grid, stream)
                   : LaunchMain<kBf16, D, false, kWarps>(a, plan, grid, stream);
  }
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return err;
  }
  if (plan.num_splits == 1 || plan.fused || plan.cluster > 1) return cudaSuccess;

  // The combine kernel may start launching while the last CTAs of the main kernel drain; it
  // waits (griddepcontrol.wait) for the main grid's memory before reading the partials.
  cudaLaunchConfig_t cfg{};
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cfg.blockDim = dim3(kCombineThreads);
  const unsigned rows = unsigned(p.num_seqs) * unsigned(p.num_heads);
  if (plan.num_splits <= kFewSplits) {
    const size_t threads = size_t(rows) * (p.head_dim / 4);
    cfg.gridDim = dim3(unsigned((threads + kCombineThreads - 1) / kCombineThreads));
    err = cudaLaunchKernelEx(&cfg, CombineFewSplitsKernel<kBf16>, p.out,
                             static_cast<const float*>(a.ws_o), static_cast<const float*>(a.ws_lse),
                             plan.num_splits, p.head_dim, int(rows));
  } else {
    auto* combine = plan.combine_dims == 128 ? CombineSplitsKernel<kBf16, 128> : CombineSplitsKernel<kBf16, 32>;
    cfg.gridDim = dim3(rows, unsigned(p.head_dim / plan.combine_dims));
    err = cudaLaunchKernelEx(&cfg, combine, p.out, static_cast<const float*>(a.ws_o),
                             static_cast<const float*>(a.ws_lse), plan.num_splits, p.head_dim);
  }
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
  if (int(p.schedule) < int(Schedule::kAuto) || int(p.schedule) > int(Schedule::kWideCluster))
    return false;
  if (p.early_prefetch != Prefetch::kAuto && p.early_prefetch != Prefetch::kOff &&
      p.early_prefetch != Prefetch::kOn)
    return false;
  if (p.num_blocks < 0 || p.early_prefetch_units < 0 || p.early_prefetch_units > 4) return false;
  if (p.combine_dims != 0 && p.combine_dims != 32 && p.combine_dims != 128) return false;
  if (p.num_seqs > 0 && (!p.out || !p.q || !p.kv_layer || !p.block_tables || !p.context_lens))
    return false;
  // 16-byte vector access to q, out and KV tiles.
  auto aligned = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; };
  if (!aligned(p.q) || !aligned(p.kv_layer) || !aligned(p.out)) return false;
  return true;
}

size_t PagedDecodeWorkspaceBytes(const PagedDecodeParams& p) { return PagedDecodeDescribe(p).workspace_bytes; }

int PagedDecodeNumSplits(const PagedDecodeParams& p) { return PagedDecodeDescribe(p).num_splits; }

bool PagedDecodeAutoPrefetch(const PagedDecodeParams& p) {
  // The variant that measured faster, by (MHA | GQA) x batch class x context class, from
  // bench/decode_attention on an H200 (bench/results/decode_attention_2026-11-29.md and
  // decode_attention_2026-11-29_v2.md, fp16, head 128, block 16, KV rotated over >= 320 MiB).
  // Prefetch on (lookahead 1 warp stride) was slower at every measured shape in both
  // measurements: 0.79-0.99x (the closest at batch-1 GQA ctx 1k), lookahead 2 worse still; ncu
  // showed +21 % DRAM bytes with it (prefetched tiles read twice). So every entry is "off".
  // Columns: batch 1 | 2-8 | 9-32 | > 32; rows: context < 4096 | < 16384 | longer.
  static constexpr bool kTable[2][3][4] = {
      {{false, false, false, false}, {false, false, false, false}, {false, false, false, false}},  // MHA
      {{false, false, false, false}, {false, false, false, false}, {false, false, false, false}},  // GQA
  };
  const bool gqa = p.num_kv_heads > 0 && p.num_heads != p.num_kv_heads;
  const int bcls = p.num_seqs <= 1 ? 0 : (p.num_seqs <= 8 ? 1 : (p.num_seqs <= 32 ? 2 : 3));
  const int ccls = p.max_context_len < 4096 ? 0 : (p.max_context_len < 16384 ? 1 : 2);
  return kTable[gqa ? 1 : 0][ccls][bcls];
}

int PagedDecodeClusterSize(const PagedDecodeParams& p) { return PagedDecodeDescribe(p).cluster; }

Schedule PagedDecodeResolvedSchedule(const PagedDecodeParams& p) { return PagedDecodeDescribe(p).schedule; }

namespace {
bool InLoopPrefetch(const PagedDecodeParams& p) {
  return p.prefetch == Prefetch::kOn || (p.prefetch == Prefetch::kAuto && PagedDecodeAutoPrefetch(p));
}
}  // namespace

PagedDecodePlanInfo PagedDecodeDescribe(const PagedDecodeParams& p) {
  PagedDecodePlanInfo info;
  if (!PagedDecodeSupported(p)) return info;
  info.supported = true;
  Plan plan;
  if (p.num_seqs == 0 || !PlanFor(p, &plan)) return info;
  info.schedule = plan.num_splits > 1 && ScheduleFused(plan.schedule) && !plan.fused
                      ? (plan.schedule == Schedule::kWideFused ? Schedule::kWideKernel : Schedule::kKernel)
                      : plan.schedule;
  info.num_splits = plan.num_splits;
  info.cluster = plan.cluster;
  info.warps_per_cta = plan.warps;
  info.in_loop_prefetch = InLoopPrefetch(p);
  info.early_prefetch_units = EarlyUnits(p, plan);
  info.workspace_bytes = LayoutFor(p, plan).total;
  if (plan.num_splits > 1 && !plan.fused && plan.cluster <= 1)
    info.combine_dims = plan.num_splits <= kFewSplits ? 4 : plan.combine_dims;
  return info;
}

cudaError_t PagedDecodeAttention(const PagedDecodeParams& p, cudaStream_t stream) {
  if (!PagedDecodeSupported(p)) return cudaErrorInvalidValue;
  if (p.num_seqs == 0) return cudaSuccess;
  Plan plan;
  if (!PlanFor(p, &plan)) return cudaErrorInvalidDevice;
  const WorkspaceLayout wl = LayoutFor(p, plan);
  if (wl.total > 0 && (p.workspace == nullptr || p.workspace_bytes < wl.total))
    return cudaErrorInvalidValue;
  const bool prefetch = InLoopPrefetch(p);
  const bool bf = p.dtype == DType::kBF16;
  switch (p.head_dim) {
    case 64: return bf ? Launch<true, 64>(p, plan, prefetch, stream) : Launch<false, 64>(p, plan, prefetch, stream);
    case 128: return bf ? Launch<true, 128>(p, plan, prefetch, stream) : Launch<false, 128>(p, plan, prefetch, stream);
    default: return bf ? Launch<true, 256>(p, plan, prefetch, stream) : Launch<false, 256>(p, plan, prefetch, stream);
  }
}

namespace timeline {
cudaError_t SetBuffer(unsigned long long* device_buffer) {
#ifdef KVSTREAM_PA_TIMELINE
  // Synchronous: launches queued after this call on any stream see the new buffer.
  const cudaError_t e = cudaMemcpyToSymbol(g_timeline, &device_buffer, sizeof(device_buffer));
  return e != cudaSuccess ? e : cudaDeviceSynchronize();
#else
  (void)device_buffer;
  return cudaErrorNotSupported;
#endif
}
}  // namespace timeline

}  // namespace kvstream::kernels
