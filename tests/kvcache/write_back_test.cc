// Unit: the write-back policy (issue 16) over a real host pool: a PrefixDirectory whose
// evictions go to TieredCache::WriteBack, as the prefill wires them with
// kv_tier_write_policy write_back. Checked: a prefill's insert writes nothing; an eviction writes
// exactly the evicted blocks under their chained keys (a leaf whose parents stay cached too, the
// partial last block too), read back by a fetch of the same prompt, and from disk by a second
// cache over the same folder; a block being written back is not freed nor reused before its
// write completes; a full queue skips and counts, a shutdown's write-back waits for room
// instead; without the callback (write-through) evictions write nothing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <numeric>

#include "kvcache/disk_tier.h"
#include "kvcache/host_tier.h"
#include "kvcache/prefix_directory.h"
#include "kvcache/tiered_cache.h"
#include "tests/kvcache/tier_test_util.h"

namespace kvstream::kvcache {
namespace {

namespace fs = std::filesystem;
using V = std::vector<int32_t>;
using testing::GatedTier;
using testing::Host;
using testing::Layout;

constexpr char kSecret[] = "unit-test-cluster-secret-0123";

class WriteBackTest : public ::testing::Test {
 protected:
  // A pool of `blocks`, a prompt of 14 tokens (3 full blocks of 4, and 2).
  void Make(int blocks) {
    pool_ = model::CreateHostPool(Layout(), blocks).value();
    root_ = RootKey(1, Layout(), "");
    tokens_.resize(14);
    std::iota(tokens_.begin(), tokens_.end(), 100);
  }
  DirectoryOptions Dir(int budget) {
    DirectoryOptions o;
    o.block_size = 4;
    o.budget_blocks = budget;
    return o;
  }
  // "Prefills" `tokens` into fresh pool blocks (bytes from their ids), inserts them into `dir`
  // and returns the blocks (the request's lease released: only the directory holds them).
  std::vector<int32_t> Prefill(PrefixDirectory& dir, const V& tokens, int salt = 0) {
    model::BlockLease src(&pool_->allocator(), {});
    EXPECT_TRUE(src.GrowToTokens(int(tokens.size()), 4).ok());
    for (size_t b = 0; b < src.ids().size(); ++b)
      for (int l = 0; l < 2; ++l)
        for (size_t i = 0; i < Layout().block_bytes(); ++i)
          pool_->block_ptr(l, src.ids()[b])[i] = Byte(int(b) + salt, l, i);
    int kept = 0;
    dir.Insert(root_, tokens, src.ids(), &kept);
    EXPECT_EQ(kept, int(tokens.size()));
    return src.ids();
  }
  static std::byte Byte(int b, int l, size_t i) { return static_cast<std::byte>(b * 29 + l * 7 + i); }
  // Fetches `tokens` from `tc` into fresh blocks from `from` (the blocks before it given as
  // `have`); checks the bytes of the blocks fetched. Returns the tokens covered.
  int FetchChecked(TieredCache& tc, const V& tokens, int from = 0, std::vector<int32_t> have = {},
                   int salt = 0) {
    if (!have.empty()) {
      EXPECT_TRUE(pool_->allocator().Ref(have).ok());
    }
    model::BlockLease got(&pool_->allocator(), std::move(have));
    const int covered = tc.Fetch(root_, tokens, from, &got, nullptr);
    for (int b = from / 4; b * 4 < covered; ++b)
      for (int l = 0; l < 2; ++l)
        for (size_t i = 0; i < Layout().block_bytes(); ++i)
          if (pool_->block_ptr(l, got.ids()[b])[i] != Byte(b + salt, l, i)) {
            ADD_FAILURE() << "block " << b << " layer " << l << " byte " << i << " differs";
            return covered;
          }
    return covered;
  }
  std::unique_ptr<model::KvPool> pool_;
  BlockKey root_{};
  V tokens_;
};

// The eviction report: root, the tiers' key of each evicted block, its tokens and block, while
// the directory's reference is still held; a Clear reports only when asked; the destructor never.
TEST_F(WriteBackTest, TheDirectoryReportsEachEvictedBlockWithItsChainedKey) {
  Make(16);
  const std::vector<BlockKey> keys = ChainKeys(root_, tokens_, 4);
  std::vector<KeyedBlock> seen;
  std::vector<int> refs;
  std::vector<int32_t> ids;
  {
    PrefixDirectory dir(&pool_->allocator(), Dir(8));
    dir.set_on_evict([&](std::span<const KeyedBlock> b) {
      for (const KeyedBlock& k : b) {
        seen.push_back(k);
        refs.push_back(pool_->allocator().refcount(k.block));
      }
    });
    ids = Prefill(dir, tokens_);
    // Room for one more block than is free: the LRU leaf (the partial block) goes alone.
    EXPECT_EQ(dir.EvictForAllocation(pool_->allocator().free_count() + 1), 1);
    ASSERT_EQ(seen.size(), 1u);
    EXPECT_EQ(seen[0].root, root_);
    EXPECT_EQ(seen[0].key, keys[3]);
    EXPECT_EQ(seen[0].tokens, 2u);
    EXPECT_EQ(seen[0].block, ids[3]);
    EXPECT_EQ(refs[0], 1) << "reported after the directory let go of the block";
    // Then the next leaf, a full block whose parents stay cached.
    EXPECT_EQ(dir.EvictForAllocation(pool_->allocator().free_count() + 1), 1);
    ASSERT_EQ(seen.size(), 2u);
    EXPECT_EQ(seen[1].key, keys[2]);
    EXPECT_EQ(seen[1].tokens, 4u);
    EXPECT_EQ(seen[1].block, ids[2]);
    dir.Clear(/*closing=*/false);
    EXPECT_EQ(seen.size(), 2u) << "a Clear not asked to report reported";
    Prefill(dir, tokens_);
    dir.Clear(/*closing=*/false, /*report=*/true);
    EXPECT_EQ(seen.size(), 6u);
    Prefill(dir, tokens_);
  }
  EXPECT_EQ(seen.size(), 6u) << "the destructor reported";
  EXPECT_EQ(pool_->allocator().free_count(), 16);
}

// Write-back over a host tier and a disk: the insert writes nothing; evicting the whole prompt
// writes its 4 blocks (the partial one too), and only those; a fetch of the prompt finds them
// byte for byte, and a second cache over the disk folder alone (a restart) finds them too.
TEST_F(WriteBackTest, EvictionWritesExactlyTheEvictedBlocksReadBackByTheirPrefix) {
  Make(32);
  const fs::path dir = fs::temp_directory_path() / ("kv_write_back_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  DiskTier::Options o;
  o.dir = dir.string();
  o.identity = {root_, Layout()};
  o.model_hash = 1;
  o.secret = kSecret;
  o.capacity_bytes = 100 * EncodedBlockBytes(Layout());
  {
    std::vector<std::unique_ptr<KvTier>> tiers;
    tiers.push_back(Host(16));
    KvTier* host = tiers.back().get();
    tiers.push_back(DiskTier::Open(o).value());
    KvTier* disk = tiers.back().get();
    TieredCache tc(pool_.get(), 1, std::move(tiers));
    PrefixDirectory cache(&pool_->allocator(), Dir(16));
    cache.set_on_evict([&](std::span<const KeyedBlock> b) { tc.WriteBack(b); });
    Prefill(cache, tokens_);
    // Another prompt, cached and never evicted: never written.
    V other(8, 7);
    Prefill(cache, other, /*salt=*/50);
    tc.Flush();
    EXPECT_EQ(host->stats().written_blocks, 0u) << "write-back wrote at the prefill";
    EXPECT_EQ(disk->stats().written_blocks, 0u);
    // The prompt's blocks are the least recently used: room for 4 more blocks evicts them.
    EXPECT_EQ(cache.EvictForAllocation(pool_->allocator().free_count() + 4), 4);
    tc.Flush();
    EXPECT_EQ(host->stats().written_blocks, 4u);
    EXPECT_EQ(disk->stats().written_blocks, 4u);
    EXPECT_EQ(tc.stats().write_back_blocks, 4u);
    EXPECT_EQ(tc.stats().skipped_blocks, 0u);
    for (const BlockKey& k : ChainKeys(root_, other, 4)) EXPECT_FALSE(host->Contains(k));
    EXPECT_EQ(FetchChecked(tc, tokens_), 14);
    // Evicting the other prompt writes its 2 blocks, nothing of the first again.
    EXPECT_EQ(cache.EvictForAllocation(32), 2);
    tc.Flush();
    EXPECT_EQ(host->stats().written_blocks, 6u);
    EXPECT_EQ(tc.stats().write_back_blocks, 6u);
  }
  EXPECT_EQ(pool_->allocator().free_count(), 32);
  {
    std::vector<std::unique_ptr<KvTier>> tiers;
    tiers.push_back(DiskTier::Open(o).value());
    TieredCache tc(pool_.get(), 1, std::move(tiers));
    EXPECT_EQ(FetchChecked(tc, tokens_), 14);
  }
  EXPECT_EQ(pool_->allocator().free_count(), 32);
  fs::remove_all(dir);
}

// A leaf evicted while its parents stay cached is written under its own chained key: the
// fetch of the prompt from the cached prefix (8 tokens, in the pool) finds exactly it.
TEST_F(WriteBackTest, AnEvictedLeafIsWrittenUnderItsChainedKey) {
  Make(16);
  V tokens(tokens_.begin(), tokens_.begin() + 12);  // 3 full blocks
  const std::vector<BlockKey> keys = ChainKeys(root_, tokens, 4);
  std::vector<std::unique_ptr<KvTier>> tiers;
  tiers.push_back(Host(16));
  KvTier* host = tiers.back().get();
  {
    TieredCache tc(pool_.get(), 1, std::move(tiers));
    PrefixDirectory cache(&pool_->allocator(), Dir(8));
    cache.set_on_evict([&](std::span<const KeyedBlock> b) { tc.WriteBack(b); });
    Prefill(cache, tokens);
    EXPECT_EQ(cache.EvictForAllocation(pool_->allocator().free_count() + 1), 1);
    tc.Flush();
    EXPECT_EQ(host->stats().written_blocks, 1u);
    EXPECT_FALSE(host->Contains(keys[0]));
    EXPECT_FALSE(host->Contains(keys[1]));
    EXPECT_TRUE(host->Contains(keys[2]));
    PrefixDirectory::Match m = cache.Find(root_, tokens);
    ASSERT_EQ(m.tokens, 8);
    EXPECT_EQ(FetchChecked(tc, tokens, 8, m.lease.ids()), 12);
  }
  EXPECT_EQ(pool_->allocator().free_count(), 16);
}

// The write holds its own reference: an evicted block whose Put is held stays allocated (the
// pool cannot hand it out), and is freed once the write completes.
TEST_F(WriteBackTest, ABlockBeingWrittenBackIsNotReusedBeforeItsWriteCompletes) {
  Make(8);
  std::vector<std::unique_ptr<KvTier>> tiers;
  tiers.push_back(std::make_unique<GatedTier>(Host(16)));
  GatedTier* gated = static_cast<GatedTier*>(tiers.back().get());
  {
    TieredCache tc(pool_.get(), 1, std::move(tiers), {}, 2, false, /*write_threads=*/1);
    PrefixDirectory cache(&pool_->allocator(), Dir(6));
    cache.set_on_evict([&](std::span<const KeyedBlock> b) { tc.WriteBack(b); });
    V tokens(tokens_.begin(), tokens_.begin() + 8);  // 2 full blocks
    const std::vector<int32_t> ids = Prefill(cache, tokens);
    gated->SetOpen(false);
    EXPECT_EQ(cache.EvictForAllocation(8), 2);
    ASSERT_TRUE(gated->WaitEntered(1));
    EXPECT_EQ(tc.stats().queued_writes, 2u);
    for (int32_t id : ids) EXPECT_EQ(pool_->allocator().refcount(id), 1) << id;
    EXPECT_EQ(pool_->allocator().free_count(), 6);
    // Every free block taken: none of them is a block being written back.
    model::BlockLease all(&pool_->allocator(), {});
    EXPECT_FALSE(all.GrowToTokens(8 * 4, 4).ok());
    ASSERT_TRUE(all.GrowToTokens(6 * 4, 4).ok());
    for (int32_t id : all.ids()) EXPECT_TRUE(id != ids[0] && id != ids[1]) << id;
    all.Reset();
    gated->SetOpen(true);
    tc.Flush();
    EXPECT_EQ(gated->stats().written_blocks, 2u);
    for (int32_t id : ids) EXPECT_EQ(pool_->allocator().refcount(id), 0) << id;
    EXPECT_EQ(pool_->allocator().free_count(), 8);
  }
}

// The queue's bound (half the pool) applies: an eviction of more is skipped, counted, and its
// blocks freed at once; a shutdown's write-back (wait_for_room) writes them instead.
TEST_F(WriteBackTest, AFullQueueSkipsAndCountsAShutdownWaitsForRoom) {
  Make(8);  // bound: 4 blocks queued
  V tokens(tokens_.begin(), tokens_.begin() + 12);
  tokens.push_back(1);
  tokens.push_back(2);
  tokens.push_back(3);
  tokens.push_back(4);
  tokens.push_back(5);  // 17 tokens: 4 full blocks and 1
  std::vector<std::unique_ptr<KvTier>> tiers;
  tiers.push_back(Host(16));
  KvTier* host = tiers.back().get();
  {
    TieredCache tc(pool_.get(), 1, std::move(tiers));
    bool closing = false;
    PrefixDirectory cache(&pool_->allocator(), Dir(7));
    cache.set_on_evict([&](std::span<const KeyedBlock> b) { tc.WriteBack(b, closing); });
    Prefill(cache, tokens);
    EXPECT_EQ(cache.EvictForAllocation(8), 5);
    EXPECT_EQ(pool_->allocator().free_count(), 8) << "skipped blocks not returned at once";
    tc.Flush();
    EXPECT_EQ(tc.stats().skipped_blocks, 5u);
    EXPECT_EQ(tc.stats().write_back_blocks, 0u);
    EXPECT_EQ(host->stats().written_blocks, 0u);
    // The same at shutdown: written.
    Prefill(cache, tokens);
    closing = true;
    cache.Clear(/*closing=*/true, /*report=*/true);
    tc.Flush();
    EXPECT_EQ(host->stats().written_blocks, 5u);
    EXPECT_EQ(tc.stats().write_back_blocks, 5u);
    EXPECT_EQ(tc.stats().skipped_blocks, 5u);
  }
  EXPECT_EQ(pool_->allocator().free_count(), 8);
}

// Write-through (no eviction callback, WriteDown after the prefill): the insert's write-down
// writes every block, the evictions nothing more.
TEST_F(WriteBackTest, WriteThroughIsUnchanged) {
  Make(16);
  std::vector<std::unique_ptr<KvTier>> tiers;
  tiers.push_back(Host(16));
  KvTier* host = tiers.back().get();
  {
    TieredCache tc(pool_.get(), 1, std::move(tiers));
    PrefixDirectory cache(&pool_->allocator(), Dir(8));
    const std::vector<int32_t> ids = Prefill(cache, tokens_);
    tc.WriteDown(root_, tokens_, ids);
    tc.Flush();
    EXPECT_EQ(host->stats().written_blocks, 4u);
    EXPECT_EQ(cache.EvictForAllocation(16), 4);
    EXPECT_EQ(pool_->allocator().free_count(), 16);
    tc.Flush();
    EXPECT_EQ(host->stats().written_blocks, 4u);
    EXPECT_EQ(tc.stats().write_back_blocks, 0u);
    EXPECT_EQ(FetchChecked(tc, tokens_), 14);
  }
  EXPECT_EQ(pool_->allocator().free_count(), 16);
}

}  // namespace
}  // namespace kvstream::kvcache
