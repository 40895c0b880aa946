// kvcache/tier_index.h: LRU order, the size bound with its low watermark, pins, age, restore.
#include "kvcache/tier_index.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace kvstream::kvcache {
namespace {

BlockKey K(int i) {
  BlockKey k{};
  k[0] = uint8_t(i);
  k[31] = uint8_t(i >> 8);
  return k;
}

// Inserts key i with `bytes`, recording evictions in `gone`.
bool Add(TierIndex& ix, int i, uint64_t bytes, std::vector<int>* gone) {
  if (!ix.Reserve(bytes, [&](const BlockKey& k, const TierIndex::Entry&) { gone->push_back(k[0]); }))
    return false;
  return ix.Insert(K(i), bytes, uint64_t(i), TierIndex::Clock::now());
}

TEST(TierIndex, EvictsLeastRecentlyUsedDownToTheLowWatermark) {
  TierIndex ix({/*capacity_bytes=*/1000, /*low_watermark=*/0.5, /*max_age_s=*/0});
  std::vector<int> gone;
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(Add(ix, i, 100, &gone));
  EXPECT_TRUE(gone.empty());
  ix.Touch(K(0));  // 1 is the least recently used now
  ASSERT_TRUE(Add(ix, 10, 100, &gone));
  // Down to 500 bytes with the new entry: six went at once, oldest first, 0 kept.
  EXPECT_EQ(gone, (std::vector<int>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(ix.used(), 500u);
  EXPECT_EQ(ix.entries(), 5u);
  EXPECT_TRUE(ix.Contains(K(0)));
  // The next writes fit without evicting (no thrashing).
  gone.clear();
  for (int i = 11; i < 16; ++i) ASSERT_TRUE(Add(ix, i, 100, &gone));
  EXPECT_TRUE(gone.empty());
}

TEST(TierIndex, PinnedEntriesAreNeverEvicted) {
  TierIndex ix({300, 0.9, 0});
  std::vector<int> gone;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Add(ix, i, 100, &gone));
  ASSERT_TRUE(ix.Ref(K(0)));
  ASSERT_TRUE(ix.Ref(K(1)));
  ASSERT_TRUE(ix.Ref(K(1)));
  EXPECT_FALSE(ix.Ref(K(7)));
  ASSERT_TRUE(Add(ix, 3, 100, &gone));
  EXPECT_EQ(gone, (std::vector<int>{2}));
  ASSERT_TRUE(ix.Ref(K(3)));
  // Everything is pinned: no room, nothing evicted, nothing reserved.
  EXPECT_FALSE(Add(ix, 4, 100, &gone));
  EXPECT_EQ(gone, (std::vector<int>{2}));
  EXPECT_EQ(ix.used(), 300u);
  ix.Unref(K(3));
  ix.Unref(K(1));  // 1 still pinned once
  ASSERT_TRUE(Add(ix, 4, 100, &gone));
  EXPECT_EQ(gone, (std::vector<int>{2, 3}));
  EXPECT_TRUE(ix.Contains(K(0)));
  EXPECT_TRUE(ix.Contains(K(1)));
  EXPECT_EQ(ix.EvictDownTo(0, nullptr), 1u);  // only 4 may go
  ix.Unref(K(1));
  ix.Unref(K(0));
  ix.Unref(K(0));  // more Unrefs than Refs: no effect
  EXPECT_EQ(ix.EvictDownTo(0, nullptr), 2u);
  EXPECT_EQ(ix.used(), 0u);
  // Remove ignores pins (an explicit erase, a failed read).
  ASSERT_TRUE(Add(ix, 5, 100, &gone));
  ASSERT_TRUE(ix.Ref(K(5)));
  EXPECT_TRUE(ix.Remove(K(5)).has_value());
  EXPECT_EQ(ix.used(), 0u);
}

TEST(TierIndex, InsertTwiceKeepsOneEntryAndReturnsTheReservation) {
  TierIndex ix({1000, 0.9, 0});
  std::vector<int> gone;
  ASSERT_TRUE(Add(ix, 1, 100, &gone));
  ASSERT_TRUE(ix.Reserve(100, nullptr));
  EXPECT_FALSE(ix.Insert(K(1), 100, 0, TierIndex::Clock::now()));
  EXPECT_EQ(ix.used(), 100u);
  ASSERT_TRUE(ix.Reserve(100, nullptr));
  ix.Unreserve(100);
  EXPECT_EQ(ix.used(), 100u);
}

TEST(TierIndex, RestoredEntriesKeepTheirOrderAndAreBoundedAfter) {
  TierIndex ix({250, 0.9, 0});
  const auto now = TierIndex::Clock::now();
  for (int i = 0; i < 4; ++i) ix.Restore(K(i), 100, 0, now);  // 0 the most recent
  EXPECT_EQ(ix.used(), 400u);
  std::vector<int> gone;
  EXPECT_EQ(ix.EvictDownTo(250, [&](const BlockKey& k, const TierIndex::Entry&) {
    gone.push_back(k[0]);
  }), 2u);
  EXPECT_EQ(gone, (std::vector<int>{3, 2}));
}

TEST(TierIndex, AgeBound) {
  TierIndex ix({1000, 0.9, /*max_age_s=*/1});
  ASSERT_TRUE(ix.Reserve(100, nullptr));
  ix.Insert(K(1), 100, 0, TierIndex::Clock::now() - std::chrono::seconds(5));
  ASSERT_TRUE(ix.Reserve(100, nullptr));
  ix.Insert(K(2), 100, 0, TierIndex::Clock::now());
  EXPECT_FALSE(ix.Contains(K(1)));
  ASSERT_NE(ix.Find(K(1)), nullptr);
  EXPECT_TRUE(ix.Expired(*ix.Find(K(1))));
  EXPECT_TRUE(ix.Contains(K(2)));
  std::vector<int> gone;
  ix.Clear([&](const BlockKey& k, const TierIndex::Entry&) { gone.push_back(k[0]); });
  EXPECT_EQ(gone.size(), 2u);
  EXPECT_EQ(ix.used(), 0u);
}

}  // namespace
}  // namespace kvstream::kvcache
