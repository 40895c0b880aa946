// Unit: a TieredCache staged through a PoolTier (kvcache/tiered_cache.h, "Staged"), the way the
// disk and store tiers sit below a GPU pool behind the pinned host tier, on a host pool: a fake
// PoolTier whose staging view is a host tier stands in for the pinned tier. Checked: a prompt's
// write-down reaches the disk only through the staging tier, after the pool tier's copy out;
// blocks read from disk are staged (pinned) and fetched by the pool tier byte for byte; the
// threshold and best_effort apply to the staging tier; a damaged disk entry ends the prefix
// (a miss, counted); blocks the disk and the store hold are not queued or written again;
// every pool block returned.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "kvcache/disk_tier.h"
#include "kvcache/host_tier.h"
#include "kvcache/pool_tier.h"
#include "kvcache/tiered_cache.h"
#include "tests/kvcache/tier_test_util.h"

namespace kvstream::kvcache {
namespace {

namespace fs = std::filesystem;
using V = std::vector<int32_t>;
using testing::Host;
using testing::Layout;

constexpr char kSecret[] = "0123456789abcdef0123456789abcdef";

class DonePrefetch final : public PoolPrefetch {
 public:
  DonePrefetch(int from, int tokens) : from_(from), tokens_(tokens) {}
  int from_tokens() const override { return from_; }
  int tokens() const override { return tokens_; }
  Status WaitLayer(int, void*) const override { return OkStatus(); }
  Status WaitAll() const override { return OkStatus(); }

 private:
  int from_, tokens_;
};

// The pinned tier's role on a host pool: its entries in a HostTier (the staging view), copies
// with memcpy, done at once; `written` runs from the call.
class FakePoolTier final : public PoolTier {
 public:
  FakePoolTier(model::KvPool* pool, int blocks) : pool_(pool), host_(Host(blocks)) {}
  std::unique_ptr<PoolPrefetch> Fetch(const BlockKey& root, std::span<const int32_t> tokens,
                                      int from, model::BlockLease* lease,
                                      const std::function<void(int)>&) override {
    const int bs = pool_->layout().block_size;
    const std::vector<BlockKey> keys = ChainKeys(root, tokens, bs);
    int covered = from;
    for (size_t b = size_t(from / bs); b < keys.size(); ++b) {
      const int end = std::min(int(tokens.size()), int(b + 1) * bs);
      if (!host_->Contains(keys[b]) || !lease->GrowToTokens(end, bs).ok()) break;
      if (!host_->Get(keys[b], Layers(lease->ids()[b])).ok()) break;
      covered = end;
    }
    fetches++;
    return std::make_unique<DonePrefetch>(from, covered);
  }
  void WriteDown(const BlockKey& root, std::span<const int32_t> tokens, const std::vector<int32_t>& ids,
                 std::function<void()> written) override {
    const int bs = pool_->layout().block_size;
    const std::vector<BlockKey> keys = ChainKeys(root, tokens, bs);
    for (size_t b = 0; b < keys.size(); ++b) {
      const auto out = Layers(ids[b]);
      const BlockHeader h{root, keys[b], 1, pool_->layout(),
                          uint32_t(std::min<int>(bs, int(tokens.size()) - int(b) * bs))};
      host_->Put(h, std::vector<std::span<const std::byte>>(out.begin(), out.end())).IgnoreError();
    }
    if (written) written();
  }
  void WriteBlocks(std::span<const KeyedBlock> blocks, std::function<void()> written) override {
    for (const KeyedBlock& b : blocks) {
      const auto out = Layers(b.block);
      const BlockHeader h{b.root, b.key, 1, pool_->layout(), b.tokens};
      host_->Put(h, std::vector<std::span<const std::byte>>(out.begin(), out.end())).IgnoreError();
    }
    if (written) written();
  }
  KvTier* staging() override { return host_.get(); }
  void Flush() override {}
  void EraseAll() override { host_->EraseAll(); }
  Stats stats() const override { return {}; }
  HostTier& host() { return *host_; }
  int fetches = 0;

 private:
  std::vector<std::span<std::byte>> Layers(int32_t id) {
    std::vector<std::span<std::byte>> l;
    for (int i = 0; i < pool_->layout().num_layers; ++i)
      l.emplace_back(pool_->block_ptr(i, id), pool_->layout().block_bytes());
    return l;
  }
  model::KvPool* pool_;
  std::unique_ptr<HostTier> host_;
};

// The store's role (a remote tier: Present is its one batched query, Put queues): blocks in
// memory, its Puts and queries counted.
class FakeStore final : public KvTier {
 public:
  FakeStore() : inner_(Host(16)) {}
  std::string_view name() const override { return "store"; }
  bool remote() const override { return true; }
  bool slow() const override { return true; }
  bool Contains(const BlockKey& k) override { return inner_->Contains(k); }
  std::vector<bool> Present(std::span<const BlockKey> keys) override {
    ++presents;
    return KvTier::Present(keys);
  }
  Status Get(const BlockKey& k, std::span<const std::span<std::byte>> layers) override {
    return inner_->Get(k, layers);
  }
  Status Put(const BlockHeader& h, std::span<const std::span<const std::byte>> layers) override {
    ++puts;
    return inner_->Put(h, layers);
  }
  void Erase(const BlockKey& k) override { inner_->Erase(k); }
  void EraseAll() override { inner_->EraseAll(); }
  TierStats stats() const override { return inner_->stats(); }
  std::atomic<int> puts{0}, presents{0};

 private:
  std::unique_ptr<HostTier> inner_;
};

// A pool, a prompt of 14 tokens (3 full blocks of 4, and 2) computed in `src_`, the fake pinned
// tier and a disk tier below it.
class StagedTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kv_staged_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    pool_ = model::CreateHostPool(Layout(), 64).value();
    root_ = RootKey(1, Layout(), "");
    tokens_.resize(14);
    std::iota(tokens_.begin(), tokens_.end(), 100);
    src_ = model::BlockLease(&pool_->allocator(), {});
    ASSERT_TRUE(src_.GrowToTokens(14, 4).ok());
    for (int32_t id : src_.ids())
      for (int l = 0; l < 2; ++l)
        for (size_t i = 0; i < Layout().block_bytes(); ++i)
          pool_->block_ptr(l, id)[i] = static_cast<std::byte>(id * 13 + l * 5 + i);
    below_ = std::make_unique<FakePoolTier>(pool_.get(), 8);
  }
  void Make(FetchPolicy policy, bool store = false) {
    DiskTier::Options o;
    o.dir = dir_.string();
    o.identity = {root_, Layout()};
    o.model_hash = 1;
    o.secret = kSecret;
    o.capacity_bytes = 100 * EncodedBlockBytes(Layout());
    auto disk = DiskTier::Open(o);
    ASSERT_TRUE(disk.ok()) << disk.status().ToString();
    disk_ = disk->get();
    std::vector<std::unique_ptr<KvTier>> tiers;
    tiers.push_back(std::make_unique<BorrowedTier>(below_->staging()));
    tiers.push_back(std::move(disk).value());
    if (store) {
      tiers.push_back(std::make_unique<FakeStore>());
      store_ = static_cast<FakeStore*>(tiers.back().get());
    }
    tc_ = std::make_unique<TieredCache>(pool_.get(), 1, std::move(tiers), policy, 2, /*staged=*/true);
  }
  void WriteDown() {
    below_->WriteDown(root_, tokens_, src_.ids(), [this] { tc_->WriteStaged(root_, tokens_); });
    tc_->Flush();
  }
  void TearDown() override {
    if (tc_) tc_->Stop();
    tc_.reset();
    below_.reset();
    src_.Reset();
    EXPECT_EQ(pool_->allocator().free_count(), pool_->num_blocks());
    fs::remove_all(dir_);
  }
  // Fetches from scratch through the staging tier; checks the bytes of every block fetched.
  int Fetch() {
    model::BlockLease got(&pool_->allocator(), {});
    auto p = tc_->Prepare(root_, tokens_, 0, DeadlineAfterMs(10000));
    auto pf = tc_->FillFrom(below_.get(), p.get(), tokens_, 0, &got, nullptr);
    const int tokens = pf ? pf->tokens() : 0;
    for (int b = 0; b < (tokens + 3) / 4; ++b)
      for (int l = 0; l < 2; ++l)
        EXPECT_EQ(0, std::memcmp(pool_->block_ptr(l, got.ids()[b]), pool_->block_ptr(l, src_.ids()[b]),
                                 Layout().block_bytes()))
            << "block " << b << " layer " << l;
    return tokens;
  }
  fs::path dir_;
  std::unique_ptr<model::KvPool> pool_;
  BlockKey root_{};
  V tokens_;
  model::BlockLease src_;
  std::unique_ptr<FakePoolTier> below_;
  DiskTier* disk_ = nullptr;
  FakeStore* store_ = nullptr;
  std::unique_ptr<TieredCache> tc_;
};

// Write-back below a GPU pool: the blocks a prefix directory evicts go to the pool tier
// (WriteBlocks), then from its staging view to the disk (WriteBackStaged), each under its own
// chained key: a leaf evicted alone lands alone; then the rest, and the prompt comes back up.
TEST_F(StagedTierTest, WriteBackGoesThroughTheStagingTierBlockByBlock) {
  Make({});
  const std::vector<BlockKey> keys = ChainKeys(root_, tokens_, 4);
  // lose: a block the staging tier loses before the writers reach it.
  auto evicted = [&](std::vector<size_t> blocks, int lose = -1) {
    std::vector<KeyedBlock> out;
    for (size_t b : blocks)
      out.push_back({root_, keys[b], uint32_t(std::min(4, 14 - int(b) * 4)), src_.ids()[b]});
    below_->WriteBlocks(out, [&, out] {
      if (lose >= 0) below_->host().Erase(keys[size_t(lose)]);
      tc_->WriteBackStaged(out);
    });
    tc_->Flush();
  };
  evicted({3});
  EXPECT_EQ(below_->host().stats().entries, 1u);
  EXPECT_EQ(disk_->stats().written_blocks, 1u);
  EXPECT_TRUE(disk_->Contains(keys[3]));
  EXPECT_FALSE(disk_->Contains(keys[0]));
  EXPECT_EQ(tc_->stats().write_back_blocks, 1u);
  // A block the staging tier lost is skipped, not the end of the others (no chain).
  evicted({2, 1, 0}, /*lose=*/1);
  EXPECT_EQ(disk_->stats().written_blocks, 3u);
  EXPECT_EQ(tc_->stats().write_back_blocks, 3u);
  EXPECT_FALSE(disk_->Contains(keys[1]));
  below_->host().EraseAll();
  EXPECT_EQ(Fetch(), 4);  // up to the block the disk lacks
  evicted({1});
  EXPECT_EQ(disk_->stats().written_blocks, 4u);
  below_->host().EraseAll();
  EXPECT_EQ(Fetch(), 14);
}

TEST_F(StagedTierTest, WriteDownReachesDiskThroughTheStagingTierAndComesBackUp) {
  Make({});
  // The staged cache never reads the pool itself.
  tc_->WriteDown(root_, tokens_, src_.ids());
  tc_->Flush();
  EXPECT_EQ(disk_->stats().written_blocks, 0u);
  WriteDown();
  EXPECT_EQ(below_->host().stats().entries, 4u);
  EXPECT_EQ(disk_->stats().written_blocks, 4u);
  EXPECT_EQ(Fetch(), 14);  // from the staging tier
  EXPECT_EQ(disk_->stats().hit_blocks, 0u);
  below_->EraseAll();
  EXPECT_EQ(Fetch(), 14);  // from disk, staged, then fetched by the pool tier
  EXPECT_EQ(disk_->stats().hit_blocks, 4u);
  EXPECT_EQ(below_->host().stats().entries, 4u);  // staged
  EXPECT_EQ(tc_->stats().fetched_tokens, 28u);
  EXPECT_EQ(tc_->stats().tiers[0].name, "host");
}

TEST_F(StagedTierTest, DamagedDiskEntryEndsThePrefixAsAMiss) {
  Make({});
  WriteDown();
  below_->EraseAll();
  // The third block's file flipped in its payload: the first two blocks come back, no more.
  const BlockKey k3 = ChainKeys(root_, tokens_, 4)[2];
  {
    std::fstream f(disk_->PathOf(k3), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(kBlockHeaderBytes + 3);
    f.put('\x5a');
  }
  EXPECT_EQ(Fetch(), 8);
  EXPECT_EQ(disk_->stats().read_failures, 1u);
  EXPECT_FALSE(disk_->Contains(k3));  // refused and deleted
  EXPECT_EQ(tc_->stats().recomputed_tokens, 6u);
}

TEST_F(StagedTierTest, ThresholdAndBestEffortApplyToTheStagingTier) {
  FetchPolicy p;
  p.threshold_tokens = 16;  // more than the prompt: computed, nothing fetched
  Make(p);
  WriteDown();
  EXPECT_EQ(Fetch(), 0);
  EXPECT_EQ(below_->fetches, 0);
  EXPECT_EQ(tc_->stats().recomputed_tokens, 14u);
}

TEST_F(StagedTierTest, BestEffortUsesTheStagingTierNowAndStagesDiskReadsForLater) {
  FetchPolicy p;
  p.mode = FetchPolicy::Mode::kBestEffort;
  Make(p);
  WriteDown();
  // The first two blocks in the staging tier, the rest only on disk.
  const std::vector<BlockKey> keys = ChainKeys(root_, tokens_, 4);
  below_->host().Erase(keys[2]);
  below_->host().Erase(keys[3]);
  EXPECT_EQ(Fetch(), 8);
  // The disk reads went on and left their blocks in the staging tier.
  for (int i = 0; i < 200 && !(below_->host().Contains(keys[2]) && below_->host().Contains(keys[3])); ++i)
    usleep(5000);
  EXPECT_EQ(Fetch(), 14);
}

// Issue 16: on the GPU path every prompt's write-down queued all its blocks again, those the
// disk (or the store) held included, so the queue's gauge stayed high and new blocks waited
// behind held ones. A second write-down of the same prompt queues nothing (the gauge stays 0)
// and writes nothing again.
TEST_F(StagedTierTest, ASecondWriteDownOfBlocksTheDiskHoldsQueuesNothing) {
  Make({});
  WriteDown();
  ASSERT_EQ(disk_->stats().written_blocks, 4u);
  const uint64_t bytes = disk_->stats().bytes_written;
  EXPECT_EQ(tc_->stats().held_blocks, 0u);
  below_->WriteDown(root_, tokens_, src_.ids(), [this] { tc_->WriteStaged(root_, tokens_); });
  EXPECT_EQ(tc_->stats().queued_writes, 0u) << "blocks the disk holds were queued";
  EXPECT_EQ(tc_->stats().held_blocks, 4u);
  tc_->Flush();
  EXPECT_EQ(disk_->stats().written_blocks, 4u);
  EXPECT_EQ(disk_->stats().bytes_written, bytes);
  EXPECT_EQ(tc_->stats().skipped_blocks, 0u);
}

// With the store below: its presence is asked once per write-down (batched) by the writer, and
// the blocks it holds are not copied out of the staging tier nor queued for it again; a longer
// prompt on the same prefix sends only its new blocks.
TEST_F(StagedTierTest, BlocksTheStoreHoldsAreNotCopiedToItAgain) {
  Make({}, /*store=*/true);
  WriteDown();
  ASSERT_EQ(store_->puts, 4);
  ASSERT_EQ(disk_->stats().written_blocks, 4u);
  WriteDown();
  EXPECT_EQ(store_->puts, 4) << "blocks the store holds were written to it again";
  EXPECT_EQ(store_->presents, 2);  // one batched query per write-down
  EXPECT_EQ(tc_->stats().held_blocks, 4u);
  EXPECT_EQ(tc_->stats().queued_writes, 0u);
  EXPECT_EQ(disk_->stats().written_blocks, 4u);
  // The next turn: the 3 full blocks and 6 new tokens (a 4th full block and a partial 5th).
  V longer(tokens_.begin(), tokens_.begin() + 12);
  for (int i = 0; i < 6; ++i) longer.push_back(900 + i);
  model::BlockLease more(&pool_->allocator(), {});
  ASSERT_TRUE(more.GrowToTokens(18, 4).ok());
  below_->WriteDown(root_, longer, more.ids(), [&] { tc_->WriteStaged(root_, longer); });
  tc_->Flush();
  EXPECT_EQ(store_->puts, 6);
  EXPECT_EQ(disk_->stats().written_blocks, 6u);
  EXPECT_EQ(tc_->stats().held_blocks, 7u);
  EXPECT_EQ(tc_->stats().queued_writes, 0u);
}

}  // namespace
}  // namespace kvstream::kvcache
