#include "model/kv_cache.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

namespace kvstream::model {
namespace {

TEST(BlockAllocator, RandomSequencesKeepInvariants) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    const int n = 64;
    BlockAllocator a(n);
    std::mt19937 rng(seed);
    std::map<int32_t, int> expected;  // id -> refcount, for blocks we hold
    for (int step = 0; step < 20000; ++step) {
      int op = rng() % 4;
      if (op == 0) {
        int want = rng() % 12;
        int free_before = a.free_count();
        auto r = a.Allocate(want);
        if (want > free_before) {
          ASSERT_FALSE(r.ok());
          EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
          EXPECT_EQ(a.free_count(), free_before);  // nothing allocated
        } else {
          ASSERT_TRUE(r.ok()) << r.status().ToString();
          ASSERT_EQ(int(r->size()), want);
          for (int32_t id : *r) {
            ASSERT_GE(id, 0);
            ASSERT_LT(id, n);
            ASSERT_EQ(expected.count(id), 0u) << "block " << id << " handed out twice";
            expected[id] = 1;
          }
        }
      } else if (op == 1 && !expected.empty()) {
        auto it = std::next(expected.begin(), rng() % expected.size());
        ASSERT_TRUE(a.Ref({it->first}).ok());
        ++it->second;
      } else if (!expected.empty()) {
        // Release a random subset (maybe with a repeated id).
        std::vector<int32_t> ids;
        int k = 1 + rng() % 4;
        for (int i = 0; i < k && !expected.empty(); ++i) {
          auto it = std::next(expected.begin(), rng() % expected.size());
          ids.push_back(it->first);
        }
        std::map<int32_t, int> cnt;
        bool valid = true;
        for (int32_t id : ids)
          if (++cnt[id] > expected[id]) valid = false;
        int free_before = a.free_count();
        Status s = a.Release(ids);
        if (!valid) {
          EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
          EXPECT_EQ(a.free_count(), free_before);
        } else {
          ASSERT_TRUE(s.ok()) << s.ToString();
          for (auto [id, c] : cnt) {
            expected[id] -= c;
            if (expected[id] == 0) expected.erase(id);
          }
        }
      }
      ASSERT_EQ(a.free_count(), n - int(expected.size()));
      if (step % 97 == 0) {
        for (int id = 0; id < n; ++id)
          ASSERT_EQ(a.refcount(id), expected.count(id) ? expected[id] : 0);
      }
    }
  }
}

TEST(BlockAllocator, BadIdsChangeNothing) {
  BlockAllocator a(4);
  auto r = a.Allocate(2);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(a.Release({(*r)[0], 7}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a.refcount((*r)[0]), 1);
  EXPECT_EQ(a.Release({-1}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a.Ref({3}).code(), StatusCode::kInvalidArgument);  // free block
  EXPECT_EQ(a.Allocate(-1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(a.Release(*r).ok());
  EXPECT_EQ(a.Release(*r).code(), StatusCode::kInvalidArgument);  // double free
  EXPECT_EQ(a.free_count(), 4);
}

TEST(BlockAllocator, ConcurrentAllocateNeverDuplicates) {
  BlockAllocator a(256);
  std::vector<std::vector<int32_t>> got(4);
  std::vector<std::thread> th;
  for (int t = 0; t < 4; ++t)
    th.emplace_back([&, t] {
      for (int i = 0; i < 64; ++i) {
        auto r = a.Allocate(1);
        if (r.ok()) got[t].push_back((*r)[0]);
      }
    });
  for (auto& x : th) x.join();
  std::set<int32_t> all;
  for (auto& g : got)
    for (int32_t id : g) EXPECT_TRUE(all.insert(id).second);
  EXPECT_EQ(all.size(), 256u);
  EXPECT_EQ(a.free_count(), 0);
}

TEST(BlockLease, ReleasesOnDestructionAndMove) {
  BlockAllocator a(8);
  {
    BlockLease lease(&a, {});
    ASSERT_TRUE(lease.GrowToTokens(33, 16).ok());  // 3 blocks
    EXPECT_EQ(lease.ids().size(), 3u);
    EXPECT_EQ(a.free_count(), 5);
    ASSERT_TRUE(lease.GrowToTokens(48, 16).ok());  // still 3
    EXPECT_EQ(lease.ids().size(), 3u);
    EXPECT_EQ(lease.GrowToTokens(16 * 9, 16).code(), StatusCode::kResourceExhausted);
    EXPECT_EQ(lease.ids().size(), 3u);
    EXPECT_EQ(a.free_count(), 5);
    BlockLease moved = std::move(lease);
    EXPECT_EQ(a.free_count(), 5);
    BlockLease other(&a, {});
    ASSERT_TRUE(other.GrowToTokens(1, 16).ok());
    EXPECT_EQ(a.free_count(), 4);
    other = std::move(moved);  // other's own block is released
    EXPECT_EQ(a.free_count(), 5);
  }
  EXPECT_EQ(a.free_count(), 8);
  BlockLease empty;
  EXPECT_EQ(empty.GrowToTokens(1, 16).code(), StatusCode::kFailedPrecondition);
}

TEST(KvPool, LayoutOffsetsAndMemory) {
  KvLayout l{3, 2, 128, 16, DType::kF16};
  EXPECT_EQ(l.tile_bytes(), 4096u);
  EXPECT_EQ(l.block_bytes(), 2u * 2 * 4096);
  auto pool = CreateHostPool(l, 10);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  KvPool& p = **pool;
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p.base()) % 4096, 0u);
  EXPECT_GE(p.memory().size(), l.pool_bytes(10));
  EXPECT_EQ(p.block_ptr(0, 1) - p.block_ptr(0, 0), ptrdiff_t(l.block_bytes()));
  EXPECT_EQ(p.block_ptr(1, 0) - p.base(), ptrdiff_t(l.layer_bytes(10)));
  EXPECT_EQ(p.block_ptr(2, 9) + l.block_bytes(), p.base() + l.pool_bytes(10));
  for (size_t i = 0; i < l.pool_bytes(10); i += 997) EXPECT_EQ(p.base()[i], std::byte{0});
  EXPECT_EQ(p.allocator().free_count(), 10);

  auto small = AllocateHostPoolMemory(100);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(KvPool::Create(l, 10, std::move(small).value()).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_FALSE(CreateHostPool(l, 0).ok());
  EXPECT_FALSE(AllocateHostPoolMemory(0).ok());
}

}  // namespace
// Blocks released together come back ascending, cycle after cycle, so a request's KV stays in
// runs a transfer coalesces.
TEST(BlockAllocator, ReleasedRunsComeBackAscending) {
  BlockAllocator a(64);
  for (int cycle = 0; cycle < 4; ++cycle) {
    auto r = a.Allocate(16);
    ASSERT_TRUE(r.ok());
    for (size_t i = 1; i < r->size(); ++i) EXPECT_EQ((*r)[i], (*r)[i - 1] + 1) << "cycle " << cycle;
    ASSERT_TRUE(a.Release(*r).ok());
  }
}

}  // namespace kvstream::model
