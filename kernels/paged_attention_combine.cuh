// The split combine kernels of the paged decode attention: a second grid, launched with
// programmatic dependent launch after the main kernel (paged_attention_decode.cuh), that merges
// the normalised split partials of each (sequence, query head) row from the workspace:
//   ws_o:   [rows][num_splits][head_dim] float, ws_lse: [rows][num_splits] float,
//   out:    [rows][head_dim] T, rows = num_seqs x num_heads (paged_attention_common.cuh).
// out = sum_s 2^(lse_s - M) O_s / sum_s 2^(lse_s - M). Included only by paged_attention.cu.
#pragma once

#include "kernels/paged_attention_common.cuh"
#include "kernels/paged_attention_timeline.cuh"

namespace kvstream::kernels::paged_decode {

// More than kFewSplits splits: one CTA per (sequence, query head, kDims-dim slice: 32, or 128
// for fewer CTAs - each then holds up to 16 partial float4 per thread). The kernel is pure
// latency (the partials are a few KiB per head and sit in L2, just written), so every load it
// needs - all splits' lse and this slice of all their partials, at most kCombinePer float4 per
// thread - is issued at once, before anything that depends on a loaded value: one memory round
// trip, then block reductions.
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

}  // namespace kvstream::kernels::paged_decode
