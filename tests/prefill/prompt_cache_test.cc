// Unit: prefill/prompt_cache.h over a real BlockAllocator (references, LRU, budget, in-use).
#include "prefill/prompt_cache.h"

#include <gtest/gtest.h>

namespace kvstream::prefill {
namespace {

using V = std::vector<int32_t>;

std::vector<int32_t> Blocks(model::BlockAllocator& a, int n) { return a.Allocate(n).value(); }

TEST(PromptCache, ExactTokensHitOthersMissAndBlocksAreShared) {
  model::BlockAllocator a(32);
  PromptCache c(&a, 16);
  const std::vector<int32_t> t = {1, 2, 3, 4, 5};
  model::BlockLease computed(&a, Blocks(a, 2));
  ASSERT_TRUE(c.Insert(t, computed.ids()));
  EXPECT_FALSE(c.Insert(t, computed.ids()));  // cached already
  const std::vector<int32_t> ids = computed.ids();
  computed.Reset();  // the request's own reference goes; the cache keeps the blocks
  EXPECT_EQ(a.free_count(), 30);
  for (const auto& other : {std::vector<int32_t>{1, 2, 3, 4}, std::vector<int32_t>{1, 2, 3, 4, 6},
                            std::vector<int32_t>{1, 2, 3, 4, 5, 6}})
    EXPECT_FALSE(c.Lookup(other, true).has_value());
  auto hit = c.Lookup(t, true);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->ids(), ids);
  EXPECT_EQ(a.refcount(ids[0]), 2);  // cache + the hit's lease
  hit.reset();
  EXPECT_EQ(a.refcount(ids[0]), 1);
  auto s = c.stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 3u);
  EXPECT_EQ(s.blocks, 2);
  EXPECT_EQ(s.entries, 1);
}

TEST(PromptCache, EvictsLeastRecentlyUsedButNeverWhatAWriteHolds) {
  model::BlockAllocator a(8);
  PromptCache c(&a, 6);
  auto put = [&](std::vector<int32_t> t, int n) {
    model::BlockLease l(&a, Blocks(a, n));
    return c.Insert(t, l.ids());
  };
  ASSERT_TRUE(put({1}, 2));
  ASSERT_TRUE(put({2}, 2));
  ASSERT_TRUE(put({3}, 2));
  EXPECT_EQ(a.free_count(), 2);
  ASSERT_TRUE(c.Lookup(V{1}, true).has_value());  // {1} is now the most recently used
  auto held = c.Lookup(V{2}, true);               // a write reads {2}
  ASSERT_TRUE(held.has_value());
  // Over budget: {3} is the least recently used entry nobody holds.
  ASSERT_TRUE(put({4}, 2));
  EXPECT_FALSE(c.Lookup(V{3}, false).has_value());
  EXPECT_EQ(c.stats().evictions, 1u);
  // Room for 8 blocks: everything but the held entry goes; its blocks stay allocated.
  EXPECT_EQ(c.EvictForAllocation(8), 4);
  EXPECT_EQ(a.free_count(), 6);
  EXPECT_TRUE(c.Lookup(V{2}, false).has_value());
  // A prompt that fits the budget only without the held entry is not kept.
  EXPECT_FALSE(put({5}, 6));
  model::BlockLease big(&a, Blocks(a, 5));
  EXPECT_FALSE(c.Insert(V{6}, big.ids()));  // 2 held + 5 > 6
  big.Reset();
  // One larger than the whole budget is never kept.
  PromptCache small(&a, 2);
  model::BlockLease three(&a, Blocks(a, 3));
  EXPECT_FALSE(small.Insert(V{11}, three.ids()));
  three.Reset();
  held.reset();
  EXPECT_EQ(c.EvictForAllocation(8), 2);
  EXPECT_EQ(a.free_count(), 8);
}

TEST(PromptCache, ClearReleasesEverythingAndClosingRefusesInserts) {
  model::BlockAllocator a(8);
  {
    PromptCache c(&a, 8);
    model::BlockLease l(&a, Blocks(a, 3));
    ASSERT_TRUE(c.Insert(V{7, 7}, l.ids()));
    l.Reset();
    auto in_flight = c.Lookup(V{7, 7}, true);
    c.Clear(/*closing=*/true);
    EXPECT_EQ(a.free_count(), 5);  // the write still reads them
    in_flight.reset();
    EXPECT_EQ(a.free_count(), 8);
    model::BlockLease m(&a, Blocks(a, 1));
    EXPECT_FALSE(c.Insert(V{8}, m.ids()));
    EXPECT_EQ(c.stats().blocks, 0);
    // Off: nothing is kept or counted.
    PromptCache off(&a, 0);
    EXPECT_FALSE(off.enabled());
    EXPECT_FALSE(off.Insert(V{9}, m.ids()));
    EXPECT_FALSE(off.Lookup(V{9}, true).has_value());
    EXPECT_EQ(off.stats().misses, 0u);
    model::BlockLease n(&a, Blocks(a, 2));
    PromptCache d(&a, 8);
    ASSERT_TRUE(d.Insert(V{10}, n.ids()));
  }  // the destructor drops d's references
  EXPECT_EQ(a.free_count(), 8);
}

}  // namespace
}  // namespace kvstream::prefill
