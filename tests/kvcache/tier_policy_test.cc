// Unit: TieredCache's read path (kvcache/tiered_cache.h) with a slow tier read on I/O threads:
// the admission policies (best_effort, timeout, wait_complete), the prefetch threshold, failed
// and late reads as misses, pinned entries surviving evictions between Prepare and Fill, and
// the bytes fetched always those written.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>

#include "kvcache/host_tier.h"
#include "tests/kvcache/tier_test_util.h"
#include "kvcache/tiered_cache.h"

namespace kvstream::kvcache {
namespace {

using V = std::vector<int32_t>;
using std::chrono::milliseconds;

using testing::Host;
using testing::Layout;

// A slow tier (like disk or the store): blocks in memory, each Get delayed or failed at will.
class SlowTier final : public KvTier {
 public:
  SlowTier() : inner_(Host(64)) {}
  std::string_view name() const override { return "slow"; }
  bool slow() const override { return true; }
  bool Contains(const BlockKey& k) override { return inner_->Contains(k); }
  Status Get(const BlockKey& k, std::span<const std::span<std::byte>> layers) override {
    milliseconds delay{0};
    bool fail = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = delay_.find(k); it != delay_.end()) delay = it->second;
      fail = fail_.count(k) != 0;
    }
    std::this_thread::sleep_for(delay);
    ++gets;
    if (fail) return DataLoss("slow tier: refused");
    return inner_->Get(k, layers);
  }
  Status Put(const BlockHeader& h, std::span<const std::span<const std::byte>> layers) override {
    return inner_->Put(h, layers);
  }
  void Erase(const BlockKey& k) override { inner_->Erase(k); }
  void EraseAll() override { inner_->EraseAll(); }
  TierStats stats() const override { return inner_->stats(); }

  void Delay(const BlockKey& k, milliseconds d) {
    std::lock_guard<std::mutex> lock(mu_);
    delay_[k] = d;
  }
  void Fail(const BlockKey& k) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_.insert(k);
  }
  std::atomic<int> gets{0};

 private:
  std::unique_ptr<HostTier> inner_;
  std::mutex mu_;
  std::map<BlockKey, milliseconds> delay_;
  std::set<BlockKey> fail_;
};

// A host tier whose Pin takes its time (as under load): what a slow read started meanwhile does
// to the entries a fetch is about to pin shows.
class SlowPinHost final : public KvTier {
 public:
  explicit SlowPinHost(int blocks) : inner_(Host(blocks)) {}
  std::string_view name() const override { return "host"; }
  bool Contains(const BlockKey& k) override { return inner_->Contains(k); }
  Status Get(const BlockKey& k, std::span<const std::span<std::byte>> layers) override {
    return inner_->Get(k, layers);
  }
  Status Put(const BlockHeader& h, std::span<const std::span<const std::byte>> layers) override {
    return inner_->Put(h, layers);
  }
  bool Pin(const BlockKey& k) override {
    std::this_thread::sleep_for(milliseconds(100));
    return inner_->Pin(k);
  }
  void Unpin(const BlockKey& k) override { inner_->Unpin(k); }
  void Erase(const BlockKey& k) override { inner_->Erase(k); }
  void EraseAll() override { inner_->EraseAll(); }
  TierStats stats() const override { return inner_->stats(); }

 private:
  std::unique_ptr<HostTier> inner_;
};

// A pool, a prompt of 14 tokens (3 full blocks of 4 and 2) written down to a host tier and a
// slow tier, and the means to fetch it back and compare.
class TierPolicyTest : public ::testing::Test {
 protected:
  void Make(FetchPolicy policy, int host_blocks = 8, bool slow_pin = false) {
    pool_ = model::CreateHostPool(Layout(), 64).value();
    root_ = RootKey(1, Layout(), "");
    std::vector<std::unique_ptr<KvTier>> tiers;
    if (slow_pin) {
      tiers.push_back(std::make_unique<SlowPinHost>(host_blocks));
    } else {
      tiers.push_back(Host(host_blocks));
      host_ = static_cast<HostTier*>(tiers.back().get());
    }
    tiers.push_back(std::make_unique<SlowTier>());
    slow_ = static_cast<SlowTier*>(tiers.back().get());
    tc_ = std::make_unique<TieredCache>(pool_.get(), 1, std::move(tiers), policy, 2);
    tokens_.resize(14);
    std::iota(tokens_.begin(), tokens_.end(), 100);
    src_ = model::BlockLease(&pool_->allocator(), {});
    ASSERT_TRUE(src_.GrowToTokens(14, 4).ok());
    for (int32_t id : src_.ids())
      for (int l = 0; l < 2; ++l)
        for (size_t i = 0; i < Layout().block_bytes(); ++i)
          pool_->block_ptr(l, id)[i] = static_cast<std::byte>(id * 13 + l * 5 + i);
    tc_->WriteDown(root_, tokens_, src_.ids());
    tc_->Flush();
    BlockKey k = root_;
    for (size_t pos = 0; pos < tokens_.size(); pos += 4) {
      k = BlockKeyOf(k, std::span<const int32_t>(tokens_).subspan(pos, std::min<size_t>(4, 14 - pos)));
      keys_.push_back(k);
    }
  }
  void TearDown() override {
    if (tc_) tc_->Stop();
    tc_.reset();
    src_.Reset();
    if (pool_) {
      EXPECT_EQ(pool_->allocator().free_count(), pool_->num_blocks());
    }
  }
  // Fetches from scratch; checks the bytes of every block fetched.
  int Fetch(Deadline deadline = DeadlineAfterMs(10000)) {
    model::BlockLease got(&pool_->allocator(), {});
    const int covered = tc_->Fetch(root_, tokens_, 0, &got, nullptr, deadline);
    for (int b = 0; b < (covered + 3) / 4; ++b)
      for (int l = 0; l < 2; ++l)
        EXPECT_EQ(0, std::memcmp(pool_->block_ptr(l, got.ids()[b]), pool_->block_ptr(l, src_.ids()[b]),
                                 Layout().block_bytes()))
            << "block " << b << " layer " << l;
    return covered;
  }
  // Only the slow tier holds the prompt.
  void HostLosesAll() { host_->EraseAll(); }
  bool HostHoldsAll() {
    for (const auto& k : keys_)
      if (!host_->Contains(k)) return false;
    return true;
  }

  std::unique_ptr<model::KvPool> pool_;
  BlockKey root_{};
  HostTier* host_ = nullptr;
  SlowTier* slow_ = nullptr;
  std::unique_ptr<TieredCache> tc_;
  V tokens_;
  model::BlockLease src_;
  std::vector<BlockKey> keys_;
};

TEST_F(TierPolicyTest, BestEffortUsesHostMemoryNowAndPromotesTheRestForLater) {
  ASSERT_NO_FATAL_FAILURE(Make({FetchPolicy::Mode::kBestEffort}));
  host_->Erase(keys_[1]);
  host_->Erase(keys_[2]);
  host_->Erase(keys_[3]);
  for (const auto& k : keys_) slow_->Delay(k, milliseconds(200));
  const auto t0 = Clock::now();
  EXPECT_EQ(Fetch(), 4);  // block 0 from host memory; nothing waited for
  EXPECT_LT(Clock::now() - t0, milliseconds(150));
  EXPECT_EQ(tc_->stats().recomputed_tokens, 10u);
  // The reads went on: the blocks are in host memory for the next request.
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (!HostHoldsAll() && Clock::now() < until) std::this_thread::sleep_for(milliseconds(10));
  ASSERT_TRUE(HostHoldsAll());
  EXPECT_EQ(Fetch(), 14);
}

TEST_F(TierPolicyTest, TimeoutTrimsAtTheFirstLateRead) {
  ASSERT_NO_FATAL_FAILURE(Make({FetchPolicy::Mode::kTimeout, milliseconds(150)}));
  HostLosesAll();
  slow_->Delay(keys_[2], milliseconds(1500));
  const auto t0 = Clock::now();
  EXPECT_EQ(Fetch(), 8);
  const auto waited = Clock::now() - t0;
  EXPECT_GE(waited, milliseconds(140));
  EXPECT_LT(waited, milliseconds(1000));
  const auto s = tc_->stats();
  EXPECT_EQ(s.late_blocks, 1u);
  EXPECT_EQ(s.recomputed_tokens, 6u);
  EXPECT_EQ(s.fetched_tokens, 8u);
}

TEST_F(TierPolicyTest, WaitCompleteWaitsForEveryReadByTheDeadline) {
  ASSERT_NO_FATAL_FAILURE(Make({FetchPolicy::Mode::kWaitComplete}));
  HostLosesAll();
  for (const auto& k : keys_) slow_->Delay(k, milliseconds(100));
  const auto t0 = Clock::now();
  EXPECT_EQ(Fetch(), 14);  // two I/O threads: two rounds of 100 ms
  EXPECT_GE(Clock::now() - t0, milliseconds(190));
  // A read slower than the request's deadline: computed, by the deadline, never a hang.
  HostLosesAll();
  for (const auto& k : keys_) slow_->Delay(k, milliseconds(2000));
  const auto t1 = Clock::now();
  EXPECT_EQ(Fetch(DeadlineAfterMs(200)), 0);
  EXPECT_LT(Clock::now() - t1, milliseconds(1500));
  EXPECT_GE(tc_->stats().late_blocks, 1u);
}

TEST_F(TierPolicyTest, AFailedReadIsAMissAndEndsThePrefix) {
  for (auto mode : {FetchPolicy::Mode::kTimeout, FetchPolicy::Mode::kWaitComplete}) {
    ASSERT_NO_FATAL_FAILURE(Make({mode, milliseconds(2000)}));
    HostLosesAll();
    slow_->Fail(keys_[1]);
    EXPECT_EQ(Fetch(), 4);  // block 2 read fine, but follows the miss: never used
    EXPECT_EQ(tc_->stats().recomputed_tokens, 10u);
    TearDown();
    keys_.clear();
  }
}

TEST_F(TierPolicyTest, HitsUnderTheThresholdAreRecomputed) {
  ASSERT_NO_FATAL_FAILURE(Make({FetchPolicy::Mode::kWaitComplete, milliseconds(50), 12}));
  HostLosesAll();
  EXPECT_EQ(Fetch(), 14);  // 14 >= 12 tokens
  // A prompt sharing 8 tokens: 8 < 12, computed instead, nothing read.
  V other(tokens_.begin(), tokens_.begin() + 8);
  for (int i = 0; i < 8; ++i) other.push_back(700 + i);
  HostLosesAll();
  const int gets = slow_->gets;
  model::BlockLease got(&pool_->allocator(), {});
  EXPECT_EQ(tc_->Fetch(root_, other, 0, &got, nullptr), 0);
  EXPECT_EQ(slow_->gets, gets);
  EXPECT_EQ(tc_->stats().recomputed_tokens, 8u);
}

TEST_F(TierPolicyTest, PinnedBlocksSurviveEvictionsBetweenPrepareAndFill) {
  ASSERT_NO_FATAL_FAILURE(Make({FetchPolicy::Mode::kWaitComplete}, /*host_blocks=*/4));
  ASSERT_TRUE(HostHoldsAll());
  auto pending = tc_->Prepare(root_, tokens_, 0, DeadlineAfterMs(5000));
  ASSERT_NE(pending, nullptr);
  // Other prompts fill the host tier meanwhile: unpinned entries only may go.
  for (int i = 0; i < 8; ++i) {
    V t = {900 + i, 901 + i, 902 + i, 903 + i};
    tc_->WriteDown(root_, t, {src_.ids()[0]});
    tc_->Flush();
  }
  EXPECT_TRUE(HostHoldsAll());
  const int slow_gets = slow_->gets;
  model::BlockLease got(&pool_->allocator(), {});
  EXPECT_EQ(tc_->Fill(pending.get(), 0, &got, nullptr), 14);
  EXPECT_EQ(slow_->gets, slow_gets);  // every block from host memory
  pending.reset();
  got.Reset();
  // Unpinned now: the next write evicts.
  V t = {990, 991, 992, 993};
  tc_->WriteDown(root_, t, {src_.ids()[0]});
  tc_->Flush();
  EXPECT_FALSE(HostHoldsAll());
}

// 4 blocks, 3 host slots: the write-down leaves blocks 2-3 in host memory, 0-1 in the slow tier
// alone. The fetch reads 0-1 from the slow tier, which promotes them into host memory; that must
// not evict 2-3, which the fetch uses (it pins them before any slow read starts).
TEST_F(TierPolicyTest, SlowReadsPromotingBlocksDoNotEvictTheFetchsOwnHostBlocks) {
  ASSERT_NO_FATAL_FAILURE(Make({FetchPolicy::Mode::kWaitComplete}, /*host_blocks=*/3,
                               /*slow_pin=*/true));
  EXPECT_EQ(Fetch(), 14);
  EXPECT_EQ(slow_->gets, 2);
}

}  // namespace
}  // namespace kvstream::kvcache
