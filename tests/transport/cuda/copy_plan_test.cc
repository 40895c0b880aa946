// CPU-only: the cuda_ipc write planner (validation, coalescing, overlap detection), the scatter
// kernel's launch shape, the copy-path choice and the pinned run-table ring, plus batched
// notifications on the control socket.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "transport/cuda/control_socket.h"
#include "transport/cuda/copy_plan.h"

namespace kvstream::transport::cuda {
namespace {

constexpr uint64_t kL = 0x10000000, kR = 0x70000000;  // fake local / remote bases

TEST(CopyPlanner, CoalescesRunsContiguousOnBothSidesOnly) {
  CopyPlanner p;
  // 0+1 contiguous on both sides; 2 contiguous locally but not remotely; 3 empty; 4 joins 2.
  std::vector<CopyOp> ops = {{0, 0, 64}, {64, 64, 64}, {128, 512, 32}, {999, 999, 0}, {160, 544, 16}};
  ASSERT_TRUE(p.Build(ops, kL, 4096, kR, 4096).ok());
  ASSERT_EQ(p.runs().size(), 2u);
  EXPECT_EQ(p.runs()[0].src, kL);
  EXPECT_EQ(p.runs()[0].dst, kR);
  EXPECT_EQ(p.runs()[0].length, 128u);
  EXPECT_EQ(p.runs()[1].src, kL + 128);
  EXPECT_EQ(p.runs()[1].dst, kR + 512);
  EXPECT_EQ(p.runs()[1].length, 48u);
  EXPECT_EQ(p.bytes(), 176u);
  EXPECT_TRUE(p.disjoint());
}

TEST(CopyPlanner, RefusesOpsOutsideEitherRegionAndNamesTheOp) {
  CopyPlanner p;
  std::vector<CopyOp> ops = {{0, 0, 16}, {4090, 0, 16}};
  Status s = p.Build(ops, kL, 4096, kR, 1 << 20);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("op 1"), std::string::npos) << s.ToString();
  ops = {{0, (1 << 20) - 8, 16}};
  EXPECT_EQ(p.Build(ops, kL, 4096, kR, 1 << 20).code(), StatusCode::kInvalidArgument);
  // Overflowing offsets must not wrap around the checks.
  ops = {{~0ull - 4, 0, 16}};
  EXPECT_EQ(p.Build(ops, kL, 4096, kR, 4096).code(), StatusCode::kInvalidArgument);
  ops = {{0, 8, ~0ull}};
  EXPECT_EQ(p.Build(ops, kL, 4096, kR, 4096).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(p.runs().empty());
}

// Overlap detection against a brute-force check, over sorted, shuffled and overlapping plans.
TEST(CopyPlanner, DisjointIsExact) {
  std::mt19937_64 rng(7);
  CopyPlanner p;
  for (int trial = 0; trial < 2000; ++trial) {
    const int n = 1 + int(rng() % 12);
    std::vector<CopyOp> ops;
    for (int i = 0; i < n; ++i) {
      // Blocks of 64 B at random slots of a 32-slot pool, sometimes with odd lengths/offsets.
      uint64_t dst = (rng() % 32) * 64 + ((trial % 5 == 0) ? rng() % 48 : 0);
      uint64_t len = (trial % 3 == 0) ? 1 + rng() % 100 : 64;
      ops.push_back({uint64_t(i) * 4096, dst, len});  // locally never contiguous
    }
    if (trial % 2 == 0) {
      std::sort(ops.begin(), ops.end(),
                [](const CopyOp& a, const CopyOp& b) { return a.remote_offset < b.remote_offset; });
    }
    ASSERT_TRUE(p.Build(ops, kL, 1 << 20, kR, 1 << 20).ok());
    bool overlap = false;
    for (int i = 0; i < n; ++i) {
      for (int j = i + 1; j < n; ++j) {
        const CopyOp &a = ops[i], &b = ops[j];
        if (a.remote_offset < b.remote_offset + b.length && b.remote_offset < a.remote_offset + a.length) {
          overlap = true;
        }
      }
    }
    ASSERT_EQ(p.disjoint(), !overlap) << "trial " << trial;
  }
}

// Paged-pool plans (hundreds of shuffled blocks): the granule bitmap and, for spans too wide for
// it, the sort must both find a single overlapping block, and only then.
TEST(CopyPlanner, DisjointIsExactForLargeShuffledPlans) {
  std::mt19937_64 rng(11);
  CopyPlanner p;
  for (uint64_t spread : {uint64_t(1), uint64_t(1) << 12}) {  // pool slots x1 or x4096 apart
    for (int trial = 0; trial < 40; ++trial) {
      constexpr uint64_t kBlock = 64 << 10;
      std::vector<uint64_t> slots(512);
      for (uint64_t i = 0; i < slots.size(); ++i) slots[i] = i * spread;
      std::shuffle(slots.begin(), slots.end(), rng);
      slots.resize(256);
      std::vector<CopyOp> ops;
      for (uint64_t i = 0; i < slots.size(); ++i) ops.push_back({i * 2 * kBlock, slots[i] * kBlock, kBlock});
      const int kind = trial % 4;  // 0: disjoint, 1: duplicate block, 2: half-block overlap, 3: touching
      if (kind == 1) ops[200].remote_offset = ops[17].remote_offset;
      if (kind == 2) ops[200].remote_offset = ops[17].remote_offset + kBlock / 2;
      if (kind == 3) ops[200].remote_offset = ops[17].remote_offset + kBlock;  // may hit a neighbour
      const uint64_t remote_len = 512 * spread * kBlock + 2 * kBlock;
      ASSERT_TRUE(p.Build(ops, kL, 1ull << 40, kR, remote_len).ok());
      bool overlap = false;
      std::vector<std::pair<uint64_t, uint64_t>> iv;
      for (const CopyOp& o : ops) iv.push_back({o.remote_offset, o.remote_offset + o.length});
      std::sort(iv.begin(), iv.end());
      for (size_t i = 1; i < iv.size(); ++i) overlap |= iv[i - 1].second > iv[i].first;
      ASSERT_EQ(p.disjoint(), !overlap) << "spread " << spread << " trial " << trial;
      if (kind == 1 || kind == 2) {
        ASSERT_FALSE(p.disjoint());
      }
    }
  }
}

// The block planner: paged writes become unit-index pairs; what it cannot express is left to
// CopyPlanner (fits() false) and bad ops are refused exactly like CopyPlanner refuses them.
TEST(BlockPlanner, ShuffledBlocksBecomeUnitPairsInRequestOrder) {
  constexpr uint64_t kB = 64 << 10;
  std::mt19937_64 rng(21);
  std::vector<uint64_t> slots(2048);
  for (uint64_t i = 0; i < slots.size(); ++i) slots[i] = i;
  std::shuffle(slots.begin(), slots.end(), rng);
  std::vector<CopyOp> ops;
  for (uint64_t i = 0; i < 1024; ++i) ops.push_back({i * kB, slots[i] * kB, kB});
  BlockPlanner b;
  CopyPlanner c;
  ASSERT_TRUE(b.Build(ops, kL, 1024 * kB, kR, 2048 * kB, 1 << 16).ok());
  ASSERT_TRUE(c.Build(ops, kL, 1024 * kB, kR, 2048 * kB).ok());
  ASSERT_TRUE(b.fits());
  EXPECT_EQ(b.unit_bytes(), kB);
  EXPECT_EQ(b.bytes(), 1024 * kB);
  EXPECT_EQ(b.runs(), c.runs().size());
  ASSERT_EQ(b.entries().size(), 1024u);
  for (uint64_t i = 0; i < 1024; ++i) {
    EXPECT_EQ(b.entries()[i].src, i);
    EXPECT_EQ(b.entries()[i].dst, slots[i]);
  }
  // Fewer units allowed than the write has: not this form.
  ASSERT_TRUE(b.Build(ops, kL, 1024 * kB, kR, 2048 * kB, 1000).ok());
  EXPECT_FALSE(b.fits());
}

TEST(BlockPlanner, CoalescedAndUnevenOpsExpandIntoTheLargestCommonUnit) {
  // Ops of 2, 1 and 3 blocks of 48 KiB (not a power of two): the unit is 16 KiB, 3 per block.
  constexpr uint64_t kB = 48 << 10, kU = 16 << 10;
  std::vector<CopyOp> ops = {{0, 10 * kB, 2 * kB}, {2 * kB, 3 * kB, kB}, {3 * kB, 20 * kB, 3 * kB},
                             {6 * kB, 0, 0}};
  BlockPlanner b;
  CopyPlanner c;
  ASSERT_TRUE(b.Build(ops, kL, 64 * kB, kR, 64 * kB, 1 << 16).ok());
  ASSERT_TRUE(c.Build(ops, kL, 64 * kB, kR, 64 * kB).ok());
  ASSERT_TRUE(b.fits());
  EXPECT_EQ(b.unit_bytes(), kU);
  EXPECT_EQ(b.bytes(), 6 * kB);
  EXPECT_EQ(b.runs(), c.runs().size());
  ASSERT_EQ(b.entries().size(), 18u);
  // Every byte maps where CopyPlanner's runs put it.
  std::vector<std::pair<uint64_t, uint64_t>> want, got;
  for (const CopyRun& r : c.runs()) {
    for (uint64_t o = 0; o < r.length; o += kU) want.push_back({r.src - kL + o, r.dst - kR + o});
  }
  for (const BlockEntry& e : b.entries()) got.push_back({e.src * kU, e.dst * kU});
  EXPECT_EQ(got, want);
}

TEST(BlockPlanner, LeavesOverlapMisalignmentAndHugeRegionsToCopyPlanner) {
  constexpr uint64_t kB = 4096;
  BlockPlanner b;
  // Two ops into the same destination block.
  std::vector<CopyOp> ops = {{0, 5 * kB, kB}, {kB, 7 * kB, kB}, {2 * kB, 5 * kB, kB}};
  ASSERT_TRUE(b.Build(ops, kL, 64 * kB, kR, 64 * kB, 1 << 16).ok());
  EXPECT_FALSE(b.fits());
  // The bitmap is clean afterwards: the same blocks without the overlap fit.
  ops.pop_back();
  ASSERT_TRUE(b.Build(ops, kL, 64 * kB, kR, 64 * kB, 1 << 16).ok());
  EXPECT_TRUE(b.fits());
  ASSERT_TRUE(b.Build(ops, kL, 64 * kB, kR, 64 * kB, 1 << 16).ok());
  EXPECT_TRUE(b.fits());
  // Partial overlap of a two-block op with a one-block op.
  ops = {{0, 0, 2 * kB}, {4 * kB, kB, kB}};
  ASSERT_TRUE(b.Build(ops, kL, 64 * kB, kR, 64 * kB, 1 << 16).ok());
  EXPECT_FALSE(b.fits());
  // Not 16-byte aligned: offsets, or a base.
  ops = {{8, 0, kB}, {kB + 8, 2 * kB, kB}};
  ASSERT_TRUE(b.Build(ops, kL, 64 * kB, kR, 64 * kB, 1 << 16).ok());
  EXPECT_FALSE(b.fits());
  ops = {{0, 0, kB}, {kB, 2 * kB, kB}};
  ASSERT_TRUE(b.Build(ops, kL + 8, 64 * kB, kR, 64 * kB, 1 << 16).ok());
  EXPECT_FALSE(b.fits());
  // A base 16-byte aligned but not unit aligned is fine (units count from the base).
  ASSERT_TRUE(b.Build(ops, kL + 16, 64 * kB, kR + 48, 64 * kB, 1 << 16).ok());
  EXPECT_TRUE(b.fits());
  EXPECT_EQ(b.unit_bytes(), kB);
  // A destination region of more units than the bitmap covers.
  ops = {{0, 0, 16}, {16, 32, 16}};
  ASSERT_TRUE(b.Build(ops, kL, 64 * kB, kR, (BlockPlanner::kMaxBitmapUnits + 2) * 16, 1 << 16).ok());
  EXPECT_FALSE(b.fits());
}

TEST(BlockPlanner, RefusesBadOpsLikeCopyPlanner) {
  BlockPlanner b;
  CopyPlanner c;
  for (std::vector<CopyOp> ops : std::vector<std::vector<CopyOp>>{
           {{0, 0, 16}, {4090, 0, 16}}, {{0, (1 << 20) - 8, 16}}, {{~0ull - 4, 0, 16}}, {{0, 8, ~0ull}}}) {
    Status sb = b.Build(ops, kL, 4096, kR, 1 << 20, 1 << 16);
    Status sc = c.Build(ops, kL, 4096, kR, 1 << 20);
    EXPECT_EQ(sb.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(sb.ToString(), sc.ToString());
    EXPECT_FALSE(b.fits());
  }
  // Nothing to copy: OK, nothing planned.
  ASSERT_TRUE(b.Build({}, kL, 4096, kR, 4096, 1 << 16).ok());
  EXPECT_FALSE(b.fits());
  EXPECT_EQ(b.bytes(), 0u);
}

TEST(PackRuns, RoundTripsChunksAndSplits) {
  std::mt19937_64 rng(5);
  std::vector<CopyRun> runs;
  for (int i = 0; i < 700; ++i) {  // more than two launches' worth
    runs.push_back({kL + uint64_t(i) * (1 << 20), kR + (rng() % 100000) * 4096, 16 * (1 + rng() % 4096)});
  }
  PackedTable t;
  ASSERT_TRUE(PackRuns(runs.data(), runs.size(), 0, &t));
  ASSERT_EQ(t.runs.size(), runs.size());
  ASSERT_EQ(t.chunks.size(), 3u);
  uint64_t bytes = 0;
  size_t next = 0;
  for (const auto& c : t.chunks) {
    EXPECT_EQ(c.first, next);
    EXPECT_LE(c.count, kParamTableCapacity);
    next += c.count;
    uint64_t longest = 0;
    for (size_t i = c.first; i < c.first + c.count; ++i) {
      const PackedRun& r = t.runs[i];
      EXPECT_EQ(c.src_base + uint64_t(r.src16) * 16, runs[i].src);
      EXPECT_EQ(c.dst_base + uint64_t(r.dst16) * 16, runs[i].dst);
      EXPECT_EQ(uint64_t(r.len16) * 16, runs[i].length);
      longest = std::max<uint64_t>(longest, r.len16);
      bytes += runs[i].length;
    }
    EXPECT_EQ(c.longest16, longest);
  }
  EXPECT_EQ(next, runs.size());
  EXPECT_EQ(t.bytes, bytes);

  // Splitting: one 1 MiB + 16 B run and a small one, pieces of 256 KiB.
  std::vector<CopyRun> two = {{kL, kR, (1 << 20) + 16}, {kL + (4 << 20), kR + (8 << 20), 4096}};
  ASSERT_TRUE(PackRuns(two.data(), two.size(), 256 << 10, &t));
  ASSERT_EQ(t.runs.size(), 6u);
  EXPECT_EQ(t.runs[4].len16, 1u);
  EXPECT_EQ(t.chunks[0].src_base + uint64_t(t.runs[4].src16) * 16, kL + (1 << 20));
  EXPECT_EQ(t.chunks[0].longest16, (256u << 10) / 16);
  EXPECT_EQ(t.bytes, (1u << 20) + 16 + 4096);
}

TEST(PackRuns, RefusesWhatThePackedFormCannotHold) {
  PackedTable t;
  std::vector<CopyRun> odd = {{kL, kR, 4096}, {kL + 8192, kR + 8, 4096}};  // dst not 16-aligned
  EXPECT_FALSE(PackRuns(odd.data(), odd.size(), 0, &t));
  EXPECT_TRUE(t.runs.empty());
  odd = {{kL, kR, 100}};  // length not a multiple of 16
  EXPECT_FALSE(PackRuns(odd.data(), odd.size(), 0, &t));
  std::vector<CopyRun> far = {{kL, kR, 4096}, {kL + (64ull << 30), kR + 4096, 16}};  // 64 GiB apart
  EXPECT_FALSE(PackRuns(far.data(), far.size(), 0, &t));
  far[1].src -= 16;  // just inside
  EXPECT_TRUE(PackRuns(far.data(), far.size(), 0, &t));
  EXPECT_FALSE(PackRuns(far.data(), far.size(), 100, &t));  // split not a multiple of 16
}

TEST(ParamKernel, PiecesPerRunAndWhenToSplitOnTheHost) {
  // 256 runs of 64 KiB, 32 KiB pieces: two per run; 256 KiB runs: eight.
  EXPECT_EQ(PiecesPerRun(16ull << 20, 256, 32 << 10), 2u);
  EXPECT_EQ(PiecesPerRun(64ull << 20, 256, 32 << 10), 8u);
  EXPECT_EQ(PiecesPerRun(16ull << 20, 1, 32 << 10), 512u);  // one contiguous layer
  EXPECT_EQ(PiecesPerRun(4096, 4, 32 << 10), 1u);            // small runs: never 0
  EXPECT_EQ(PiecesPerRun(1ull << 40, 1, 16), 65535u);         // capped
  ParamKernelConfig cfg;
  std::vector<CopyRun> runs(256, CopyRun{kL, kR, 64 << 10});
  EXPECT_EQ(ParamSplitBytes(runs.data(), runs.size(), cfg), 0u);
  runs[3].length = 128 << 10;  // a coalesced pair: still even enough
  EXPECT_EQ(ParamSplitBytes(runs.data(), runs.size(), cfg), 0u);
  runs[3].length = 16ull << 20;  // one run longer than all the others together: cut it
  EXPECT_EQ(ParamSplitBytes(runs.data(), runs.size(), cfg),
            PlanPieceBytes(255ull * (64 << 10) + (16ull << 20), cfg));
  EXPECT_EQ(ParamSplitBytes(runs.data(), 0, cfg), 0u);
}

TEST(ParamKernelConfig, ParsesTheShapeFormAndRefusesUnbuiltShapes) {
  ParamKernelConfig c;
  ASSERT_TRUE(ParseParamKernelConfig("t512u4p32c528", &c));
  EXPECT_EQ(c.threads, 512);
  EXPECT_EQ(c.unroll, 4);
  EXPECT_EQ(c.piece_bytes, 32u << 10);
  EXPECT_EQ(c.max_ctas, 528u);
  ParamKernelConfig d;
  EXPECT_FALSE(ParseParamKernelConfig("t300", &d));
  EXPECT_FALSE(ParseParamKernelConfig("x1", &d));
  EXPECT_FALSE(ParseParamKernelConfig("t", &d));
  EXPECT_EQ(d.threads, ParamKernelConfig{}.threads);  // untouched on failure
  // Pieces: at least one batch, at most 256 KiB, ~2048 units when the bytes allow.
  ParamKernelConfig e;  // 256 x 8 x 16 B = 32 KiB batch
  EXPECT_EQ(PlanPieceBytes(16ull << 20, e), 32u << 10);
  EXPECT_EQ(PlanPieceBytes(1ull << 30, e), 256u << 10);
  e.threads = 128;
  e.unroll = 4;
  EXPECT_EQ(PlanPieceBytes(64ull << 20, e), 32u << 10);
}

TEST(ScatterShape, EnoughCtasForSmallBlocksAndNoWasteForEvenRuns) {
  // llama-3-8b at 4k tokens: 256 blocks of 64 KiB per layer.
  std::vector<CopyRun> runs;
  for (int i = 0; i < 256; ++i) runs.push_back({uint64_t(i) << 20, uint64_t(i) << 21, 64 << 10});
  ScatterShape s = PlanScatter(runs.data(), runs.size());
  EXPECT_EQ(s.piece_bytes, kMinPieceBytes);
  EXPECT_EQ(s.pieces_per_run, 4u);
  EXPECT_EQ(s.ctas, 1024u);
  EXPECT_EQ(s.wasted, 0u);
  EXPECT_FALSE(ScatterShapeWasteful(s));
  // llama-2-7b: 256 blocks of 256 KiB -> pieces of 32 KiB, 2048 CTAs.
  for (auto& r : runs) r.length = 256 << 10;
  s = PlanScatter(runs.data(), runs.size());
  EXPECT_EQ(s.piece_bytes, 32u << 10);
  EXPECT_EQ(s.ctas, 2048u);
  EXPECT_GE(s.ctas, kTargetCtas);
  // Very large runs keep the largest piece.
  for (auto& r : runs) r.length = 64ull << 20;
  s = PlanScatter(runs.data(), runs.size());
  EXPECT_EQ(s.piece_bytes, kScatterPieceBytes);
  EXPECT_EQ(s.pieces_per_run, 256u);
}

TEST(ScatterShape, UnevenRunsAreSplitOnTheHostInstead) {
  std::vector<CopyRun> runs(64, CopyRun{0, 0, 16 << 10});
  runs[0].length = 64ull << 20;  // one huge run: the 2-D grid would be mostly empty
  ScatterShape s = PlanScatter(runs.data(), runs.size());
  EXPECT_GT(s.wasted * 3, s.ctas);
  EXPECT_TRUE(ScatterShapeWasteful(s));
  EXPECT_EQ(ChooseCopyPath(runs.size(), true, false, false, 4, s), CopyPath::kKernelSplit);
}

TEST(ChooseCopyPath, CopyEngineForFewRunsOrOverlapKernelForMany) {
  std::vector<CopyRun> runs(8, CopyRun{0, 0, 64 << 10});
  ScatterShape s = PlanScatter(runs.data(), runs.size());
  EXPECT_EQ(ChooseCopyPath(1, true, false, false, 4, s), CopyPath::kMemcpy);
  EXPECT_EQ(ChooseCopyPath(3, true, false, false, 4, s), CopyPath::kMemcpy);
  EXPECT_EQ(ChooseCopyPath(8, true, false, false, 4, s), CopyPath::kKernel);
  EXPECT_EQ(ChooseCopyPath(8, false, false, false, 4, s), CopyPath::kMemcpy);  // overlap
  EXPECT_EQ(ChooseCopyPath(8, true, true, false, 4, s), CopyPath::kMemcpy);    // forced memcpy
  EXPECT_EQ(ChooseCopyPath(2, true, false, true, 4, s), CopyPath::kKernel);    // forced kernel
  EXPECT_EQ(ChooseCopyPath(0, true, false, true, 4, s), CopyPath::kMemcpy);
  // One run forced onto the kernel: the shape must cover the whole run.
  CopyRun one{0, 0, 16ull << 20};
  ScatterShape s1 = PlanScatter(&one, 1);
  EXPECT_EQ(ChooseCopyPath(1, true, false, true, 4, s1), CopyPath::kKernel);
  EXPECT_GE(s1.piece_bytes * s1.pieces_per_run, one.length);
  EXPECT_EQ(s1.wasted, 0u);
}

TEST(RunRing, HandsOutRangesInOrderNeverWrapsAndRefusesWhenFull) {
  RunRing r(100);
  uint64_t a = 0, b = 0, c = 0, d = 0;
  ASSERT_TRUE(r.Reserve(40, &a));
  ASSERT_TRUE(r.Reserve(40, &b));
  EXPECT_EQ(a, 0u);
  EXPECT_EQ(b, 40u);
  // 30 more would run past the end: it starts at the ring's start, which is still in use.
  EXPECT_FALSE(r.Reserve(30, &c));
  EXPECT_FALSE(r.Reserve(101, &c));
  EXPECT_FALSE(r.Reserve(0, &c));
  r.Release(a + 40);
  ASSERT_TRUE(r.Reserve(30, &c));
  EXPECT_EQ(c, 100u);  // skipped 80..99
  EXPECT_EQ(r.Index(c), 0u);
  EXPECT_FALSE(r.Reserve(20, &d));  // 130..149 -> slots 30..49 overlap b
  r.Release(b + 40);
  ASSERT_TRUE(r.Reserve(20, &d));
  EXPECT_EQ(d, 130u);
  r.Release(10);  // stale (out of order) releases never move the tail back
  EXPECT_EQ(r.tail(), 80u);
  // Many rounds: live ranges never overlap in slot space.
  RunRing ring(64);
  std::vector<std::pair<uint64_t, uint64_t>> live;
  std::mt19937 rng(3);
  for (int i = 0; i < 10000; ++i) {
    uint64_t n = 1 + rng() % 20, s = 0;
    if (ring.Reserve(n, &s)) {
      ASSERT_LE(ring.Index(s) + n, 64u);
      for (auto& [ls, ln] : live) {
        uint64_t x = ring.Index(ls), y = ring.Index(s);
        ASSERT_TRUE(x + ln <= y || y + n <= x) << "overlap at round " << i;
      }
      live.push_back({s, n});
    } else {
      ASSERT_FALSE(live.empty()) << "an empty ring refused " << n;
    }
    if (!live.empty() && (rng() % 2 || live.size() > 5)) {
      ring.Release(live.front().first + live.front().second);
      live.erase(live.begin());
    }
  }
}

TEST(NotificationBatch, OneWriteDeliversEveryFrameInOrder) {
  std::mutex mu;
  std::vector<Notification> got;
  auto l = NotificationListener::Start("kvstream-test-batch", [&](const Notification& n) {
    std::lock_guard<std::mutex> lock(mu);
    got.push_back(n);
  });
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  auto ch = NotificationChannel::Connect(l.value()->address(), DeadlineAfterMs(1000));
  ASSERT_TRUE(ch.ok()) << ch.status().ToString();
  // 1, 64 and 200 frames (more than one socket write), interleaved with single sends.
  std::vector<Notification> sent;
  uint64_t id = 1;
  for (size_t batch : {size_t(1), size_t(64), size_t(200)}) {
    std::vector<Notification> b;
    for (size_t i = 0; i < batch; ++i, ++id) b.push_back({id << 20 | 5, int32_t(id), int32_t(i)});
    ASSERT_TRUE(ch.value()->SendBatch(b.data(), b.size()).ok());
    sent.insert(sent.end(), b.begin(), b.end());
    Notification one{id++, -1, 9};
    ASSERT_TRUE(ch.value()->Send(one).ok());
    sent.push_back(one);
  }
  ASSERT_TRUE(ch.value()->SendBatch(nullptr, 0).ok());
  auto deadline = DeadlineAfterMs(5000);
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (got.size() >= sent.size()) break;
    }
    ASSERT_FALSE(Expired(deadline)) << "only " << got.size() << " of " << sent.size();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(got.size(), sent.size());
  for (size_t i = 0; i < sent.size(); ++i) {
    EXPECT_EQ(got[i].request_id, sent[i].request_id) << i;
    EXPECT_EQ(got[i].layer, sent[i].layer) << i;
    EXPECT_EQ(got[i].flags, sent[i].flags) << i;
  }
}

TEST(NotificationBatch, FailsWithRemoteDisconnectOnceTheReceiverIsGone) {
  auto l = NotificationListener::Start("kvstream-test-batch", nullptr);
  ASSERT_TRUE(l.ok());
  auto ch = NotificationChannel::Connect(l.value()->address(), DeadlineAfterMs(1000));
  ASSERT_TRUE(ch.ok());
  l.value().reset();
  ASSERT_TRUE(ch.value()->PeerClosed(2000000));
  std::vector<Notification> b(100, Notification{1, 2, 3});
  Status s;
  for (int i = 0; i < 100 && s.ok(); ++i) s = ch.value()->SendBatch(b.data(), b.size());
  EXPECT_EQ(s.code(), StatusCode::kRemoteDisconnect);
}

}  // namespace
}  // namespace kvstream::transport::cuda
