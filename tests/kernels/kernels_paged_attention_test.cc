// GPU tests of the paged decode attention kernel against a float CPU reference
// (softmax(q K^T * scale) V through the block table), over every supported shape, each on the
// Hopper paths where the GPU has them and on the Ampere/Ada fallback paths (CodePaths::kFallback),
// which must match the Hopper paths bit for bit wherever no cluster merge is replaced.
// Without a usable GPU the binary prints why and exits 77 (CTest: skipped).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "kernels/paged_attention.h"

namespace kvstream::kernels {
namespace {

#define CUDA_OK(expr)                                                          \
  do {                                                                         \
    cudaError_t e_ = (expr);                                                   \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_);     \
  } while (0)

// What kAuto should take here: the Hopper paths on a GPU of compute capability >= 9.0 when the
// build holds sm_90 code, unless KVSTREAM_KERNEL_FALLBACK forces the fallback.
bool ExpectHopperPaths() {
#ifdef KVSTREAM_TEST_NO_SM90_CODE
  return false;  // no sm_90 code in this build (tests/kernels/CMakeLists.txt)
#endif
  const char* e = std::getenv("KVSTREAM_KERNEL_FALLBACK");
  if (e != nullptr && *e != '\0' && std::strcmp(e, "0") != 0) return false;
  int dev = 0, major = 0;
  return cudaGetDevice(&dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9;
}

uint16_t ToBits(float f, DType dt) { return dt == DType::kBF16 ? F32ToBf16(f) : F32ToF16(f); }
float FromBits(uint16_t h, DType dt) { return dt == DType::kBF16 ? Bf16ToF32(h) : F16ToF32(h); }

template <typename T>
struct DeviceBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DeviceBuf(size_t count) : n(count) {
    if (count && cudaMalloc(reinterpret_cast<void**>(&p), count * sizeof(T)) != cudaSuccess) p = nullptr;
  }
  ~DeviceBuf() {
    if (p) cudaFree(p);
  }
  DeviceBuf(const DeviceBuf&) = delete;
  DeviceBuf& operator=(const DeviceBuf&) = delete;
};

struct Shape {
  DType dtype;
  int head_dim;
  int block_size;
  int num_heads;
  int num_kv_heads;
  std::vector<int> context_lens;
  int num_splits = 0;  // 0 = planned
  bool host_lens = false;  // pass the lengths on the host too (uneven-batch planning)
};

std::string Describe(const Shape& s) {
  // (an ostringstream: GCC 12's -Wrestrict misfires on chains of string operator+)
  std::ostringstream o;
  o << DTypeName(s.dtype) << " d" << s.head_dim << " bs" << s.block_size << " h" << s.num_heads
    << "/" << s.num_kv_heads << " splits" << s.num_splits << " lens";
  for (int l : s.context_lens) o << " " << l;
  return o.str();
}

constexpr Schedule kSchedules[] = {Schedule::kAuto,       Schedule::kV2,        Schedule::kKernel,
                                   Schedule::kFused,      Schedule::kWideKernel, Schedule::kWideFused,
                                   Schedule::kCluster,    Schedule::kWideCluster};

// Runs every schedule, each with both prefetch variants (and kAuto), on one random instance and
// checks them against the CPU reference, and the variants of one schedule against each other
// (bit-identical). `ext_ws` (zero-filled once by the caller, PagedDecodeParams' contract): use
// that workspace instead of a fresh one, to test reuse across shapes.
void RunCase(const Shape& s, uint32_t seed, void* ext_ws = nullptr, size_t ext_ws_bytes = 0) {
  SCOPED_TRACE(Describe(s));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  const int num_seqs = int(s.context_lens.size());
  const int max_len = *std::max_element(s.context_lens.begin(), s.context_lens.end());
  const int max_blocks = std::max(1, (max_len + s.block_size - 1) / s.block_size) + 1;  // slack
  int needed = 0;
  for (int l : s.context_lens) needed += (l + s.block_size - 1) / s.block_size;
  const int num_blocks = needed + 7;  // unused blocks in between
  const int D = s.head_dim, H = s.num_heads, Hkv = s.num_kv_heads, bs = s.block_size;

  // Random non-contiguous block tables: a random permutation of the pool's ids.
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> table(size_t(num_seqs) * max_blocks, -1);
  int next = 0;
  for (int i = 0; i < num_seqs; ++i) {
    const int nb = (s.context_lens[i] + bs - 1) / bs;
    for (int j = 0; j < nb; ++j) table[size_t(i) * max_blocks + j] = perm[next++];
  }

  // KV pool: random values everywhere, NaN in the slots past each context inside its last block
  // (a real pool may hold anything there; the kernel must not let it leak).
  const size_t pool_elems = size_t(num_blocks) * 2 * Hkv * bs * D;
  std::vector<uint16_t> kv(pool_elems);
  for (auto& x : kv) x = ToBits(uni(rng), s.dtype);
  const uint16_t nan_bits = s.dtype == DType::kBF16 ? 0x7fc0 : 0x7e00;
  for (int i = 0; i < num_seqs; ++i) {
    const int len = s.context_lens[i];
    if (len % bs == 0) continue;
    const int blk = table[size_t(i) * max_blocks + len / bs];
    for (int kvi = 0; kvi < 2; ++kvi)
      for (int h = 0; h < Hkv; ++h)
        for (int slot = len % bs; slot < bs; ++slot)
          for (int d = 0; d < D; ++d)
            kv[(((size_t(blk) * 2 + kvi) * Hkv + h) * bs + slot) * D + d] = nan_bits;
  }
  std::vector<uint16_t> q(size_t(num_seqs) * H * D);
  for (auto& x : q) x = ToBits(uni(rng), s.dtype);
  const float scale = 1.f / std::sqrt(float(D));

  // CPU reference in float (double accumulation).
  std::vector<float> ref(size_t(num_seqs) * H * D, 0.f);
  const int group = H / Hkv;
  for (int i = 0; i < num_seqs; ++i) {
    const int len = s.context_lens[i];
    for (int h = 0; h < H; ++h) {
      const int kvh = h / group;
      std::vector<double> score(len);
      double mx = -INFINITY;
      for (int t = 0; t < len; ++t) {
        const int blk = table[size_t(i) * max_blocks + t / bs];
        const size_t kbase = (((size_t(blk) * 2 + 0) * Hkv + kvh) * bs + t % bs) * D;
        double dot = 0;
        for (int d = 0; d < D; ++d)
          dot += double(FromBits(q[(size_t(i) * H + h) * D + d], s.dtype)) *
                 FromBits(kv[kbase + d], s.dtype);
        score[t] = dot * scale;
        mx = std::max(mx, score[t]);
      }
      double sum = 0;
      std::vector<double> acc(D, 0.0);
      for (int t = 0; t < len; ++t) {
        const double p = std::exp(score[t] - mx);
        sum += p;
        const int blk = table[size_t(i) * max_blocks + t / bs];
        const size_t vbase = (((size_t(blk) * 2 + 1) * Hkv + kvh) * bs + t % bs) * D;
        for (int d = 0; d < D; ++d) acc[d] += p * FromBits(kv[vbase + d], s.dtype);
      }
      for (int d = 0; d < D; ++d)
        ref[(size_t(i) * H + h) * D + d] = len > 0 ? float(acc[d] / sum) : 0.f;
    }
  }

  DeviceBuf<uint16_t> d_kv(pool_elems), d_q(q.size()), d_out(q.size());
  DeviceBuf<int32_t> d_table(table.size()), d_lens(num_seqs);
  ASSERT_TRUE(d_kv.p && d_q.p && d_out.p && d_table.p && d_lens.p) << "cudaMalloc failed";
  CUDA_OK(cudaMemcpy(d_kv.p, kv.data(), kv.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_q.p, q.data(), q.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_table.p, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_lens.p, s.context_lens.data(), num_seqs * 4, cudaMemcpyHostToDevice));

  PagedDecodeParams p;
  p.out = d_out.p;
  p.q = d_q.p;
  p.kv_layer = d_kv.p;
  p.block_tables = d_table.p;
  p.context_lens = d_lens.p;
  p.num_seqs = num_seqs;
  p.num_heads = H;
  p.num_kv_heads = Hkv;
  p.head_dim = D;
  p.block_size = bs;
  p.max_blocks_per_seq = max_blocks;
  p.max_context_len = max_len;
  p.scale = scale;
  p.dtype = s.dtype;
  p.num_splits = s.num_splits;
  p.num_blocks = num_blocks;
  if (s.host_lens) {
    // The planner sees the lengths: an uneven batch gets more (shorter) splits than the plan
    // made for max_context_len alone, and the result is still exact.
    p.schedule = Schedule::kKernel;
    const int even = PagedDecodeNumSplits(p);
    p.host_context_lens = s.context_lens.data();
    EXPECT_GT(PagedDecodeNumSplits(p), even);
    p.schedule = Schedule::kAuto;
  }
  ASSERT_TRUE(PagedDecodeSupported(p));
  size_t ws_bytes = 0;
  for (Schedule sc : kSchedules) {
    PagedDecodeParams q = p;
    q.schedule = sc;
    ws_bytes = std::max(ws_bytes, PagedDecodeWorkspaceBytes(q));
  }
  DeviceBuf<char> own_ws(ext_ws ? 0 : ws_bytes);
  if (ext_ws) {
    ASSERT_GE(ext_ws_bytes, ws_bytes);
  }
  p.workspace = ext_ws ? ext_ws : own_ws.p;
  p.workspace_bytes = ext_ws ? ext_ws_bytes : ws_bytes;
  if (ws_bytes) {
    ASSERT_NE(p.workspace, nullptr);
    if (!ext_ws) CUDA_OK(cudaMemset(own_ws.p, 0, ws_bytes));
    // Too small a workspace is refused, nothing launched.
    PagedDecodeParams small = p;
    small.schedule = Schedule::kV2;
    small.workspace_bytes = PagedDecodeWorkspaceBytes(small);
    if (small.workspace_bytes > 0) {
      small.workspace_bytes -= 1;
      EXPECT_EQ(PagedDecodeAttention(small, nullptr), cudaErrorInvalidValue);
    }
  }
  if (s.num_splits > 0) {
    // A forced count is honoured up to the number of 16-token units (and 128), then evened out
    // so that no split is empty.
    const int units = std::max(1, (max_len + 15) / 16);
    const int per = (units + std::min({s.num_splits, units, 128}) - 1) / std::min({s.num_splits, units, 128});
    EXPECT_EQ(PagedDecodeNumSplits(p), (units + per - 1) / per);
  }

  // Every schedule, each with the 32-dim combine and (where it differs: > 8 splits, head >= 128)
  // the 128-dim one.
  std::vector<std::pair<Schedule, int>> runs;
  for (Schedule sc : kSchedules) {
    runs.push_back({sc, 0});
    PagedDecodeParams q = p;
    q.schedule = sc;
    if (D >= 128 && PagedDecodeNumSplits(q) > 8 && PagedDecodeClusterSize(q) == 1 &&
        PagedDecodeResolvedSchedule(q) != Schedule::kFused && PagedDecodeResolvedSchedule(q) != Schedule::kWideFused)
      runs.push_back({sc, 128});
  }
  for (auto [sc, combine_dims] : runs) {
  std::vector<uint16_t> hopper_out;  // the kAuto paths' output, for the fallback's comparison
  bool hopper_cluster = false;
  for (CodePaths paths : {CodePaths::kAuto, CodePaths::kFallback}) {
  SCOPED_TRACE("schedule " + std::to_string(int(sc)) + " combine_dims " + std::to_string(combine_dims) +
               (paths == CodePaths::kFallback ? " fallback paths" : " auto paths"));
  p.schedule = sc;
  p.combine_dims = combine_dims;
  p.code_paths = paths;
  const PagedDecodePlanInfo info = PagedDecodeDescribe(p);
  if (paths == CodePaths::kFallback) {
    EXPECT_FALSE(info.hopper_paths);
    EXPECT_EQ(info.cluster, 1);
    EXPECT_EQ(info.early_prefetch_units, 0);
  } else {
    EXPECT_EQ(info.hopper_paths, ExpectHopperPaths());
  }
  std::vector<std::vector<uint16_t>> outs;
  // (prefetch, distance, early prefetch): the last two run the early L2 prefetch before the
  // wait for the previous kernel (a hint; the same arithmetic).
  struct V {
    Prefetch pf;
    int dist;
    Prefetch early;
    int early_units = 0;
  };
  for (V v : {V{Prefetch::kOff, 1, Prefetch::kOff}, V{Prefetch::kOn, 1, Prefetch::kOff},
              V{Prefetch::kOn, 3, Prefetch::kOff}, V{Prefetch::kAuto, 1, Prefetch::kAuto},
              V{Prefetch::kOff, 1, Prefetch::kOn}, V{Prefetch::kOn, 1, Prefetch::kOn},
              V{Prefetch::kOff, 1, Prefetch::kOn, 2}, V{Prefetch::kOff, 1, Prefetch::kOn, 4}}) {
    p.prefetch = v.pf;
    p.prefetch_distance = v.dist;
    p.early_prefetch = v.early;
    p.early_prefetch_units = v.early_units;
    CUDA_OK(cudaMemset(d_out.p, 0xff, q.size() * 2));  // poison: NaN in both dtypes
    CUDA_OK(PagedDecodeAttention(p, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint16_t> out(q.size());
    CUDA_OK(cudaMemcpy(out.data(), d_out.p, out.size() * 2, cudaMemcpyDeviceToHost));
    outs.push_back(std::move(out));
  }
  p.early_prefetch = Prefetch::kAuto;
  p.early_prefetch_units = 0;
  // Tolerances: P is rounded to the KV type for the tensor-core product, then the output.
  const double atol = s.dtype == DType::kBF16 ? 2e-2 : 3e-3;
  const double rtol = s.dtype == DType::kBF16 ? 2e-2 : 5e-3;
  const std::vector<uint16_t>& out = outs[0];
  int bad = 0;
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double o = FromBits(out[i], s.dtype), r = ref[i];
    err2 += (o - r) * (o - r);
    ref2 += r * r;
    if (!(std::fabs(o - r) <= atol + rtol * std::fabs(r))) {
      if (++bad <= 5) {
        ADD_FAILURE() << "element " << i << " (seq " << i / (H * D) << " head " << (i / D) % H
                      << " dim " << i % D << "): got " << o << " want " << r;
      }
    }
  }
  EXPECT_EQ(bad, 0);
  if (ref2 > 0) {
    EXPECT_LT(std::sqrt(err2 / ref2), s.dtype == DType::kBF16 ? 1e-2 : 2e-3);
  }
  for (size_t k = 1; k < outs.size(); ++k)
    EXPECT_EQ(0, std::memcmp(outs[k].data(), out.data(), out.size() * 2))
        << "variant " << k << " differs from prefetch-off";
  if (paths == CodePaths::kAuto) {
    hopper_out = out;
    hopper_cluster = info.cluster > 1;
  } else if (!hopper_cluster) {
    // Same plan, same arithmetic: only PDL and the prefetch hints differ.
    EXPECT_EQ(0, std::memcmp(hopper_out.data(), out.data(), out.size() * 2))
        << "the fallback paths differ from the auto paths";
  }
  if (::testing::Test::HasFailure()) return;
  }
  p.code_paths = CodePaths::kAuto;
  }
  if (p.workspace && ws_bytes) {
    // Every completed launch leaves the fused combine's counters (the first 16 KiB) zero.
    std::vector<uint32_t> ctr(std::min<size_t>(ws_bytes, 16384) / 4);
    CUDA_OK(cudaMemcpy(ctr.data(), p.workspace, ctr.size() * 4, cudaMemcpyDeviceToHost));
    EXPECT_TRUE(std::all_of(ctr.begin(), ctr.end(), [](uint32_t x) { return x == 0; }))
        << "fused-combine counters not reset";
  }
}

TEST(SmallCase, F16Head128Gqa4) {
  RunCase({DType::kF16, 128, 16, 8, 2, {1, 37, 100}}, 1);
}

TEST(SmallCase, Bf16Head64Block32Split) {
  RunCase({DType::kBF16, 64, 32, 4, 1, {1, 250}, 5}, 2);
}

// More than 8 splits: the sliced combine kernel (<= 8 take the per-row one above).
TEST(SmallCase, F16Head256ManySplits) {
  RunCase({DType::kF16, 256, 16, 8, 2, {700, 5}, 40}, 3);
}

// The fused combine's last-CTA merge with many splits (16-warp CTAs, >= 16 units a split) and
// one workspace reused across shapes without a memset in between.
TEST(SmallCase, FusedManySplitsWorkspaceReuse) {
  const size_t bytes = size_t(8) << 20;
  DeviceBuf<char> ws(bytes);
  ASSERT_NE(ws.p, nullptr);
  CUDA_OK(cudaMemset(ws.p, 0, bytes));
  RunCase({DType::kF16, 128, 16, 28, 4, {3000}}, 4, ws.p, bytes);
  RunCase({DType::kBF16, 64, 32, 8, 2, {900, 1, 2000}, 0}, 5, ws.p, bytes);
  RunCase({DType::kF16, 128, 16, 28, 4, {3000}}, 4, ws.p, bytes);
}

// A qwen2.5-7b-shaped batch of 2 x 8k tokens for the plan queries only (dummy aligned
// pointers: nothing is launched).
PagedDecodeParams PlanOnlyParams() {
  PagedDecodeParams p;
  p.out = reinterpret_cast<void*>(uintptr_t(256));
  p.kv_layer = p.q = p.out;
  p.block_tables = p.context_lens = reinterpret_cast<const int32_t*>(uintptr_t(256));
  p.num_seqs = 2;
  p.num_heads = 28;
  p.num_kv_heads = 4;
  p.head_dim = 128;
  p.max_blocks_per_seq = 512;
  p.max_context_len = 8191;
  p.scale = 0.1f;
  return p;
}

// The cluster schedules really run as clusters (no silent fallback) on a GPU with the Hopper
// paths, where a head's splits fit one cluster the device can hold - 16 splits of 4-warp CTAs,
// and a split count that is not a power of two (5: a cluster of 8 with 3 CTAs that find no
// units) - fall back to the combine kernel where they do not (40 splits), and match the CPU
// reference in every case.
TEST(PagedDecode, ClusterMerge) {
  struct C {
    Schedule sc;
    int splits;
    int want_cluster;  // 0: any cluster > 1 is fine
  };
  for (C c : {C{Schedule::kCluster, 16, 16}, C{Schedule::kCluster, 5, 8}, C{Schedule::kCluster, 40, 1},
              C{Schedule::kWideCluster, 2, 2}, C{Schedule::kWideCluster, 3, 4}}) {
    PagedDecodeParams p = PlanOnlyParams();
    p.num_splits = c.splits;
    p.schedule = c.sc;
    SCOPED_TRACE("schedule " + std::to_string(int(c.sc)) + " splits " + std::to_string(c.splits));
    // Without the Hopper paths (KVSTREAM_KERNEL_FALLBACK, or a GPU before sm_90) no cluster runs.
    const int want = ExpectHopperPaths() ? c.want_cluster : 1;
    EXPECT_EQ(PagedDecodeClusterSize(p), want);
    EXPECT_EQ(PagedDecodeResolvedSchedule(p),
              want > 1 ? c.sc : (c.sc == Schedule::kCluster ? Schedule::kKernel : Schedule::kWideKernel));
    EXPECT_EQ(PagedDecodeWorkspaceBytes(p) == 0, want > 1);
    // The one-call description agrees with the per-field queries.
    const PagedDecodePlanInfo info = PagedDecodeDescribe(p);
    EXPECT_TRUE(info.supported);
    EXPECT_EQ(info.cluster, want);
    EXPECT_EQ(info.schedule, PagedDecodeResolvedSchedule(p));
    EXPECT_EQ(info.num_splits, PagedDecodeNumSplits(p));
    EXPECT_EQ(info.workspace_bytes, PagedDecodeWorkspaceBytes(p));
    EXPECT_EQ(info.warps_per_cta, c.sc == Schedule::kWideCluster ? 16 : 4);
    EXPECT_EQ(info.early_prefetch_units, 0);  // explicit schedule, early prefetch kAuto: off
    // The combine kernel that runs: none in a cluster, else the float4 rows kernel up to 8
    // splits and the 32-dim slice kernel above.
    EXPECT_EQ(info.combine_dims, want > 1 ? 0 : (info.num_splits <= 8 ? 4 : 32));
  }
  uint32_t seed = 900;
  for (DType dt : {DType::kF16, DType::kBF16})
    for (int splits : {2, 3, 5, 16, 40}) {
      RunCase({dt, 128, 16, 28, 4, {8191, 3000}, splits}, seed++);
      RunCase({dt, 64, 32, 8, 8, {4100}, splits}, seed++);
      RunCase({dt, 256, 16, 16, 2, {2000, 1, 0}, splits}, seed++);
      if (HasFatalFailure()) return;
    }
}

// The fallback paths asked for explicitly: no cluster, no early prefetch, the kernel-combine
// counterpart of a cluster schedule, whatever the GPU.
TEST(PagedDecode, FallbackPathsPlan) {
  PagedDecodeParams p = PlanOnlyParams();
  p.num_splits = 16;
  p.num_blocks = 1024;
  p.early_prefetch = Prefetch::kOn;
  p.code_paths = CodePaths::kFallback;
  for (Schedule sc : {Schedule::kCluster, Schedule::kWideCluster, Schedule::kKernel}) {
    p.schedule = sc;
    const PagedDecodePlanInfo info = PagedDecodeDescribe(p);
    EXPECT_FALSE(info.hopper_paths);
    EXPECT_EQ(info.cluster, 1);
    EXPECT_EQ(info.early_prefetch_units, 0);
    EXPECT_EQ(info.schedule, sc == Schedule::kWideCluster ? Schedule::kWideKernel : Schedule::kKernel);
  }
  p.code_paths = CodePaths::kAuto;
  p.schedule = Schedule::kCluster;
  EXPECT_EQ(PagedDecodeDescribe(p).hopper_paths, ExpectHopperPaths());
}

// Every dtype x head size x block size x group (1, 4, 7, 8, 16) on lengths 1, not multiples of
// the block size, multiples of it, and 0.
TEST(PagedDecode, AllShapes) {
  uint32_t seed = 100;
  for (DType dt : {DType::kF16, DType::kBF16})
    for (int d : {64, 128, 256})
      for (int bs : {16, 32})
        for (auto [h, hkv] : {std::pair{3, 3}, {8, 2}, {14, 2}, {16, 2}, {16, 1}}) {
          RunCase({dt, d, bs, h, hkv, {1, 17, 64, 95, 0, 33}}, seed++);
          if (HasFatalFailure()) return;
        }
}

// Long contexts split across CTAs (planned, forced counts, an uneven last split), with a
// sequence longer than the others (many splits of it, short sequences with empty splits).
TEST(PagedDecode, LongSplitContexts) {
  uint32_t seed = 500;
  for (DType dt : {DType::kF16, DType::kBF16})
    for (int splits : {0, 1, 3, 16, 128}) {
      RunCase({dt, 128, 16, 32, 8, {4099, 1, 77}, splits}, seed++);
      RunCase({dt, 128, 32, 28, 4, {8191}, splits}, seed++);
      if (HasFatalFailure()) return;
    }
  RunCase({DType::kF16, 256, 16, 8, 1, {6000, 300}}, seed++);
  RunCase({DType::kBF16, 64, 32, 32, 32, {20000}}, seed++);
}

// A batch of short streams plus one long prompt (a landed prefill joining the decode step),
// planned from the host lengths.
TEST(PagedDecode, UnevenBatchPlannedFromHostLengths) {
  std::vector<int> lens(16, 1000);
  lens.push_back(8000);
  lens[3] = 0;
  lens[5] = 1;
  Shape s{DType::kF16, 128, 16, 32, 8, lens};
  s.host_lens = true;
  RunCase(s, 77);
  s.dtype = DType::kBF16;
  s.num_heads = 8;  // MHA
  RunCase(s, 78);
}

// Many sequences, random lengths: the many-waves plan (one split per sequence).
TEST(PagedDecode, RandomBatch) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> len(0, 1500);
  for (int rep = 0; rep < 4; ++rep) {
    std::vector<int> lens(48);
    for (auto& l : lens) l = len(rng);
    RunCase({rep % 2 ? DType::kBF16 : DType::kF16, 128, rep < 2 ? 16 : 32, 32, 8, lens}, 900 + rep);
  }
}

}  // namespace
}  // namespace kvstream::kernels

int main(int argc, char** argv) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    std::printf("SKIP: no usable CUDA GPU (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess && prop.major < 8) {
    std::printf("SKIP: %s is sm_%d%d; the kernel is built for sm_80 and later\n", prop.name, prop.major,
                prop.minor);
    return 77;
  }
  if (argc > 1 && std::strcmp(argv[1], "--probe-gpu") == 0) return 0;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
