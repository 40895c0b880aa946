#include "kernels/sampling.h"

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common/sampling_math.h"
#include "kernels/code_paths.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define KV_SAMPLE_CLUSTER 1
#include <cooperative_groups.h>
#endif

namespace kvstream::kernels {
namespace {

namespace sm = kvstream::sampling;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 256;        // radix digit of 8 bits
constexpr int kMaxCollect = 256;  // top-N candidates gathered at once
// Radix histograms are accumulated by 32-bit shared atomics of every lane in kCopies private
// copies (two warps share one), then summed.
constexpr int kCopies = kWarps / 2;
constexpr unsigned kFull = 0xFFFFFFFFu;
using u64 = unsigned long long;

struct Shared {
  u64 hist[kBins];
  // Written once per launch and read by the other blocks of the row's cluster.
  float row_max;
  int row_argmax;
  u64 row_kept;
  int row_token;
  float red_f[kWarps];
  int red_i[kWarps];
  u64 red_u[kWarps];
  uint32_t sel_prefix;
  u64 sel_above;
  int sel_found;
  int token;
  int collect_count;
  uint32_t collect_key[kMaxCollect];
  int collect_idx[kMaxCollect];
};

// A row is sampled by a cluster of G blocks (G = 1 below Hopper), block `rank` owning the
// contiguous slice [lo, hi) of the row. The blocks exchange per-slice figures through
// distributed shared memory; every block reduces them in rank order, so all take the same
// decisions and pass the same number of cluster barriers.
template <int G>
__device__ inline int ClusterRank() {
#if KV_SAMPLE_CLUSTER
  if constexpr (G > 1) return int(cooperative_groups::this_cluster().block_rank());
#endif
  return 0;
}
template <int G>
__device__ inline void ClusterSync() {
#if KV_SAMPLE_CLUSTER
  if constexpr (G > 1) {
    cooperative_groups::this_cluster().sync();
    return;
  }
#endif
  __syncthreads();
}
// The block `rank`'s copy of this block's shared variable p.
template <int G, class T>
__device__ inline T* ClusterAt(T* p, int rank) {
#if KV_SAMPLE_CLUSTER
  if constexpr (G > 1) return cooperative_groups::this_cluster().map_shared_rank(p, rank);
#endif
  (void)rank;
  return p;
}

// The argmax order of layer_ops.cu's ArgmaxRows: larger first, lower index on ties, NaN never.
__device__ inline bool Better(float v, int i, float bv, int bi) {
  return v > bv || (v == bv && i < bi);
}

__device__ void WarpArgmax(float& v, int& i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_down_sync(kFull, v, o);
    const int oi = __shfl_down_sync(kFull, i, o);
    if (Better(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
}

__device__ u64 WarpSumU(u64 x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFull, x, o);
  return x;
}

__device__ float WarpSumF(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFull, x, o);
  return x;
}

// Every thread gets the row's argmax (value, index; index INT_MAX when every value is NaN).
__device__ void BlockArgmax(Shared& s, float& v, int& i) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  WarpArgmax(v, i);
  if (lane == 0) {
    s.red_f[warp] = v;
    s.red_i[warp] = i;
  }
  __syncthreads();
  if (warp == 0) {
    v = s.red_f[lane];
    i = s.red_i[lane];
    WarpArgmax(v, i);
    if (lane == 0) {
      s.red_f[0] = v;
      s.red_i[0] = i;
    }
  }
  __syncthreads();
  v = s.red_f[0];
  i = s.red_i[0];
  __syncthreads();
}

// Exact (integer) block sum, the same in every thread.
__device__ u64 BlockSumU(Shared& s, u64 x) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  x = WarpSumU(x);
  if (lane == 0) s.red_u[warp] = x;
  __syncthreads();
  if (warp == 0) {
    x = WarpSumU(s.red_u[lane]);
    if (lane == 0) s.red_u[0] = x;
  }
  __syncthreads();
  x = s.red_u[0];
  __syncthreads();
  return x;
}

// Float block sum in a fixed order (the same launch shape gives the same bits).
__device__ float BlockSumF(Shared& s, float x) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  x = WarpSumF(x);
  if (lane == 0) s.red_f[warp] = x;
  __syncthreads();
  if (warp == 0) {
    x = WarpSumF(s.red_f[lane]);
    if (lane == 0) s.red_f[0] = x;
  }
  __syncthreads();
  x = s.red_f[0];
  __syncthreads();
  return x;
}

// Conditions for RadixSelect. SetTotal receives F(floor), the kept count or weight.
struct CountAtLeast {
  u64 target;
  __device__ void SetTotal(u64) {}
  __device__ bool operator()(u64 f) const { return f >= target; }
};
struct TopPMass {
  float top_p;
  u64 total = 0;
  __device__ void SetTotal(u64 t) { total = t; }
  __device__ bool operator()(u64 f) const { return sm::TopPReached(f, total, top_p); }
};

// The largest key t >= floor with cond(F(t)), F(t) = sum over the row's i with
// key_i >= t of (kMass ? weight_i : 1); floor when no t qualifies. cond must be monotone (true
// from some F on). Four passes over the slice, one per 8-bit digit from the top: a histogram
// of the candidates (keys agreeing with the digits chosen so far), summed over the cluster's
// slices, then the warp 0 of every block picks the highest digit whose suffix sum qualifies.
// priv: kCopies * 2 * kBins of shared memory.
template <int G, bool kMass, class Cond>
__device__ uint32_t RadixSelect(Shared& s, unsigned* priv, const float* row, int lo, int hi,
                                float max_logit, float inv_t, uint32_t floor, Cond cond) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned* mine = priv + (warp % kCopies) * 2 * kBins;  // low halves, then high halves
  uint32_t prefix = 0;
  u64 above = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < kCopies * 2 * kBins; b += kThreads) priv[b] = 0;
    __syncthreads();
    const uint32_t hi_mask = shift == 24 ? 0u : (0xFFFFFFFFu << (shift + 8));
    for (int i0 = lo; i0 < hi; i0 += kThreads) {
      const int i = i0 + int(threadIdx.x);
      int bin = kBins;  // not a candidate
      u64 v = 0;
      if (i < hi) {
        const float z = row[i];
        const uint32_t key = sm::SortKey(z);
        if (key >= floor && (key & hi_mask) == (prefix & hi_mask)) {
          v = kMass ? sm::SampleWeight(z, max_logit, inv_t) : 1;
          if (v != 0) bin = int((key >> shift) & 0xFFu);
        }
      }
      if (bin < kBins) {
        // v <= 2^31 in two halves of 16 bits: a copy's sums over its two warps' <= 2^16
        // candidates per pass fit 32 bits.
        atomicAdd(&mine[bin], unsigned(v & 0xFFFFu));
        if (kMass) atomicAdd(&mine[kBins + bin], unsigned(v >> 16));
      }
    }
    __syncthreads();
    for (int b = threadIdx.x; b < kBins; b += kThreads) {
      u64 sum = 0;
      for (int c = 0; c < kCopies; ++c)
        sum += u64(priv[c * 2 * kBins + b]) + (u64(priv[c * 2 * kBins + kBins + b]) << 16);
      s.hist[b] = sum;
    }
    ClusterSync<G>();  // every slice's histogram complete
    if (warp == 0) {
      u64 h[8], local = 0;
      for (int j = 0; j < 8; ++j) {
        h[j] = 0;
        for (int r = 0; r < G; ++r) h[j] += ClusterAt<G>(s.hist, r)[lane * 8 + j];
        local += h[j];
      }
      // The first pass sees every key >= floor: its bins add up to F(floor).
      if (shift == 24) cond.SetTotal(WarpSumU(local));
      u64 incl = local;  // sum over this lane and the lanes above it (higher bins)
      for (int o = 1; o < 32; o <<= 1) {
        const u64 t = __shfl_down_sync(kFull, incl, o);
        if (lane + o < 32) incl += t;
      }
      u64 cum = above + (incl - local);
      int found = -1;
      u64 found_above = 0;
      for (int j = 7; j >= 0; --j) {
        if (cond(cum + h[j])) {
          found = lane * 8 + j;
          found_above = cum;
          break;
        }
        cum += h[j];
      }
      const int best = __reduce_max_sync(kFull, found);
      if (lane == 0) s.sel_found = best;
      if (best >= 0 && found == best) {
        s.sel_prefix = prefix | (uint32_t(best) << shift);
        s.sel_above = found_above;
      }
    }
    ClusterSync<G>();  // no block reads another's histogram any more
    const bool none = s.sel_found < 0;
    prefix = s.sel_prefix;
    above = s.sel_above;
    __syncthreads();
    if (none) return floor;
  }
  return prefix < floor ? floor : prefix;
}

// The draw over the kept tokens of the slice [lo, hi), in two steps. DrawSums: the kept weight
// of the slice (every thread gets it); warp w owns the contiguous indices
// [lo + w * seg, lo + (w + 1) * seg), read 32 at a time; the sums of those 32-wide steps go to
// step_sums so that only one step is read again. DrawFind (the block whose slice holds the
// draw point r, r < its kept weight): the first kept index whose running weight exceeds r.
struct Kept {
  const float* row;
  int lo, hi;
  float max_logit, inv_t;
  uint32_t t;
  u64 min_w;
  __device__ u64 operator()(int i) const {
    if (i >= hi) return 0;
    const float z = row[i];
    if (sm::SortKey(z) < t) return 0;
    const u64 w = sm::SampleWeight(z, max_logit, inv_t);
    return w >= min_w ? w : 0;
  }
  __device__ int Steps() const { return (hi - lo + kThreads - 1) / kThreads; }
};

__device__ u64 DrawSums(Shared& s, u64* step_sums, const Kept& kept) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int steps = kept.Steps();
  const int seg = steps * 32;
  u64 warp_total = 0;
  for (int j = 0; j < steps; ++j) {
    const u64 sum = WarpSumU(kept(kept.lo + warp * seg + j * 32 + lane));
    if (lane == 0) step_sums[warp * steps + j] = sum;
    warp_total += sum;
  }
  return BlockSumU(s, lane == 0 ? warp_total : 0);
}

__device__ int DrawFind(Shared& s, const u64* step_sums, const Kept& kept, u64 r) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int steps = kept.Steps();
  const int seg = steps * 32;
  if (warp == 0) {
    u64 mine = 0;  // the kept weight of warp `lane`'s segment
    for (int j = 0; j < steps; ++j) mine += step_sums[lane * steps + j];
    u64 incl = mine;  // inclusive prefix over warps in index order
    for (int o = 1; o < 32; o <<= 1) {
      const u64 x = __shfl_up_sync(kFull, incl, o);
      if (lane >= o) incl += x;
    }
    const unsigned hit = __ballot_sync(kFull, incl > r);
    const int w = __ffs(hit) - 1;  // the slice's total > r: some warp
    u64 before = __shfl_sync(kFull, incl - mine, w);
    // The step of warp w, 32 step sums at a time.
    int step = -1;
    for (int j0 = 0; j0 < steps && step < 0; j0 += 32) {
      const u64 v = j0 + lane < steps ? step_sums[w * steps + j0 + lane] : 0;
      u64 c = v;
      for (int o = 1; o < 32; o <<= 1) {
        const u64 x = __shfl_up_sync(kFull, c, o);
        if (lane >= o) c += x;
      }
      const unsigned h = __ballot_sync(kFull, before + c > r);
      if (h) {
        const int l = __ffs(h) - 1;
        step = j0 + l;
        before += __shfl_sync(kFull, c - v, l);
      } else {
        before += __shfl_sync(kFull, c, 31);
      }
    }
    const int base = kept.lo + w * seg + step * 32;
    const u64 v = kept(base + lane);
    u64 c = v;
    for (int o = 1; o < 32; o <<= 1) {
      const u64 x = __shfl_up_sync(kFull, c, o);
      if (lane >= o) c += x;
    }
    const unsigned h = __ballot_sync(kFull, before + c > r);
    if (lane == 0) s.token = base + (__ffs(h) - 1);
  }
  __syncthreads();
  const int token = s.token;
  __syncthreads();
  return token;
}

// The top n (key descending, index ascending) of the row into ids (n <= kSampleMaxTop).
__device__ void TopN(Shared& s, unsigned* priv, const float* row, int vocab, int n, int* ids) {
  const uint32_t tn =
      RadixSelect<1, false>(s, priv, row, 0, vocab, 0.f, 0.f, 0u, CountAtLeast{u64(n)});
  // Everything above the threshold (fewer than n), then the threshold's ties, lowest first.
  for (int pass = 0; pass < 2; ++pass) {
    if (threadIdx.x == 0) s.collect_count = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      const uint32_t key = sm::SortKey(row[i]);
      if (pass == 0 ? key >= tn : key > tn) {
        const int slot = atomicAdd(&s.collect_count, 1);
        if (slot < kMaxCollect) {
          s.collect_key[slot] = key;
          s.collect_idx[slot] = i;
        }
      }
    }
    __syncthreads();
    const int count = s.collect_count;
    if (pass == 0 && count > kMaxCollect) {
      __syncthreads();
      continue;  // too many ties at the threshold: take those above, then the ties one by one
    }
    int taken = 0;
    if (threadIdx.x == 0) {
      const int c = count < kMaxCollect ? count : kMaxCollect;
      for (; taken < n && taken < c; ++taken) {
        int best = taken;
        for (int j = taken + 1; j < c; ++j) {
          const bool better = s.collect_key[j] != s.collect_key[best]
                                  ? s.collect_key[j] > s.collect_key[best]
                                  : s.collect_idx[j] < s.collect_idx[best];
          if (better) best = j;
        }
        const uint32_t k = s.collect_key[best];
        const int ix = s.collect_idx[best];
        s.collect_key[best] = s.collect_key[taken];
        s.collect_idx[best] = s.collect_idx[taken];
        s.collect_key[taken] = k;
        s.collect_idx[taken] = ix;
        ids[taken] = ix;
      }
      s.sel_found = taken;
    }
    __syncthreads();
    taken = s.sel_found;
    __syncthreads();
    if (pass == 0) return;
    int last = -1;
    for (; taken < n; ++taken) {
      int best = INT_MAX;
      for (int i = threadIdx.x; i < vocab; i += kThreads)
        if (i > last && sm::SortKey(row[i]) == tn) best = min(best, i);
      for (int o = 16; o > 0; o >>= 1) best = min(best, __shfl_xor_sync(kFull, best, o));
      if ((threadIdx.x & 31) == 0) s.red_i[threadIdx.x >> 5] = best;
      __syncthreads();
      if (threadIdx.x < 32) {
        int b = s.red_i[threadIdx.x];
        for (int o = 16; o > 0; o >>= 1) b = min(b, __shfl_xor_sync(kFull, b, o));
        if (threadIdx.x == 0) s.sel_found = b;
      }
      __syncthreads();
      last = s.sel_found;
      __syncthreads();
      if (last == INT_MAX) break;
      if (threadIdx.x == 0) ids[taken] = last;
    }
    return;
  }
}

template <int G>
__global__ void __launch_bounds__(kThreads)
    SampleKernel(int32_t* tokens, SampleLogprobs* logprobs, const float* logits,
                 const SampleParams* params, int vocab) {
#if defined(__CUDA_ARCH__) && !defined(KV_SAMPLE_CLUSTER)
  if constexpr (G > 1) {
    __trap();  // clusters exist from sm_90 on; the host launches G > 1 only there
    return;
  }
#endif
  __shared__ Shared s;
  extern __shared__ u64 step_sums[];
  const int rank = ClusterRank<G>();
  const int row_index = int(blockIdx.x) / G;
  const float* row = logits + size_t(row_index) * vocab;
  const SampleParams p = params[row_index];
  const int slice = (vocab + G - 1) / G;
  const int lo = min(vocab, rank * slice), hi = min(vocab, lo + slice);

  // A sampled row's slice is staged in shared memory (G > 1: the launch sized it so): the
  // passes below read it several times, and from global memory they are latency-bound.
  const float* src = row;  // src[i]: logit i, for i in [lo, hi)
  // Dynamic shared memory: step sums (even count), private histograms, (G > 1) the slice.
  unsigned* priv =
      reinterpret_cast<unsigned*>(step_sums + ((kWarps * ((slice + kThreads - 1) / kThreads) + 1) & ~1));
  if (G > 1 && p.inv_temperature > 0) {
    float* staged = reinterpret_cast<float*>(priv + kCopies * 2 * kBins);
    const float* from = row + lo;
    const int n = hi - lo;
    if ((reinterpret_cast<uintptr_t>(from) & 15) == 0) {
      const float4* from4 = reinterpret_cast<const float4*>(from);
      float4* to4 = reinterpret_cast<float4*>(staged);
#pragma unroll 4
      for (int k = threadIdx.x; k < n / 4; k += kThreads) to4[k] = from4[k];
      for (int k = (n / 4) * 4 + int(threadIdx.x); k < n; k += kThreads) staged[k] = from[k];
    } else {
      for (int k = threadIdx.x; k < n; k += kThreads) staged[k] = from[k];
    }
    __syncthreads();
    src = staged - lo;
  }

  float bv = -INFINITY;
  int bi = INT_MAX;
  for (int j = lo + int(threadIdx.x); j < hi; j += kThreads) {
    const float v = src[j];
    if (Better(v, j, bv, bi)) {
      bv = v;
      bi = j;
    }
  }
  BlockArgmax(s, bv, bi);
  if constexpr (G > 1) {
    if (threadIdx.x == 0) {
      s.row_max = bv;
      s.row_argmax = bi;
    }
    ClusterSync<G>();
    for (int r = 0; r < G; ++r) {  // Better is a total order: the same winner in every block
      const Shared& o = *ClusterAt<G>(&s, r);
      if (Better(o.row_max, o.row_argmax, bv, bi)) {
        bv = o.row_max;
        bi = o.row_argmax;
      }
    }
  }
  const int greedy_token = bi == INT_MAX ? 0 : bi;
  int token = greedy_token;
  if (p.inv_temperature > 0 && bi != INT_MAX && sm::IsFinite(bv)) {
    const float m = bv, inv_t = p.inv_temperature;
    uint32_t t = 0;
    if (p.top_k > 0 && p.top_k < vocab)
      t = RadixSelect<G, false>(s, priv, src, lo, hi, m, inv_t, 0u, CountAtLeast{u64(p.top_k)});
    if (p.top_p < 1.0f)
      t = RadixSelect<G, true>(s, priv, src, lo, hi, m, inv_t, t, TopPMass{p.top_p});
    const Kept kept{src, lo, hi, m, inv_t, t, p.min_weight};
    const u64 mine = DrawSums(s, step_sums, kept);
    const uint32_t u24 = sm::PhiloxUniform24(p.seed, p.token_index);
    if constexpr (G == 1) {
      token = DrawFind(s, step_sums, kept, sm::DrawPoint(mine, u24));
    } else {
      if (threadIdx.x == 0) s.row_kept = mine;
      ClusterSync<G>();
      u64 before = 0, total = 0;
      for (int r = 0; r < G; ++r) {
        const u64 k = ClusterAt<G>(&s, r)->row_kept;
        if (r < rank) before += k;
        total += k;
      }
      const u64 point = sm::DrawPoint(total, u24);  // total >= the max logit's weight > 0
      if (point >= before && point - before < mine) {
        const int found = DrawFind(s, step_sums, kept, point - before);
        if (threadIdx.x == 0) ClusterAt<G>(&s, 0)->row_token = found;
      }
      ClusterSync<G>();  // the token is in block 0; no block reads another's memory after this
      if (rank != 0) return;
      token = s.row_token;
    }
  } else if constexpr (G > 1) {
    ClusterSync<G>();  // no block leaves while another may read its shared memory
    if (rank != 0) return;
  }
  if (threadIdx.x == 0) tokens[row_index] = token;
  if (p.top_logprobs < 0 || logprobs == nullptr) return;

  // The log-probabilities: block 0 alone, over the whole row (the bits do not depend on G).
  float e = 0;
  for (int j = threadIdx.x; j < vocab; j += kThreads) {
    const float z = row[j];
    if (!sm::IsNan(z)) e += expf(z - bv);
  }
  const float log_z = bv + logf(BlockSumF(s, e));
  SampleLogprobs& out = logprobs[row_index];
  if (threadIdx.x == 0) out.logprob = row[token] - log_z;
  const int n = min(p.top_logprobs, min(kSampleMaxTop, vocab));
  if (n == 0) return;
  __shared__ int ids[kSampleMaxTop];
  TopN(s, priv, row, vocab, n, ids);
  __syncthreads();
  if (threadIdx.x < n) {
    out.top_ids[threadIdx.x] = ids[threadIdx.x];
    out.top_logprobs[threadIdx.x] = row[ids[threadIdx.x]] - log_z;
  }
}

// The blocks per row: 4 where the device runs the sm_90 paths (kernels/code_paths.h) and the
// vocabulary is large enough to split, else 1.
int ClusterBlocks(int vocab) {
  static const bool hopper = [] {
    int dev = 0;
    if (FallbackForced() || cudaGetDevice(&dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return DeviceRunsHopperCode(dev, reinterpret_cast<const void*>(SampleKernel<4>));
  }();
  // Four blocks stage a quarter of the row each in shared memory: up to 4 x 40k logits.
  return hopper && vocab >= 16 * kThreads && vocab <= 4 * 40 * 1024 ? 4 : 1;
}

template <int G>
cudaError_t Launch(int32_t* tokens, SampleLogprobs* logprobs, const float* logits,
                   const SampleParams* params, int rows, int vocab, cudaStream_t stream) {
  const int slice = (vocab + G - 1) / G;
  const size_t sums = size_t((kWarps * ((slice + kThreads - 1) / kThreads) + 1) & ~1);
  // Step sums, the private histograms, then (G > 1) the staged slice, 16-byte aligned.
  const size_t smem = sums * sizeof(u64) + kCopies * 2 * kBins * sizeof(unsigned) +
                      (G > 1 ? size_t(slice) * sizeof(float) : 0);
  if (smem + sizeof(Shared) > 220 * 1024) return cudaErrorInvalidValue;
  if (smem > 32 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(
        SampleKernel<G>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) return e;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned(rows) * G);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  if (G > 1) {
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = G;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    config.attrs = attr;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, SampleKernel<G>, tokens, logprobs, logits, params, vocab);
}

}  // namespace

cudaError_t SampleRows(int32_t* tokens, SampleLogprobs* logprobs, const float* logits,
                       const SampleParams* params, int rows, int vocab, cudaStream_t stream,
                       SamplePath path) {
  if (rows < 0 || vocab <= 0 || !tokens || !logits || !params) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  return path == SamplePath::kAuto && ClusterBlocks(vocab) == 4
             ? Launch<4>(tokens, logprobs, logits, params, rows, vocab, stream)
             : Launch<1>(tokens, logprobs, logits, params, rows, vocab, stream);
}

}  // namespace kvstream::kernels
