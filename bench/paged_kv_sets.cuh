// What the paged decode-attention benches (decode_attention, decode_under_load) share: the
// model shapes, and the KV sets of one shape - one pool of random fp16 KV per set, read through
// a random permutation of its blocks as the block tables - with the kernel's parameters for
// each set, so that launches cycling through the sets read memory the L2 does not hold.
// Kept apart from bench_util.cuh, which benches without the attention kernels include too.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.cuh"
#include "kernels/paged_attention.h"

namespace kvstream::bench {

struct Model {
  const char* name;
  int heads;
  int kv_heads;
};

// The models of `all` whose name occurs in `names` (e.g. "llama-3-8b,qwen2.5-7b"), in the
// order of `all`.
inline std::vector<Model> ModelsNamedIn(const std::vector<Model>& all, const std::string& names) {
  std::vector<Model> keep;
  for (const Model& x : all)
    if (names.find(x.name) != std::string::npos) keep.push_back(x);
  return keep;
}

// One KV set: `batch` sequences of `ctx` tokens each, fp16 K and V of `kv_heads` x `head_dim`
// per token in blocks of `block_size` tokens, and the query/output of `heads` x `head_dim`.
struct KvSetShape {
  int batch = 0, ctx = 0, heads = 0, kv_heads = 0, head_dim = 0, block_size = 0;
  size_t blocks_per_seq = 0;  // ctx / block_size
  size_t set_blocks = 0;      // batch * blocks_per_seq
  size_t block_bytes = 0;     // K and V of one block
  size_t set_bytes = 0;       // set_blocks * block_bytes
  size_t qn = 0;              // elements of q (and of out): batch * heads * head_dim
};

inline KvSetShape MakeKvSetShape(const Model& m, int batch, int ctx, int head_dim, int block_size) {
  KvSetShape s;
  s.batch = batch;
  s.ctx = ctx;
  s.heads = m.heads;
  s.kv_heads = m.kv_heads;
  s.head_dim = head_dim;
  s.block_size = block_size;
  s.blocks_per_seq = size_t(ctx) / block_size;
  s.set_blocks = size_t(batch) * s.blocks_per_seq;
  s.block_bytes = size_t(2) * m.kv_heads * block_size * head_dim * 2;
  s.set_bytes = s.set_blocks * s.block_bytes;
  s.qn = size_t(batch) * m.heads * head_dim;
  return s;
}

// The schedules' names in the benches' flags and JSON ("auto", "v2", "kernel", "fused",
// "wide_kernel", "wide_fused", "cluster", "wide_cluster"), and back (false: no such name).
inline const char* ScheduleName(kernels::Schedule s) {
  using kernels::Schedule;
  switch (s) {
    case Schedule::kAuto: return "auto";
    case Schedule::kV2: return "v2";
    case Schedule::kKernel: return "kernel";
    case Schedule::kFused: return "fused";
    case Schedule::kWideKernel: return "wide_kernel";
    case Schedule::kWideFused: return "wide_fused";
    case Schedule::kCluster: return "cluster";
    case Schedule::kWideCluster: return "wide_cluster";
  }
  return "?";
}

inline bool ParseSchedule(const std::string& n, kernels::Schedule* s) {
  using kernels::Schedule;
  for (Schedule x : {Schedule::kAuto, Schedule::kV2, Schedule::kKernel, Schedule::kFused,
                     Schedule::kWideKernel, Schedule::kWideFused, Schedule::kCluster,
                     Schedule::kWideCluster})
    if (n == ScheduleName(x)) {
      *s = x;
      return true;
    }
  return false;
}

// The paged-read ceiling: reads exactly the K and V tiles one decode call reads (head_dim 128,
// 16-token units, block size 16: every (sequence, KV head, block) has one 4 KiB K tile and one
// V tile, at the pool layout of kernels/paged_attention.h), through the block tables, and
// nothing else - no math, no merge. Tile t = ((seq * kv_heads + head) * blocks_per_seq + block)
// * 2 + (0: K, 1: V); warp w of the grid takes the contiguous tile range [w * T / W,
// (w + 1) * T / W) and keeps kDepth tiles' loads in flight (each lane 8 x 16 bytes per tile,
// 512 contiguous bytes per warp instruction). Launch it with 512-thread CTAs, as many as fit
// at once (one wave, like the attention kernel's split plan), so what it measures is what a
// paged read of these bytes can reach, against the streaming read of the same bytes as one
// contiguous range. The words read are folded into one word per thread stored only if it
// matches an impossible value (no dead code).
template <int kDepth>
static __global__ void __launch_bounds__(512) GatherTilesRead(const uint4* __restrict__ pool,
                                                              const int32_t* __restrict__ tables,
                                                              int blocks_per_seq, int kv_heads,
                                                              long tiles, uint32_t* sink) {
  constexpr int kTile16 = 16 * 128 * 2 / 16;  // 16-byte words per tile (256)
  const long warps = long(gridDim.x) * (blockDim.x / 32);
  const long w = long(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const long t_begin = w * tiles / warps, t_end = (w + 1) * tiles / warps;
  const size_t head16 = kTile16, v16 = size_t(kv_heads) * kTile16, block16 = 2 * v16;
  // Lane k < kDepth looks up the block of the round's k-th tile, one round ahead (as the
  // attention kernel reads its next block id one unit ahead), so that no table load stands in
  // front of a round's tile loads.
  auto lookup = [&](long t0) -> const uint4* {
    const long t = t0 + lane;
    if (lane >= kDepth || t >= t_end) return pool;
    const long rest = t >> 1;
    const int blk = int(rest % blocks_per_seq);
    const long sh = rest / blocks_per_seq;
    const int head = int(sh % kv_heads);
    const long seq = sh / kv_heads;
    return pool + size_t(__ldg(tables + seq * blocks_per_seq + blk)) * block16 + size_t(t & 1) * v16 +
           size_t(head) * head16;
  };
  uint32_t acc = 0;
  const uint4* next = lookup(t_begin);
  for (long t0 = t_begin; t0 < t_end; t0 += kDepth) {
    const uint4* mine = next;
    next = lookup(t0 + kDepth);
    uint4 r[kDepth][kTile16 / 32];
#pragma unroll
    for (int k = 0; k < kDepth; ++k) {
      const uint4* tp = reinterpret_cast<const uint4*>(
          __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(mine), k));
#pragma unroll
      for (int j = 0; j < kTile16 / 32; ++j)
        r[k][j] = t0 + k < t_end ? __ldg(tp + lane + 32 * j) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < kDepth; ++k)
#pragma unroll
      for (int j = 0; j < kTile16 / 32; ++j) acc ^= r[k][j].x ^ r[k][j].y ^ r[k][j].z ^ r[k][j].w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

// The device inputs of `n_sets` KV sets of one shape, allocated in this order and freed on
// destruction (a CUDA error is fatal, CK):
//   pool:   n_sets * set_bytes of random fp16 (FillRandomHalf, seed batch * 131 + ctx); set s
//           starts at s * set_bytes;
//   tables: per set, set 0 first, a random permutation of its set_blocks blocks (one
//           std::mt19937 seeded batch * 7919 + ctx + kv_heads, std::shuffle) - or, with
//           `sequential`, the identity (block j of the pool is the set's j-th block); sequence
//           b's blocks at b * blocks_per_seq;
//   lens:   ctx for every sequence;
//   q:      random fp16 (seed 99); out: not initialized.
// The random fills are queued on `st` (the pool's on sms * 8 blocks of 512 threads); the caller
// synchronizes `st` before other streams read them. The tables and lengths are copied
// synchronously. SetWorkspace adds a workspace, freed first.
class KvSets {
 public:
  KvSets(const KvSetShape& shape, int n_sets, cudaStream_t st, int sms, bool sequential = false)
      : shape_(shape), n_sets_(n_sets) {
    const KvSetShape& s = shape_;
    CK(cudaMalloc(&pool_, s.set_bytes * n_sets));
    FillRandomHalf<<<sms * 8, 512, 0, st>>>(pool_, s.set_bytes * n_sets / 2, uint64_t(s.batch) * 131 + s.ctx);
    CK(cudaGetLastError());
    std::mt19937 rng(uint32_t(s.batch * 7919 + s.ctx + s.kv_heads));
    std::vector<int32_t> tables(size_t(n_sets) * s.set_blocks);
    for (int i = 0; i < n_sets; ++i) {
      std::vector<int32_t> perm(s.set_blocks);
      std::iota(perm.begin(), perm.end(), 0);
      if (!sequential) std::shuffle(perm.begin(), perm.end(), rng);
      std::copy(perm.begin(), perm.end(), tables.begin() + size_t(i) * s.set_blocks);
    }
    CK(cudaMalloc(&tables_, tables.size() * 4));
    CK(cudaMemcpy(tables_, tables.data(), tables.size() * 4, cudaMemcpyHostToDevice));
    std::vector<int32_t> lens(s.batch, s.ctx);
    CK(cudaMalloc(&lens_, s.batch * 4));
    CK(cudaMemcpy(lens_, lens.data(), s.batch * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&q_, s.qn * 2));
    CK(cudaMalloc(&out_, s.qn * 2));
    FillRandomHalf<<<64, 256, 0, st>>>(q_, s.qn, 99);
    CK(cudaGetLastError());
  }
  ~KvSets() {
    if (ws_) CK(cudaFree(ws_));
    CK(cudaFree(pool_));
    CK(cudaFree(tables_));
    CK(cudaFree(lens_));
    CK(cudaFree(q_));
    CK(cudaFree(out_));
  }
  KvSets(const KvSets&) = delete;
  KvSets& operator=(const KvSets&) = delete;

  // Set 0 with every field the shape fixes: out, q, the shape, scale 1/sqrt(head_dim), fp16,
  // the lengths, pool and tables; the others (num_blocks, schedule, prefetch, splits,
  // workspace, ...) as PagedDecodeParams leaves them.
  kernels::PagedDecodeParams Params() const {
    const KvSetShape& s = shape_;
    kernels::PagedDecodeParams p;
    p.out = out_;
    p.q = q_;
    p.num_seqs = s.batch;
    p.num_heads = s.heads;
    p.num_kv_heads = s.kv_heads;
    p.head_dim = s.head_dim;
    p.block_size = s.block_size;
    p.max_blocks_per_seq = int(s.blocks_per_seq);
    p.max_context_len = s.ctx;
    p.scale = 1.f / std::sqrt(float(s.head_dim));
    p.dtype = DType::kF16;
    p.context_lens = lens_;
    p.kv_layer = pool_;
    p.block_tables = tables_;
    return p;
  }

  // `p` reading set `s` (its pool and its block tables) instead.
  kernels::PagedDecodeParams ForSet(kernels::PagedDecodeParams p, int s) const {
    p.kv_layer = reinterpret_cast<const char*>(pool_) + size_t(s) * shape_.set_bytes;
    p.block_tables = tables_ + size_t(s) * shape_.set_blocks;
    return p;
  }

  // Allocates a workspace of `bytes` (none when 0), zero-filled (the launcher's contract: once,
  // before its first use), and sets it into *p. Call once.
  void SetWorkspace(kernels::PagedDecodeParams* p, size_t bytes) {
    if (bytes) {
      CK(cudaMalloc(&ws_, bytes));
      CK(cudaMemset(ws_, 0, bytes));
    }
    p->workspace = ws_;
    p->workspace_bytes = bytes;
  }

  // Set `s`'s block tables ([batch][blocks_per_seq]).
  const int32_t* tables(int s) const { return tables_ + size_t(s) * shape_.set_blocks; }
  const KvSetShape& shape() const { return shape_; }
  int n_sets() const { return n_sets_; }
  const __half* pool() const { return pool_; }
  __half* out() const { return out_; }

 private:
  KvSetShape shape_;
  int n_sets_;
  __half* pool_ = nullptr;
  int32_t* tables_ = nullptr;
  int32_t* lens_ = nullptr;
  __half* q_ = nullptr;
  __half* out_ = nullptr;
  void* ws_ = nullptr;
};

}  // namespace kvstream::bench
