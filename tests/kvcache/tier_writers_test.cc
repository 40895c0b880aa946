// Unit: the write-down's writer threads (kvcache/tiered_cache.h, `write_threads`) over a real
// host pool and a real disk tier: many write-downs from several request threads at once land
// and verify (on disk, after a reopen); the writers run that many Puts at once and no more; a
// disk that fails every write mid-file with several writers stores nothing, leaves no file and
// returns every pool block; a Stop with a queue and writes in flight returns every block and
// brings the gauge back to 0.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <numeric>
#include <thread>

#include "kvcache/disk_tier.h"
#include "kvcache/tiered_cache.h"
#include "tests/kvcache/tier_test_util.h"

namespace kvstream::kvcache {
namespace {

namespace fs = std::filesystem;
using V = std::vector<int32_t>;
using testing::GatedTier;
using testing::Layout;
const std::string kSecret = "unit-test-cluster-secret-0123";
constexpr int kTokens = 14;  // 3 full blocks of 4 and a partial one

class TierWritersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kv_tier_writers_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    pool_ = model::CreateHostPool(Layout(), kPoolBlocks).value();
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<DiskTier> OpenDisk() {
    DiskTier::Options o;
    o.dir = dir_.string();
    o.identity = {root_, Layout()};
    o.model_hash = 1;
    o.secret = kSecret;
    o.capacity_bytes = 1000 * EncodedBlockBytes(Layout());
    auto t = DiskTier::Open(o);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return t.ok() ? std::move(t).value() : nullptr;
  }
  // Prompt p: its own tokens, and pool blocks filled with bytes of (p, block, layer, i).
  static V Tokens(int p) {
    V t(kTokens);
    std::iota(t.begin(), t.end(), 1000 * (p + 1));
    return t;
  }
  model::BlockLease Source(int p) {
    model::BlockLease lease(&pool_->allocator(), {});
    EXPECT_TRUE(lease.GrowToTokens(kTokens, Layout().block_size).ok());
    for (size_t b = 0; b < lease.ids().size(); ++b)
      for (int l = 0; l < Layout().num_layers; ++l)
        for (size_t i = 0; i < Layout().block_bytes(); ++i)
          pool_->block_ptr(l, lease.ids()[b])[i] = static_cast<std::byte>(p * 31 + b * 7 + l * 3 + i);
    return lease;
  }
  // Files in the tier's folder: entries and anything else (temporary files).
  std::pair<int, int> Files() const {
    int entries = 0, other = 0;
    for (const auto& e : fs::directory_iterator(dir_)) (e.path().extension() == ".kvb" ? entries : other)++;
    return {entries, other};
  }

  static constexpr int kPoolBlocks = 256;
  fs::path dir_;
  std::unique_ptr<model::KvPool> pool_;
  const BlockKey root_ = RootKey(1, Layout(), "");
};

// 16 prompts written down from 4 request threads at once, 4 writers: every block lands on disk
// (a reopen loads and verifies each), reads back byte for byte, and every pool block returns.
// The writers run 4 Puts at once, never 5.
TEST_F(TierWritersTest, ManyConcurrentWriteDownsLandAndVerify) {
  constexpr int kPrompts = 16, kBlocksEach = 4;
  std::vector<model::BlockLease> src;
  for (int p = 0; p < kPrompts; ++p) src.push_back(Source(p));
  {
    std::vector<std::unique_ptr<KvTier>> tiers;
    tiers.push_back(std::make_unique<GatedTier>(OpenDisk()));
    auto* gated = static_cast<GatedTier*>(tiers.back().get());
    TieredCache tc(pool_.get(), 1, std::move(tiers), {}, /*io_threads=*/2, /*staged=*/false,
                   /*write_threads=*/4);
    gated->SetOpen(false);
    std::vector<std::thread> requests;
    for (int r = 0; r < 4; ++r)
      requests.emplace_back([&, r] {
        for (int p = r; p < kPrompts; p += 4) tc.WriteDown(root_, Tokens(p), src[p].ids());
      });
    for (auto& t : requests) t.join();
    EXPECT_EQ(tc.stats().queued_writes, uint64_t(kPrompts * kBlocksEach));
    ASSERT_TRUE(gated->WaitEntered(4)) << "4 writers, fewer Puts at once: " << gated->entered();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(gated->entered(), 4) << "more Puts at once than writers";
    // The blocks taken stay referenced until written (their own reference, and src's).
    gated->SetOpen(true);
    tc.Flush();
    const TieredCache::Stats s = tc.stats();
    EXPECT_EQ(s.queued_writes, 0u);
    EXPECT_EQ(s.skipped_blocks, 0u);
    EXPECT_EQ(s.tiers[0].stats.written_blocks, uint64_t(kPrompts * kBlocksEach));
    EXPECT_EQ(s.tiers[0].stats.write_failures, 0u);
    EXPECT_EQ(gated->max_in_flight(), 4);
    for (const auto& lease : src)
      for (int32_t id : lease.ids()) EXPECT_EQ(pool_->allocator().refcount(id), 1) << id;
  }
  EXPECT_EQ(Files(), std::make_pair(kPrompts * kBlocksEach, 0));
  // A fresh tier over the folder: every entry verifies at open, and each prompt reads back.
  std::vector<std::unique_ptr<KvTier>> tiers;
  tiers.push_back(OpenDisk());
  auto* disk = static_cast<DiskTier*>(tiers.back().get());
  EXPECT_EQ(disk->open_report().loaded, uint64_t(kPrompts * kBlocksEach));
  EXPECT_EQ(disk->open_report().dropped, 0u);
  {
    TieredCache tc(pool_.get(), 1, std::move(tiers));
    for (int p = 0; p < kPrompts; ++p) {
      model::BlockLease got(&pool_->allocator(), {});
      ASSERT_EQ(tc.Fetch(root_, Tokens(p), 0, &got, nullptr), kTokens) << p;
      for (int b = 0; b < kBlocksEach; ++b)
        for (int l = 0; l < Layout().num_layers; ++l)
          ASSERT_EQ(0, std::memcmp(pool_->block_ptr(l, got.ids()[b]), pool_->block_ptr(l, src[p].ids()[b]),
                                   Layout().block_bytes()))
              << "prompt " << p << " block " << b << " layer " << l;
    }
  }
  src.clear();
  EXPECT_EQ(pool_->allocator().free_count(), kPoolBlocks);
}

// Every disk write fails midway (RLIMIT_FSIZE stands in for a full disk: the write stops short
// with an error, as root too) while 4 writers write 12 prompts: nothing is stored, no file is
// left (entries or temporary), the reservations are returned, every failure counted and every
// pool block returned; once the disk has room again the same write-downs land.
TEST_F(TierWritersTest, AFullDiskWithSeveralWritersStoresNothingAndLeaksNothing) {
  constexpr int kPrompts = 12, kBlocks = kPrompts * 4;
  {
    std::vector<std::unique_ptr<KvTier>> tiers;
    tiers.push_back(OpenDisk());
    TieredCache tc(pool_.get(), 1, std::move(tiers), {}, 2, false, /*write_threads=*/4);
    struct rlimit old {};
    ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
    auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = old;
    small.rlim_cur = EncodedBlockBytes(Layout()) / 2;
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
    for (int p = 0; p < kPrompts; ++p) {
      model::BlockLease src = Source(p);
      tc.WriteDown(root_, Tokens(p), src.ids());
    }  // the request's own references go at once: the queue holds the blocks alone
    tc.Flush();
    ::setrlimit(RLIMIT_FSIZE, &old);
    ::signal(SIGXFSZ, old_handler);
    TieredCache::Stats s = tc.stats();
    EXPECT_EQ(s.queued_writes, 0u);
    EXPECT_EQ(s.tiers[0].stats.write_failures, uint64_t(kBlocks));
    EXPECT_EQ(s.tiers[0].stats.written_blocks, 0u);
    EXPECT_EQ(s.tiers[0].stats.entries, 0u);
    EXPECT_EQ(s.tiers[0].stats.bytes_used, 0u) << "a failed write kept its reservation";
    EXPECT_EQ(Files(), std::make_pair(0, 0));
    EXPECT_EQ(pool_->allocator().free_count(), kPoolBlocks);
    // Room again: the same prompts are written.
    for (int p = 0; p < kPrompts; ++p) tc.WriteDown(root_, Tokens(p), Source(p).ids());
    tc.Flush();
    s = tc.stats();
    EXPECT_EQ(s.tiers[0].stats.written_blocks, uint64_t(kBlocks));
    EXPECT_EQ(s.tiers[0].stats.bytes_used, uint64_t(kBlocks) * EncodedBlockBytes(Layout()));
  }
  EXPECT_EQ(Files(), std::make_pair(kBlocks, 0));
  EXPECT_EQ(pool_->allocator().free_count(), kPoolBlocks);
}

// A Stop with 4 writes in flight and 36 blocks queued: the queued ones are dropped at once (the
// gauge counts only those in flight), the ones in flight finish whole, and every pool block
// returns (the request's own references went when it returned).
TEST_F(TierWritersTest, StopWithAQueueAndWritesInFlightReturnsEveryBlock) {
  constexpr int kPrompts = 10, kBlocks = kPrompts * 4;
  std::vector<std::unique_ptr<KvTier>> tiers;
  tiers.push_back(std::make_unique<GatedTier>(OpenDisk()));
  auto* gated = static_cast<GatedTier*>(tiers.back().get());
  auto tc = std::make_unique<TieredCache>(pool_.get(), 1, std::move(tiers), FetchPolicy{}, 2, false,
                                          /*write_threads=*/4);
  gated->SetOpen(false);
  for (int p = 0; p < kPrompts; ++p) tc->WriteDown(root_, Tokens(p), Source(p).ids());
  ASSERT_TRUE(gated->WaitEntered(4));
  EXPECT_EQ(tc->stats().queued_writes, uint64_t(kBlocks));
  EXPECT_EQ(pool_->allocator().free_count(), kPoolBlocks - kBlocks);
  std::thread stopper([&] { tc->Stop(); });
  // Stop drops the queued blocks before it waits for the writers.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (tc->stats().queued_writes != 4 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(tc->stats().queued_writes, 4u);
  EXPECT_EQ(pool_->allocator().free_count(), kPoolBlocks - 4) << "dropped blocks not returned";
  gated->SetOpen(true);
  stopper.join();
  const TieredCache::Stats s = tc->stats();
  EXPECT_EQ(s.queued_writes, 0u);
  EXPECT_EQ(s.tiers[0].stats.written_blocks, 4u);
  EXPECT_EQ(gated->entered(), 4);
  EXPECT_EQ(pool_->allocator().free_count(), kPoolBlocks);
  tc.reset();
  EXPECT_EQ(Files(), std::make_pair(4, 0));
}

}  // namespace
}  // namespace kvstream::kvcache
