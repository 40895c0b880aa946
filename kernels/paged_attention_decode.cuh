// The paged decode-attention kernel (one query token per sequence; the contract is in
// paged_attention.h, the launch in paged_attention.cu, the design in docs/kernels.md).
//
// Work decomposition. One CTA (W = 4 or 16 warps) per (sequence, KV head, group chunk of <= 8
// query heads, split). A "unit" is 16 consecutive tokens of one KV head (one 16-token tile of a
// block: a block of 16 is one unit, a block of 32 two). Warp w of a CTA takes the units
// u_begin + w, u_begin + w + W, ... of its split, so each K/V byte of the KV head is read once for
// the whole group of query heads (GQA) - never once per query head.
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
// log2-sum-exp) are merged by a second kernel launched with programmatic dependent launch
// (paged_attention_combine.cuh), or (fused schedules) by the last CTA of each (sequence, KV
// head), or (cluster schedules, where one cluster holds every split) through distributed shared
// memory (paged_attention_merge.cuh). The schedules change only the layout of this work.
// Included only by paged_attention.cu.
#pragma once

#include "kernels/paged_attention_common.cuh"
#include "kernels/paged_attention_merge.cuh"
#include "kernels/paged_attention_prefetch.cuh"
#include "kernels/paged_attention_timeline.cuh"

namespace kvstream::kernels::paged_decode {

constexpr int kPStride = 24;  // tokens per row of the per-warp P^T staging (bank-conflict free)

// Shared memory of a CTA:
//   p_s        [W][8 heads][kPStride] T        per-warp P^T staging (static)
//   ml_s       [W][8] float2 (m, l), wt_s [W][8] float, lse_cta_s [8] float   CTA merge (static)
//   dynamic:   o_s [W][8][D] float  the warps' unnormalised O (OSmemBytes); the fused merge
//              reuses it as scratch. Cluster schedules append red_s [8][D] float (the CTA's
//              merged output) and lse_s [8] float, read by the cluster's other CTAs
//              (MaxSmemBytes).
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
        if (un < u_end) PrefetchUnitL2(unit_k_ptr(un), v_offset, kTileBytes, a.bulk_prefetch);
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
      if (lane == 0 && un < u_end) PrefetchUnitL2(unit_k_ptr(un), v_offset, kTileBytes, a.bulk_prefetch);
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
  // then W shared loads and FMAs per output.
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

}  // namespace kvstream::kernels::paged_decode
