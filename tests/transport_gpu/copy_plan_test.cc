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

#include "transport/cuda_ipc/control_socket.h"
#include "transport/cuda_ipc/copy_plan.h"

namespace kvstream::transport::cuda_ipc {
namespace {

using cuda::CopyRun;

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
  EXPECT_EQ(s.piece_bytes, cuda::kScatterPieceBytes);
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
  auto l = cuda::NotificationListener::Start("kvstream-test-batch", [&](const Notification& n) {
    std::lock_guard<std::mutex> lock(mu);
    got.push_back(n);
  });
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  auto ch = cuda::NotificationChannel::Connect(l.value()->address(), DeadlineAfterMs(1000));
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
  auto l = cuda::NotificationListener::Start("kvstream-test-batch", nullptr);
  ASSERT_TRUE(l.ok());
  auto ch = cuda::NotificationChannel::Connect(l.value()->address(), DeadlineAfterMs(1000));
  ASSERT_TRUE(ch.ok());
  l.value().reset();
  ASSERT_TRUE(ch.value()->PeerClosed(2000000));
  std::vector<Notification> b(100, Notification{1, 2, 3});
  Status s;
  for (int i = 0; i < 100 && s.ok(); ++i) s = ch.value()->SendBatch(b.data(), b.size());
  EXPECT_EQ(s.code(), StatusCode::kRemoteDisconnect);
}

}  // namespace
}  // namespace kvstream::transport::cuda_ipc
