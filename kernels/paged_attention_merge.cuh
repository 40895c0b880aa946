// The in-kernel split merges of the paged decode kernel (paged_attention_decode.cuh): the fused
// schedules' merge by the last CTA of a (sequence, KV head, head chunk), and the cluster
// schedules' merge through distributed shared memory. Both produce out[h] = sum_s w_s O_s with
// w_s = 2^(lse_s - M) / sum_s' 2^(lse_s' - M) over the splits s of the CTA's query heads.
// Included only by paged_attention.cu.
#pragma once

#include <cooperative_groups.h>

#include "kernels/paged_attention_common.cuh"

namespace kvstream::kernels::paged_decode {

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
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  // Clusters are sm_90 code: the sm_80/sm_89 images never get a.cluster > 1 (the planner makes
  // no cluster where the loaded image lacks the sm_90 paths, paged_attention_plan.h).
  __trap();
#else
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
#endif
}

}  // namespace kvstream::kernels::paged_decode
