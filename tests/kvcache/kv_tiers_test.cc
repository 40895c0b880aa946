// Unit: the KV tiers below the pool (kvcache/host_tier.h, disk_tier.h, tiered_cache.h) over a
// real host pool: round trips, LRU with watermarks, retention age, the disk tier's files (mode,
// atomic names, index rebuilt at open, another model's entries never read), damaged /
// truncated / deleted / poisoned files refused as misses, a full disk tier, the write-down
// and fetch of a TieredCache, every pool block returned.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <csignal>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <numeric>
#include <thread>

#include "kvcache/disk_tier.h"
#include "kvcache/host_tier.h"
#include "tests/kvcache/tier_test_util.h"
#include "kvcache/tiered_cache.h"

namespace kvstream::kvcache {
namespace {

namespace fs = std::filesystem;
using V = std::vector<int32_t>;
const std::string kSecret = "unit-test-cluster-secret-0123";

using testing::GatedTier;
using testing::Host;
using testing::Layout;

// A block's layers filled from `seed`.
struct Block {
  BlockHeader header;
  std::vector<std::vector<std::byte>> layers;
  std::vector<std::span<const std::byte>> in() const { return {layers.begin(), layers.end()}; }
};
Block MakeBlock(int seed, uint64_t model = 1) {
  Block b;
  b.header.layout = Layout();
  b.header.model_hash = model;
  b.header.root = RootKey(model, Layout(), "");
  b.header.key = BlockKeyOf(b.header.root, V{seed, seed + 1, seed + 2, seed + 3});
  b.header.tokens = 4;
  for (int l = 0; l < Layout().num_layers; ++l) {
    b.layers.emplace_back(Layout().block_bytes());
    for (size_t i = 0; i < b.layers.back().size(); ++i)
      b.layers.back()[i] = static_cast<std::byte>(seed * 7 + l * 3 + i);
  }
  return b;
}

// Reads a block from `t`; true when its bytes equal `b`'s.
bool ReadsBack(KvTier& t, const Block& b) {
  std::vector<std::vector<std::byte>> out(b.layers.size(), std::vector<std::byte>(b.layers[0].size()));
  std::vector<std::span<std::byte>> spans(out.begin(), out.end());
  if (!t.Get(b.header.key, spans).ok()) return false;
  return out == b.layers;
}

TEST(HostTier, RoundTripLruAndWatermark) {
  auto t = Host(10);
  EXPECT_EQ(t->stats().capacity_bytes, 10 * EncodedBlockBytes(Layout()) - 10 * (kBlockHeaderBytes + kBlockTrailerBytes));
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(t->Put(MakeBlock(i).header, MakeBlock(i).in()).ok());
  EXPECT_EQ(t->stats().entries, 10u);
  EXPECT_TRUE(ReadsBack(*t, MakeBlock(0)));  // 0 is now the most recent
  // The 11th evicts down to the low watermark (floor(10 * 0.9) - 1 = 8), least recent first.
  ASSERT_TRUE(t->Put(MakeBlock(10).header, MakeBlock(10).in()).ok());
  EXPECT_EQ(t->stats().entries, 9u);
  EXPECT_EQ(t->stats().evicted_blocks, 2u);
  EXPECT_FALSE(t->Contains(MakeBlock(1).header.key));
  EXPECT_FALSE(t->Contains(MakeBlock(2).header.key));
  EXPECT_TRUE(ReadsBack(*t, MakeBlock(0)));
  EXPECT_TRUE(ReadsBack(*t, MakeBlock(10)));
  EXPECT_FALSE(ReadsBack(*t, MakeBlock(1)));
  EXPECT_EQ(t->stats().miss_blocks, 1u);
  // A Put of a held key keeps the entry.
  ASSERT_TRUE(t->Put(MakeBlock(0).header, MakeBlock(0).in()).ok());
  EXPECT_EQ(t->stats().entries, 9u);
  t->EraseAll();
  EXPECT_EQ(t->stats().entries, 0u);
  EXPECT_FALSE(t->Contains(MakeBlock(0).header.key));
}

TEST(HostTier, RetentionAgeAndTooSmall) {
  auto t = Host(4, /*max_age_s=*/1);
  ASSERT_TRUE(t->Put(MakeBlock(1).header, MakeBlock(1).in()).ok());
  EXPECT_TRUE(t->Contains(MakeBlock(1).header.key));
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_FALSE(t->Contains(MakeBlock(1).header.key));
  EXPECT_FALSE(ReadsBack(*t, MakeBlock(1)));
  HostTier::Options o;
  o.layout = Layout();
  o.capacity_bytes = 10;
  EXPECT_EQ(HostTier::Create(o, model::AllocateHostPoolMemory(4096).value()).status().code(),
            StatusCode::kInvalidArgument);
}

class DiskTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kv_disk_tier_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  DiskTier::Options Opts(uint64_t model = 1, int blocks = 100) {
    DiskTier::Options o;
    o.dir = dir_.string();
    o.identity = {RootKey(model, Layout(), ""), Layout()};
    o.model_hash = model;
    o.secret = kSecret;
    o.capacity_bytes = uint64_t(blocks) * EncodedBlockBytes(Layout());
    return o;
  }
  std::unique_ptr<DiskTier> Open(const DiskTier::Options& o) {
    auto t = DiskTier::Open(o);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return t.ok() ? std::move(t).value() : nullptr;
  }
  fs::path dir_;
};

TEST_F(DiskTierTest, FilesAreCompleteEntriesWithMode0600AndSurviveARestart) {
  {
    auto t = Open(Opts());
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(t->Put(MakeBlock(i).header, MakeBlock(i).in()).ok());
    EXPECT_TRUE(ReadsBack(*t, MakeBlock(3)));
    struct stat st {};
    ASSERT_EQ(::stat(t->PathOf(MakeBlock(3).header.key).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    ASSERT_EQ(::stat(dir_.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    EXPECT_EQ(t->stats().bytes_used, 5 * EncodedBlockBytes(Layout()));
  }
  // A write a crash cut short: a temporary file, removed at open, never an entry.
  std::ofstream(dir_ / ".tmp-partial") << "half an entry";
  auto t = Open(Opts());
  EXPECT_EQ(t->open_report().loaded, 5u);
  EXPECT_FALSE(fs::exists(dir_ / ".tmp-partial"));
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(ReadsBack(*t, MakeBlock(i))) << i;
  EXPECT_EQ(t->stats().hit_blocks, 5u);
}

TEST_F(DiskTierTest, AnotherModelsEntriesAreNeverRead) {
  {
    auto t = Open(Opts(/*model=*/1));
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(t->Put(MakeBlock(i, 1).header, MakeBlock(i, 1).in()).ok());
  }
  auto other = Open(Opts(/*model=*/2));
  EXPECT_EQ(other->open_report().loaded, 0u);
  EXPECT_EQ(other->open_report().foreign_entries, 3u);
  EXPECT_EQ(other->stats().entries, 0u);
  // The same tokens under the other model have other keys: nothing is found.
  EXPECT_FALSE(other->Contains(MakeBlock(0, 2).header.key));
  EXPECT_FALSE(other->Contains(MakeBlock(0, 1).header.key));
  // Left in place for their own model.
  EXPECT_EQ(Open(Opts(1))->open_report().loaded, 3u);
  // A block of another identity is refused on Put.
  EXPECT_FALSE(other->Put(MakeBlock(5, 1).header, MakeBlock(5, 1).in()).ok());
  // EraseAll removes every entry, of any model.
  other->EraseAll();
  EXPECT_EQ(Open(Opts(1))->open_report().loaded, 0u);
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(DiskTierTest, DamagedTruncatedDeletedAndPoisonedFilesAreMisses) {
  auto t = Open(Opts());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(t->Put(MakeBlock(i).header, MakeBlock(i).in()).ok());
  const auto path = [&](int i) { return t->PathOf(MakeBlock(i).header.key); };
  {  // 0: one payload byte flipped
    std::fstream f(path(0), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(kBlockHeaderBytes + 3);
    f.put('\x5a');
  }
  fs::resize_file(path(1), fs::file_size(path(1)) - 7);  // 1: truncated
  fs::remove(path(2));                                   // 2: deleted
  {  // 3: poisoned: other KV, valid CRC, HMAC made without the secret
    Block forged = MakeBlock(3);
    forged.layers[0][0] ^= std::byte{1};
    auto enc = EncodeBlock(forged.header, forged.in(), "a-forger-without-the-secret");
    ASSERT_TRUE(enc.ok());
    std::ofstream f(path(3), std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(enc->data()), std::streamsize(enc->size()));
  }
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(ReadsBack(*t, MakeBlock(i))) << i;
  EXPECT_EQ(t->stats().read_failures, 4u);
  EXPECT_EQ(t->stats().hit_blocks, 0u);
  // Each bad entry is dropped: no longer held, its file gone.
  for (int i = 0; i < 4; ++i) {
    EXPECT_FALSE(t->Contains(MakeBlock(i).header.key)) << i;
    EXPECT_FALSE(fs::exists(path(i))) << i;
  }
  EXPECT_EQ(t->stats().entries, 0u);
}

// Reads with O_DIRECT (the default: whole aligned pieces, the last one short at the end of the
// file) and buffered ones give the same blocks, at open and on Get; a file cut to an unaligned
// length is refused either way.
TEST_F(DiskTierTest, DirectAndBufferedReadsAgree) {
  for (bool direct : {true, false}) {
    SCOPED_TRACE(direct ? "O_DIRECT" : "buffered");
    fs::remove_all(dir_);
    auto o = Opts();
    o.direct_reads = direct;
    {
      auto t = Open(o);
      for (int i = 0; i < 3; ++i) ASSERT_TRUE(t->Put(MakeBlock(i).header, MakeBlock(i).in()).ok());
      for (int i = 0; i < 3; ++i) EXPECT_TRUE(ReadsBack(*t, MakeBlock(i))) << i;
    }
    o.direct_reads = !direct;  // the other way at the next open
    auto t = Open(o);
    EXPECT_EQ(t->open_report().loaded, 3u);
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(ReadsBack(*t, MakeBlock(i))) << i;
    fs::resize_file(t->PathOf(MakeBlock(1).header.key), EncodedBlockBytes(Layout()) - 13);
    EXPECT_FALSE(ReadsBack(*t, MakeBlock(1)));
    EXPECT_EQ(t->stats().read_failures, 1u);
    EXPECT_EQ(t->stats().hit_blocks, 3u);
  }
}

// Entries of whole 4 KiB pages and a tail (2 layers x 4096 bytes + 176): written with O_DIRECT
// (the pages) and buffered (the tail), or all buffered, the files are the exact entries and read
// back either way; a write that fails mid-file (RLIMIT_FSIZE) stores nothing and leaves no file.
TEST_F(DiskTierTest, DirectWritesOfWholePagesAndATail) {
  model::KvLayout big;
  big.num_layers = 2;
  big.num_kv_heads = 1;
  big.head_dim = 64;
  big.block_size = 16;  // 2 x 16 x 64 x 2 bytes = 4096 per layer
  ASSERT_EQ(big.block_bytes(), 4096u);
  auto block = [&](int seed) {
    Block b;
    b.header.layout = big;
    b.header.model_hash = 1;
    b.header.root = RootKey(1, big, "");
    b.header.key = BlockKeyOf(b.header.root, V{seed});
    b.header.tokens = 16;
    for (int l = 0; l < 2; ++l) {
      b.layers.emplace_back(4096);
      for (size_t i = 0; i < 4096; ++i) b.layers.back()[i] = static_cast<std::byte>(seed * 5 + l + i);
    }
    return b;
  };
  for (bool direct : {true, false}) {
    SCOPED_TRACE(direct ? "O_DIRECT" : "buffered");
    fs::remove_all(dir_);
    DiskTier::Options o = Opts();
    o.identity = {RootKey(1, big, ""), big};
    o.capacity_bytes = 10 * EncodedBlockBytes(big);
    o.direct_writes = direct;
    auto t = Open(o);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(t->Put(block(i).header, block(i).in()).ok());
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(fs::file_size(t->PathOf(block(i).header.key)), EncodedBlockBytes(big));
      EXPECT_TRUE(ReadsBack(*t, block(i))) << i;
    }
    EXPECT_EQ(Open(o)->open_report().loaded, 3u);
    struct rlimit old {};
    ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
    auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = old;
    small.rlim_cur = 6000;  // inside the second page
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
    Status s = t->Put(block(7).header, block(7).in());
    ::setrlimit(RLIMIT_FSIZE, &old);
    ::signal(SIGXFSZ, old_handler);
    EXPECT_FALSE(s.ok());
    EXPECT_FALSE(t->Contains(block(7).header.key));
    EXPECT_EQ(t->stats().write_failures, 1u);
    EXPECT_EQ(t->stats().bytes_used, 3 * EncodedBlockBytes(big));
    size_t files = 0;
    for (const auto& e : fs::directory_iterator(dir_)) {
      ++files;
      EXPECT_EQ(e.path().extension(), ".kvb") << e.path();
    }
    EXPECT_EQ(files, 3u);
  }
}

TEST_F(DiskTierTest, BadEntriesFoundAtOpenAreDeleted) {
  {
    auto t = Open(Opts());
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(t->Put(MakeBlock(i).header, MakeBlock(i).in()).ok());
    fs::resize_file(t->PathOf(MakeBlock(0).header.key), 100);
  }
  auto o = Opts();
  o.secret = kSecret + "-rotated";  // every entry fails its HMAC now
  auto t = Open(o);
  EXPECT_EQ(t->open_report().loaded, 0u);
  EXPECT_EQ(t->open_report().dropped, 3u);
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(DiskTierTest, FullTierEvictsLeastRecentAndRefusesWhatCannotFit) {
  auto t = Open(Opts(1, /*blocks=*/4));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(t->Put(MakeBlock(i).header, MakeBlock(i).in()).ok());
  EXPECT_TRUE(ReadsBack(*t, MakeBlock(0)));
  ASSERT_TRUE(t->Put(MakeBlock(4).header, MakeBlock(4).in()).ok());
  // Down to the low watermark (0.9 * 4 blocks) with room for the new one: 2 evicted.
  EXPECT_EQ(t->stats().entries, 3u);
  EXPECT_EQ(t->stats().evicted_blocks, 2u);
  EXPECT_TRUE(t->Contains(MakeBlock(0).header.key));
  EXPECT_FALSE(t->Contains(MakeBlock(1).header.key));
  EXPECT_LE(t->stats().bytes_used, t->stats().capacity_bytes);
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) files += e.path().extension() == ".kvb";
  EXPECT_EQ(files, 3u);
  // A capacity below one entry is refused at open.
  auto tiny = Opts(1, 0);
  tiny.capacity_bytes = 100;
  EXPECT_FALSE(DiskTier::Open(tiny).ok());
  // No secret, no disk tier.
  auto bare = Opts();
  bare.secret.clear();
  EXPECT_FALSE(DiskTier::Open(bare).ok());
}

// A disk that fills up mid-write (RLIMIT_FSIZE stands in for ENOSPC: the write stops short
// with an error, as root too): nothing is stored, no partial file is left, the tier goes on.
TEST_F(DiskTierTest, AWriteThatFailsMidwayStoresNothing) {
  auto t = Open(Opts());
  ASSERT_TRUE(t->Put(MakeBlock(0).header, MakeBlock(0).in()).ok());
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = EncodedBlockBytes(Layout()) / 2;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  Status s = t->Put(MakeBlock(1).header, MakeBlock(1).in());
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(t->stats().write_failures, 1u);
  EXPECT_EQ(t->stats().entries, 1u);
  EXPECT_EQ(t->stats().bytes_used, EncodedBlockBytes(Layout()));
  EXPECT_FALSE(t->Contains(MakeBlock(1).header.key));
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    ++files;
    EXPECT_EQ(e.path().extension(), ".kvb") << e.path();
  }
  EXPECT_EQ(files, 1u);
  // Room again: the same block is stored.
  ASSERT_TRUE(t->Put(MakeBlock(1).header, MakeBlock(1).in()).ok());
  EXPECT_TRUE(ReadsBack(*t, MakeBlock(1)));
}

// The TieredCache over a real host pool: a prompt written down from pool blocks comes back up
// into fresh blocks, byte for byte, from the host tier and (after the host tier lost it) from
// the disk tier; a partial prefix stops at the first block no tier holds.
TEST_F(DiskTierTest, WriteDownAndFetchThroughHostAndDisk) {
  auto pool = model::CreateHostPool(Layout(), 32).value();
  const uint64_t model_hash = 1;
  const BlockKey root = RootKey(model_hash, Layout(), "");
  std::vector<std::unique_ptr<KvTier>> tiers;
  tiers.push_back(Host(3));
  HostTier* host = static_cast<HostTier*>(tiers.back().get());
  tiers.push_back(Open(Opts()));
  {
    TieredCache tc(pool.get(), model_hash, std::move(tiers));
    V tokens(14);
    std::iota(tokens.begin(), tokens.end(), 100);  // 3 full blocks of 4 and 2 tokens
    model::BlockLease src(&pool->allocator(), {});
    ASSERT_TRUE(src.GrowToTokens(14, 4).ok());
    for (int32_t id : src.ids())
      for (int l = 0; l < 2; ++l)
        for (size_t i = 0; i < Layout().block_bytes(); ++i)
          pool->block_ptr(l, id)[i] = static_cast<std::byte>(id * 13 + l * 5 + i);
    auto expect_same = [&](const model::BlockLease& got, int blocks) {
      for (int b = 0; b < blocks; ++b)
        for (int l = 0; l < 2; ++l)
          ASSERT_EQ(0, std::memcmp(pool->block_ptr(l, got.ids()[b]), pool->block_ptr(l, src.ids()[b]),
                                   Layout().block_bytes()))
              << "block " << b << " layer " << l;
    };
    tc.WriteDown(root, tokens, src.ids());
    tc.Flush();
    EXPECT_EQ(tc.stats().queued_writes, 0u);
    // 4 blocks, 3 slots: the 4th evicts down to floor(3 * 0.9) - 1 = 1 entry first.
    EXPECT_EQ(host->stats().entries, 2u);
    {
      model::BlockLease got(&pool->allocator(), {});
      ASSERT_EQ(tc.Fetch(root, tokens, 0, &got, nullptr), 14);  // blocks 0-1 from disk, 2-3 host
      expect_same(got, 4);
    }
    // The host tier loses everything: the disk tier alone brings the prompt back.
    host->EraseAll();
    {
      model::BlockLease got(&pool->allocator(), {});
      ASSERT_EQ(tc.Fetch(root, tokens, 0, &got, nullptr), 14);
      expect_same(got, 4);
    }
    // A longer prompt with the same first 8 tokens: the 2 full blocks match, not the rest.
    V longer(tokens.begin(), tokens.begin() + 8);
    for (int i = 0; i < 10; ++i) longer.push_back(900 + i);
    {
      model::BlockLease got(&pool->allocator(), {});
      ASSERT_EQ(tc.Fetch(root, longer, 0, &got, nullptr), 8);
      expect_same(got, 2);
    }
    // Starting past a prefix the caller holds already.
    {
      model::BlockLease got(&pool->allocator(), {});
      ASSERT_TRUE(got.GrowToTokens(4, 4).ok());
      EXPECT_EQ(tc.Fetch(root, tokens, 4, &got, nullptr), 14);
    }
    // Another model's root finds nothing.
    {
      model::BlockLease got(&pool->allocator(), {});
      EXPECT_EQ(tc.Fetch(RootKey(2, Layout(), ""), tokens, 0, &got, nullptr), 0);
    }
    EXPECT_GE(tc.stats().fetched_tokens, 14u * 2 + 8 + 10);
    // Writes queued and then dropped by Stop return their blocks too.
    tc.WriteDown(root, longer, src.ids());
    tc.Stop();
  }
  EXPECT_EQ(pool->allocator().free_count(), 32);  // every block returned
}

// The write-down queue holds at most half the pool: a bigger write-down is skipped, counted.
TEST(TieredCache, WriteDownBeyondHalfThePoolIsSkipped) {
  auto pool = model::CreateHostPool(Layout(), 8).value();
  const BlockKey root = RootKey(1, Layout(), "");
  std::vector<std::unique_ptr<KvTier>> tiers;
  tiers.push_back(Host(16));
  {
    TieredCache tc(pool.get(), 1, std::move(tiers));
    model::BlockLease src(&pool->allocator(), {});
    ASSERT_TRUE(src.GrowToTokens(20, 4).ok());  // 5 blocks
    V tokens(20);
    std::iota(tokens.begin(), tokens.end(), 1);
    tc.WriteDown(root, tokens, src.ids());
    tc.Flush();
    EXPECT_EQ(tc.stats().skipped_blocks, 5u);
    EXPECT_EQ(tc.stats().tiers[0].stats.written_blocks, 0u);
    tokens.resize(12);  // 3 blocks: within half the pool
    tc.WriteDown(root, tokens, src.ids());
    tc.Flush();
    EXPECT_EQ(tc.stats().tiers[0].stats.written_blocks, 3u);
  }
  EXPECT_EQ(pool->allocator().free_count(), 8);
}

// A block every tier holds is not queued again (issue 16: a multi-turn run's write-down queue
// counted each turn's whole conversation): the second write-down of a prompt queues nothing,
// takes no pool block and writes nothing; a longer prompt on the same prefix queues only its
// new blocks, and the gauge counts those alone while they wait.
TEST(TieredCache, BlocksEveryTierHoldsAreNotQueuedAgain) {
  auto pool = model::CreateHostPool(Layout(), 32).value();
  const BlockKey root = RootKey(1, Layout(), "");
  std::vector<std::unique_ptr<KvTier>> tiers;
  tiers.push_back(Host(16));
  tiers.push_back(std::make_unique<GatedTier>(Host(16)));  // its writer held in a Put when closed
  KvTier* host = tiers[0].get();
  GatedTier* gated = static_cast<GatedTier*>(tiers[1].get());
  {
    TieredCache tc(pool.get(), 1, std::move(tiers));
    model::BlockLease src(&pool->allocator(), {});
    ASSERT_TRUE(src.GrowToTokens(20, 4).ok());  // 5 blocks
    V tokens(14);                                // 3 full blocks of 4 and 2 tokens
    std::iota(tokens.begin(), tokens.end(), 100);
    tc.WriteDown(root, tokens, src.ids());
    tc.Flush();
    ASSERT_EQ(host->stats().written_blocks, 4u);
    ASSERT_EQ(gated->stats().written_blocks, 4u);
    const uint64_t host_bytes = host->stats().bytes_written;
    const uint64_t gated_bytes = gated->stats().bytes_written;
    EXPECT_EQ(tc.stats().held_blocks, 0u);

    // The same prompt again, the writer held inside another write meanwhile: nothing queued,
    // no pool block referenced.
    gated->SetOpen(false);
    V other = {7, 7, 7, 7};
    tc.WriteDown(root, other, std::vector<int32_t>{src.ids()[4]});
    ASSERT_TRUE(gated->WaitEntered(5));
    EXPECT_EQ(tc.stats().queued_writes, 1u);
    tc.WriteDown(root, tokens, src.ids());
    EXPECT_EQ(tc.stats().queued_writes, 1u) << "blocks every tier holds were queued";
    EXPECT_EQ(tc.stats().held_blocks, 4u);
    for (int b = 0; b < 4; ++b) EXPECT_EQ(pool->allocator().refcount(src.ids()[b]), 1) << b;
    gated->SetOpen(true);
    tc.Flush();
    EXPECT_EQ(tc.stats().queued_writes, 0u);

    // The next turn: the first 12 tokens and 8 new ones (5 full blocks): the 3 held blocks are
    // not queued, the 2 new ones are, and the gauge counts them while they wait.
    V longer(tokens.begin(), tokens.begin() + 12);
    for (int i = 0; i < 8; ++i) longer.push_back(900 + i);
    gated->SetOpen(false);
    tc.WriteDown(root, longer, src.ids());
    ASSERT_TRUE(gated->WaitEntered(6));
    EXPECT_EQ(tc.stats().queued_writes, 2u);
    EXPECT_EQ(tc.stats().held_blocks, 7u);
    gated->SetOpen(true);
    tc.Flush();
    EXPECT_EQ(tc.stats().queued_writes, 0u);
    EXPECT_EQ(host->stats().written_blocks, 4u + 1 + 2);
    EXPECT_EQ(gated->stats().written_blocks, 4u + 1 + 2);
    // Nothing of the first prompt was written twice.
    const uint64_t per_block = host_bytes / 4;
    EXPECT_EQ(host->stats().bytes_written, host_bytes + 3 * per_block);
    EXPECT_EQ(gated->stats().bytes_written, gated_bytes + 3 * per_block);
    EXPECT_EQ(tc.stats().skipped_blocks, 0u);
  }
  EXPECT_EQ(pool->allocator().free_count(), 32);
}

}  // namespace
}  // namespace kvstream::kvcache
