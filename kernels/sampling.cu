#include "kernels/sampling.h"

#include <climits>

#include "common/sampling_math.h"

namespace kvstream::kernels {
namespace {

namespace sm = kvstream::sampling;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 256;        // radix digit of 8 bits
constexpr int kMaxCollect = 256;  // top-N candidates gathered at once
constexpr unsigned kFull = 0xFFFFFFFFu;
using u64 = unsigned long long;

struct Shared {
  u64 hist[kBins];
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

struct CountAtLeast {
  u64 target;
  __device__ bool operator()(u64 f) const { return f >= target; }
};
struct TopPMass {
  u64 total;
  float top_p;
  __device__ bool operator()(u64 f) const { return sm::TopPReached(f, total, top_p); }
};

// The largest key t >= floor with cond(F(t)), F(t) = sum over the row's i with
// key_i >= t of (kMass ? weight_i : 1); floor when no t qualifies. cond must be monotone (true
// from some F on). Four passes over the row, one per 8-bit digit from the top: a histogram
// of the candidates (keys agreeing with the digits chosen so far), then the warp 0 picks the
// highest digit whose suffix sum qualifies.
template <bool kMass, class Cond>
__device__ uint32_t RadixSelect(Shared& s, const float* row, int vocab, float max_logit,
                                float inv_t, uint32_t floor, Cond cond) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint32_t prefix = 0;
  u64 above = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < kBins; b += kThreads) s.hist[b] = 0;
    __syncthreads();
    const uint32_t hi_mask = shift == 24 ? 0u : (0xFFFFFFFFu << (shift + 8));
    for (int i0 = 0; i0 < vocab; i0 += kThreads) {
      const int i = i0 + int(threadIdx.x);
      int bin = kBins;  // not a candidate
      u64 v = 0;
      if (i < vocab) {
        const float z = row[i];
        const uint32_t key = sm::SortKey(z);
        if (key >= floor && (key & hi_mask) == (prefix & hi_mask)) {
          v = kMass ? sm::SampleWeight(z, max_logit, inv_t) : 1;
          if (v != 0) bin = int((key >> shift) & 0xFFu);
        }
      }
      const unsigned peers = __match_any_sync(kFull, bin);
      if (bin < kBins) {
        // v <= 2^31: the two 16-bit halves' sums over <= 32 lanes fit 32 bits.
        const unsigned lo = __reduce_add_sync(peers, unsigned(v & 0xFFFFu));
        const unsigned hi = __reduce_add_sync(peers, unsigned(v >> 16));
        if (lane == __ffs(peers) - 1) atomicAdd(&s.hist[bin], (u64(hi) << 16) + u64(lo));
      }
    }
    __syncthreads();
    if (warp == 0) {
      u64 h[8], local = 0;
      for (int j = 0; j < 8; ++j) {
        h[j] = s.hist[lane * 8 + j];
        local += h[j];
      }
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
    __syncthreads();
    const bool none = s.sel_found < 0;
    prefix = s.sel_prefix;
    above = s.sel_above;
    __syncthreads();
    if (none) return floor;
  }
  return prefix < floor ? floor : prefix;
}

// The first kept index (in index order) whose running weight exceeds the draw point. Warp w
// owns the contiguous indices [w * seg, (w + 1) * seg), read 32 at a time; the sums of those
// 32-wide steps go to step_sums so that only one step is read again.
__device__ int Draw(Shared& s, u64* step_sums, const float* row, int vocab, float max_logit,
                    float inv_t, uint32_t t, u64 min_w, uint32_t u24) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int steps = (vocab + kThreads - 1) / kThreads;
  const int seg = steps * 32;
  auto weight = [&](int i) -> u64 {
    if (i >= vocab) return 0;
    const float z = row[i];
    if (sm::SortKey(z) < t) return 0;
    const u64 w = sm::SampleWeight(z, max_logit, inv_t);
    return w >= min_w ? w : 0;
  };
  u64 warp_total = 0;
  for (int j = 0; j < steps; ++j) {
    const u64 sum = WarpSumU(weight(warp * seg + j * 32 + lane));
    if (lane == 0) step_sums[warp * steps + j] = sum;
    warp_total += sum;
  }
  if (lane == 0) s.red_u[warp] = warp_total;
  __syncthreads();
  if (warp == 0) {
    const u64 mine = s.red_u[lane];
    u64 incl = mine;  // inclusive prefix over warps in index order
    for (int o = 1; o < 32; o <<= 1) {
      const u64 x = __shfl_up_sync(kFull, incl, o);
      if (lane >= o) incl += x;
    }
    const u64 total = __shfl_sync(kFull, incl, 31);
    const u64 r = sm::DrawPoint(total, u24);
    const unsigned hit = __ballot_sync(kFull, incl > r);
    const int w = __ffs(hit) - 1;  // total > r: some warp
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
    const u64 v = weight(w * seg + step * 32 + lane);
    u64 c = v;
    for (int o = 1; o < 32; o <<= 1) {
      const u64 x = __shfl_up_sync(kFull, c, o);
      if (lane >= o) c += x;
    }
    const unsigned h = __ballot_sync(kFull, before + c > r);
    if (lane == 0) s.token = w * seg + step * 32 + (__ffs(h) - 1);
  }
  __syncthreads();
  const int token = s.token;
  __syncthreads();
  return token;
}

// The top n (key descending, index ascending) of the row into ids (n <= kSampleMaxTop).
__device__ void TopN(Shared& s, const float* row, int vocab, int n, int* ids) {
  const uint32_t tn = RadixSelect<false>(s, row, vocab, 0.f, 0.f, 0u, CountAtLeast{u64(n)});
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

__global__ void __launch_bounds__(kThreads)
    SampleKernel(int32_t* tokens, SampleLogprobs* logprobs, const float* logits,
                 const SampleParams* params, int vocab) {
  __shared__ Shared s;
  extern __shared__ u64 step_sums[];
  const float* row = logits + size_t(blockIdx.x) * vocab;
  const SampleParams p = params[blockIdx.x];

  float bv = -INFINITY;
  int bi = INT_MAX;
  for (int j = threadIdx.x; j < vocab; j += kThreads) {
    const float v = row[j];
    if (Better(v, j, bv, bi)) {
      bv = v;
      bi = j;
    }
  }
  BlockArgmax(s, bv, bi);
  const int greedy_token = bi == INT_MAX ? 0 : bi;
  int token = greedy_token;
  if (p.inv_temperature > 0 && bi != INT_MAX && sm::IsFinite(bv)) {
    const float m = bv, inv_t = p.inv_temperature;
    uint32_t t = 0;
    if (p.top_k > 0 && p.top_k < vocab)
      t = RadixSelect<false>(s, row, vocab, m, inv_t, 0u, CountAtLeast{u64(p.top_k)});
    if (p.top_p < 1.0f) {
      u64 mass = 0;
      for (int j = threadIdx.x; j < vocab; j += kThreads) {
        const float z = row[j];
        if (sm::SortKey(z) >= t) mass += sm::SampleWeight(z, m, inv_t);
      }
      const u64 total = BlockSumU(s, mass);
      t = RadixSelect<true>(s, row, vocab, m, inv_t, t, TopPMass{total, p.top_p});
    }
    token = Draw(s, step_sums, row, vocab, m, inv_t, t, p.min_weight,
                 sm::PhiloxUniform24(p.seed, p.token_index));
  }
  if (threadIdx.x == 0) tokens[blockIdx.x] = token;
  if (p.top_logprobs < 0 || logprobs == nullptr) return;

  float e = 0;
  for (int j = threadIdx.x; j < vocab; j += kThreads) {
    const float z = row[j];
    if (!sm::IsNan(z)) e += expf(z - bv);
  }
  const float log_z = bv + logf(BlockSumF(s, e));
  SampleLogprobs& out = logprobs[blockIdx.x];
  if (threadIdx.x == 0) out.logprob = row[token] - log_z;
  const int n = min(p.top_logprobs, min(kSampleMaxTop, vocab));
  if (n == 0) return;
  __shared__ int ids[kSampleMaxTop];
  TopN(s, row, vocab, n, ids);
  __syncthreads();
  if (threadIdx.x < n) {
    out.top_ids[threadIdx.x] = ids[threadIdx.x];
    out.top_logprobs[threadIdx.x] = row[ids[threadIdx.x]] - log_z;
  }
}

}  // namespace

cudaError_t SampleRows(int32_t* tokens, SampleLogprobs* logprobs, const float* logits,
                       const SampleParams* params, int rows, int vocab, cudaStream_t stream) {
  if (rows < 0 || vocab <= 0 || !tokens || !logits || !params) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const size_t smem = size_t(kWarps) * size_t((vocab + kThreads - 1) / kThreads) * sizeof(u64);
  if (smem + sizeof(Shared) > 200 * 1024) return cudaErrorInvalidValue;
  if (smem > 32 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(
        SampleKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) return e;
  }
  SampleKernel<<<rows, kThreads, smem, stream>>>(tokens, logprobs, logits, params, vocab);
  return cudaGetLastError();
}

}  // namespace kvstream::kernels
