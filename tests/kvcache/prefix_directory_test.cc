// Unit: kvcache/prefix_directory.h and prefix_key.h over a real BlockAllocator (partial-prefix
// match, keys folded with the model/layout/salt, references, LRU of leaves, watermarks,
// max_tokens, Clear).
#include "kvcache/prefix_directory.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <thread>

namespace kvstream::kvcache {
namespace {

using V = std::vector<int32_t>;

model::KvLayout Layout(int block_size = 4) {
  model::KvLayout l;
  l.num_layers = 2;
  l.num_kv_heads = 2;
  l.head_dim = 8;
  l.block_size = block_size;
  return l;
}

V Seq(int n, int first = 1) {
  V v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

DirectoryOptions Opts(int budget, int block_size = 4) {
  DirectoryOptions o;
  o.block_size = block_size;
  o.budget_blocks = budget;
  return o;
}

PrefixDirectory::Match FindCounted(PrefixDirectory& d, const BlockKey& root, const V& t) {
  auto m = d.Find(root, t);
  d.CountLookup(m.tokens);
  return m;
}

// Computes `tokens` as a request would: blocks for all of them, then Insert, then the
// request's lease goes. Returns the block ids.
V Put(PrefixDirectory& d, model::BlockAllocator& a, const BlockKey& root, const V& t) {
  model::BlockLease l(&a, a.Allocate(model::BlocksForTokens(int(t.size()), d.block_size())).value());
  d.Insert(root, t, l.ids());
  return l.ids();
}

TEST(PrefixKey, RootFoldsModelLayoutAndSaltAndBlocksChain) {
  const BlockKey r = RootKey(1, Layout(), "");
  EXPECT_NE(r, RootKey(2, Layout(), ""));
  EXPECT_NE(r, RootKey(1, Layout(8), ""));
  model::KvLayout bf = Layout();
  bf.dtype = DType::kBF16;
  EXPECT_NE(r, RootKey(1, bf, ""));
  EXPECT_NE(r, RootKey(1, Layout(), "tenant-a"));
  EXPECT_EQ(r, RootKey(1, Layout(), ""));
  const V t = Seq(4);
  EXPECT_EQ(BlockKeyOf(r, t), BlockKeyOf(r, t));
  EXPECT_NE(BlockKeyOf(r, t), BlockKeyOf(RootKey(1, Layout(), "tenant-a"), t));
  EXPECT_NE(BlockKeyOf(r, t), BlockKeyOf(r, V{1, 2, 3}));
  // The same tokens after another parent are another block.
  EXPECT_NE(BlockKeyOf(BlockKeyOf(r, t), t), BlockKeyOf(r, t));
  // Negative ids are hashed as their bit pattern, not truncated.
  EXPECT_NE(BlockKeyOf(r, V{-1}), BlockKeyOf(r, V{255}));
  EXPECT_EQ(KeyHex(r).size(), 64u);
}

TEST(PrefixDirectory, MatchesTheLongestCachedBlockAlignedPrefix) {
  model::BlockAllocator a(64);
  PrefixDirectory d(&a, Opts(32));
  const BlockKey root = RootKey(7, Layout(), "");
  const V first = Seq(10);  // blocks [1-4] [5-8] and the partial [9 10]
  const V ids = Put(d, a, root, first);
  EXPECT_EQ(d.stats().blocks, 3);
  EXPECT_EQ(a.free_count(), 64 - 3);

  // The whole prompt again: every token, the partial block included.
  auto m = FindCounted(d, root, first);
  EXPECT_EQ(m.tokens, 10);
  EXPECT_EQ(m.lease.ids(), ids);
  EXPECT_EQ(a.refcount(ids[0]), 2);
  m.lease.Reset();
  EXPECT_EQ(a.refcount(ids[0]), 1);

  // A longer prompt sharing 8 tokens: two blocks (the partial one only matches at the end).
  V longer = Seq(12);
  m = FindCounted(d, root, longer);
  EXPECT_EQ(m.tokens, 8);
  EXPECT_EQ(m.lease.ids(), V(ids.begin(), ids.begin() + 2));
  // Diverging inside the second block: one block.
  V diverge = Seq(12);
  diverge[6] = 99;
  EXPECT_EQ(FindCounted(d, root, diverge).tokens, 4);
  // Diverging in the first token, another model, another salt: nothing.
  V other = Seq(12);
  other[0] = 99;
  EXPECT_EQ(FindCounted(d, root, other).tokens, 0);
  EXPECT_EQ(FindCounted(d, RootKey(8, Layout(), ""), first).tokens, 0);
  EXPECT_EQ(FindCounted(d, RootKey(7, Layout(), "tenant"), first).tokens, 0);
  auto s = d.stats();
  EXPECT_EQ(s.hits, 3u);
  EXPECT_EQ(s.misses, 3u);
  EXPECT_EQ(s.hit_tokens, 10u + 8 + 4);
}

TEST(PrefixDirectory, ExtendsAPrefixAndSharesItsBlocks) {
  model::BlockAllocator a(64);
  PrefixDirectory d(&a, Opts(32));
  const BlockKey root = RootKey(7, Layout(), "");
  const V system = Seq(8);
  const V sys_ids = Put(d, a, root, system);
  // A request continuing the system prompt: it uses the cached blocks and computes the rest.
  V turn = Seq(14);
  auto m = FindCounted(d, root, turn);
  ASSERT_EQ(m.tokens, 8);
  ASSERT_TRUE(m.lease.GrowToTokens(14, 4).ok());
  ASSERT_EQ(m.lease.ids().size(), 4u);
  EXPECT_EQ(d.Insert(root, turn, m.lease.ids()), 2);  // [9-12] and the partial [13 14]
  const V turn_ids = m.lease.ids();
  m.lease.Reset();
  EXPECT_EQ(d.stats().blocks, 4);
  EXPECT_EQ(a.free_count(), 64 - 4);
  auto again = FindCounted(d, root, turn);
  EXPECT_EQ(again.tokens, 14);
  EXPECT_EQ(again.lease.ids(), turn_ids);
  EXPECT_EQ(V(turn_ids.begin(), turn_ids.begin() + 2), sys_ids);
}

TEST(PrefixDirectory, EvictsLeastRecentlyUsedLeavesNeverWhatALeaseHoldsNorAPrefixOfAKeptNode) {
  model::BlockAllocator a(16);
  DirectoryOptions o = Opts(6);
  o.low_watermark = 1.0;  // evict exactly one block per insert past the budget
  PrefixDirectory d(&a, o);
  const BlockKey root = RootKey(7, Layout(), "");
  const V x = Seq(8, 100), y = Seq(8, 200), z = Seq(8, 300);
  Put(d, a, root, x);
  Put(d, a, root, y);
  Put(d, a, root, z);
  EXPECT_EQ(d.stats().blocks, 6);
  auto held = FindCounted(d, root, x);  // x is read by a write, and most recent
  ASSERT_EQ(held.tokens, 8);
  // Over budget: y's leaf goes first (the oldest leaf), never y's first block before it.
  const V w = Seq(4, 400);
  Put(d, a, root, w);
  EXPECT_EQ(d.stats().blocks, 6);
  EXPECT_EQ(d.stats().evicted_blocks, 1u);
  EXPECT_EQ(d.Find(root, y).tokens, 4);
  EXPECT_EQ(d.Find(root, x).tokens, 8);
  // Room for 16 blocks: everything but x's (held) blocks goes; they stay allocated.
  EXPECT_EQ(d.EvictForAllocation(16), 4);
  EXPECT_EQ(a.free_count(), 14);
  EXPECT_EQ(d.Find(root, x).tokens, 8);
  EXPECT_EQ(d.Find(root, z).tokens, 0);
  held.lease.Reset();
  d.Clear(/*closing=*/false);
  EXPECT_EQ(a.free_count(), 16);
  EXPECT_EQ(d.stats().nodes, 0);
}

TEST(PrefixDirectory, WatermarkEvictsDownToTheLowMarkAtOnce) {
  model::BlockAllocator a(64);
  DirectoryOptions o = Opts(10);
  o.low_watermark = 0.5;
  PrefixDirectory d(&a, o);
  const BlockKey root = RootKey(7, Layout(), "");
  for (int i = 0; i < 10; ++i) Put(d, a, root, Seq(4, 1000 * (i + 1)));
  EXPECT_EQ(d.stats().blocks, 10);
  Put(d, a, root, Seq(4, 99000));  // full: down to 4, then the new one
  EXPECT_EQ(d.stats().blocks, 5);
  EXPECT_EQ(d.stats().evicted_blocks, 6u);
  for (int i = 0; i < 4; ++i) Put(d, a, root, Seq(4, 50000 + 100 * i));
  EXPECT_EQ(d.stats().evicted_blocks, 6u);  // no eviction until full again
  EXPECT_EQ(a.free_count(), 64 - 9);
}

TEST(PrefixDirectory, MaxTokensAndBudgetBoundWhatIsCached) {
  model::BlockAllocator a(64);
  DirectoryOptions o = Opts(32);
  o.max_tokens = 9;
  PrefixDirectory d(&a, o);
  const BlockKey root = RootKey(7, Layout(), "");
  Put(d, a, root, Seq(20));
  EXPECT_EQ(d.stats().blocks, 2);  // tokens 1-8; the block ending past 9 is not cached
  EXPECT_EQ(d.Find(root, Seq(20)).tokens, 8);
  PrefixDirectory off(&a, Opts(0));
  EXPECT_FALSE(off.enabled());
  Put(off, a, root, Seq(8));
  EXPECT_EQ(FindCounted(off, root, Seq(8)).tokens, 0);
  EXPECT_EQ(off.stats().misses, 0u);
  // Ids that do not cover the tokens are refused.
  model::BlockLease l(&a, a.Allocate(1).value());
  EXPECT_EQ(d.Insert(RootKey(9, Layout(), ""), Seq(8), l.ids()), 0);
}

TEST(PrefixDirectory, ClosingDropsEverythingAndKeepsNothingAfter) {
  model::BlockAllocator a(16);
  {
    PrefixDirectory d(&a, Opts(8));
    const BlockKey root = RootKey(7, Layout(), "");
    Put(d, a, root, Seq(12));
    EXPECT_EQ(a.free_count(), 13);
    d.Clear(/*closing=*/true);
    EXPECT_EQ(a.free_count(), 16);
    Put(d, a, root, Seq(12));
    EXPECT_EQ(d.stats().blocks, 0);
    Put(d, a, root, Seq(4, 50));
  }
  EXPECT_EQ(a.free_count(), 16);
}

// Many threads finding, inserting and evicting at once over a small pool: every block ends
// free once the directory is gone, and no block is handed out while it is cached.
TEST(PrefixDirectory, ConcurrentUseKeepsReferencesExact) {
  model::BlockAllocator a(48);
  auto d = std::make_unique<PrefixDirectory>(&a, Opts(24));
  const BlockKey root = RootKey(7, Layout(), "");
  std::vector<std::thread> threads;
  for (int th = 0; th < 4; ++th) {
    threads.emplace_back([&, th] {
      std::mt19937 rng(th);
      for (int i = 0; i < 400; ++i) {
        V t = Seq(4 * int(rng() % 4) + 1 + int(rng() % 4), 1 + int(rng() % 3) * 100);
        auto m = FindCounted(*d, root, t);
        if (m.lease.allocator() == nullptr) m.lease = model::BlockLease(&a, {});
        const int need = model::BlocksForTokens(int(t.size()), 4) - int(m.lease.ids().size());
        if (need > 0 && a.free_count() < need) d->EvictForAllocation(need);
        if (!m.lease.GrowToTokens(int(t.size()), 4).ok()) continue;
        d->Insert(root, t, m.lease.ids());
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LE(d->stats().blocks, 24);
  EXPECT_EQ(a.free_count(), 48 - d->stats().blocks);
  d.reset();
  EXPECT_EQ(a.free_count(), 48);
}

}  // namespace
}  // namespace kvstream::kvcache
