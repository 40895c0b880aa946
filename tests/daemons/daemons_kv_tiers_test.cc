// Integration: the prefill's KV tiers below its pool (docs/kv_tiers.md) with real
// kvstream-prefill and kvstream-decode processes (tiny preset, CPU backend, UCX on loopback):
// tokens equal with and without the tiers, whole and partial prefixes from the host and the
// disk tier, a restart that finds the disk tier (its own model's, another model's, another
// secret's), damaged / truncated / deleted block files, write-back (blocks written when the
// prompt cache evicts them and at shutdown), every pool block returned.
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/daemons/kv_tiers_fixture.h"

namespace kvstream::testing {
namespace {

namespace fs = std::filesystem;

TEST_F(KvTiersTest, HostTierServesWholeAndPartialPrefixesWithTheSameTokens) {
  DaemonPair pair;
  pair.common = kTiny;
  pair.common.push_back("--pool_blocks=32");
  // No prompt cache in the pool: the tier alone; every hit fetched, however short.
  pair.prefill = {"--kv_host_tier_mb=1", "--kv_prefetch_threshold_tokens=0"};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  const auto system = MakePrompt(32, 512, 81);  // two blocks of 16 at the prefill
  auto with = [&](int n, uint64_t seed) {
    auto p = system;
    auto user = MakePrompt(n, 512, seed);
    p.insert(p.end(), user.begin(), user.end());
    return p;
  };
  const auto first = with(8, 82);  // 39 tokens at the prefill: 2 blocks and 7 tokens
  int32_t cached = -1;
  bool computed = false;
  ASSERT_NO_FATAL_FAILURE(Run(kTiny, first, &cached, &computed));
  EXPECT_EQ(cached, 0);
  EXPECT_TRUE(computed);
  auto st = WaitForPrefillIdle(prefill_address(), DeadlineAfterMs(5000));
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  const v1::KvTierStats* host = Tier(*st, "host");
  ASSERT_NE(host, nullptr);
  EXPECT_EQ(host->written_blocks(), 3u);
  EXPECT_EQ(host->entries(), 3u);
  EXPECT_GT(host->capacity_bytes(), 0u);

  // The same prompt: every block from the host tier, no forward.
  ASSERT_NO_FATAL_FAILURE(Run(kTiny, first, &cached, &computed));
  EXPECT_EQ(cached, 39);
  EXPECT_FALSE(computed);
  // Another conversation with the same system prompt: its two blocks, the rest computed.
  const auto second = with(20, 83);
  ASSERT_NO_FATAL_FAILURE(Run(kTiny, second, &cached, &computed));
  EXPECT_EQ(cached, 32);
  EXPECT_TRUE(computed);
  st = WaitForPrefillIdle(prefill_address(), DeadlineAfterMs(5000));
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  host = Tier(*st, "host");
  EXPECT_EQ(host->hit_blocks(), 3u + 2u);
  EXPECT_EQ(host->read_failures(), 0u);
  EXPECT_EQ(host->entries(), 3u + 2u);  // second's own 2 blocks (the shared ones were there)
  EXPECT_EQ(st->kv_tier_fetched_tokens(), 39u + 32u);
  EXPECT_TRUE(WaitForAllBlocksFree(decode_address(), true, DeadlineAfterMs(5000)).ok());
  prefill_->Signal(SIGTERM);
  EXPECT_EQ(prefill_->Wait(DeadlineAfterMs(15000)), 0);
  EXPECT_NE(prefill_->Log().find("32/32 blocks free"), std::string::npos) << prefill_->Log();
}

TEST_F(KvTiersTest, DiskTierSurvivesARestartAndRefusesWhatDoesNotVerify) {
  const std::string tier_dir = dir_.path() + "/kv-disk";
  DaemonPair pair;
  pair.common = kTiny;
  pair.common.push_back("--pool_blocks=32");
  pair.prefill = {"--kv_disk_tier_dir=" + tier_dir, "--kv_disk_tier_mb=4",
                  "--kv_prefetch_threshold_tokens=0",
                  "--kv_tier_secret_file=" + SecretFile("kv.secret", "disk-tier-test-secret-0123")};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  const auto prompt = MakePrompt(40, 512, 91);
  int32_t cached = -1;
  bool computed = false;
  ASSERT_NO_FATAL_FAILURE(Run(kTiny, prompt, &cached, &computed));
  EXPECT_TRUE(computed);
  auto st = WaitForPrefillIdle(prefill_address(), DeadlineAfterMs(5000));
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ASSERT_NE(Tier(*st, "disk"), nullptr);
  EXPECT_EQ(Tier(*st, "disk")->written_blocks(), 3u);
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(tier_dir)) files.push_back(e.path());
  ASSERT_EQ(files.size(), 3u);
  for (const auto& f : files) {
    EXPECT_EQ(f.extension(), ".kvb");
    EXPECT_EQ(fs::status(f).permissions() & fs::perms::all, fs::perms::owner_read | fs::perms::owner_write);
  }

  // A restart finds the blocks on disk: no forward, the same tokens.
  ASSERT_NO_FATAL_FAILURE(Restart(pair));
  EXPECT_NE(prefill_->Log().find("3 entries"), std::string::npos) << prefill_->Log();
  ASSERT_NO_FATAL_FAILURE(Run(kTiny, prompt, &cached, &computed));
  EXPECT_EQ(cached, 39);
  EXPECT_FALSE(computed);
  st = WaitForPrefillIdle(prefill_address(), DeadlineAfterMs(5000));
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(Tier(*st, "disk")->hit_blocks(), 3u);

  // Another model (other weights: another identity) on the same directory: the entries are
  // left unread, its tokens are its own.
  DaemonPair other = pair;
  other.common.push_back("--seed=7");
  ASSERT_NO_FATAL_FAILURE(Restart(other));
  EXPECT_NE(prefill_->Log().find("3 of another model or layout left unread"), std::string::npos)
      << prefill_->Log();
  std::vector<std::string> seven = kTiny;
  seven.push_back("--seed=7");
  ASSERT_NO_FATAL_FAILURE(Run(seven, prompt, &cached, &computed));
  EXPECT_EQ(cached, 0);
  EXPECT_TRUE(computed);
  st = WaitForPrefillIdle(prefill_address(), DeadlineAfterMs(5000));
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(Tier(*st, "disk")->hit_blocks(), 0u);
  EXPECT_EQ(Tier(*st, "disk")->entries(), 3u);  // its own, beside the first model's

  // Back to the first model; its block files damaged: the first flipped, the second cut short,
  // the third deleted. Each is a miss, counted; the tokens are the same, computed again.
  ASSERT_NO_FATAL_FAILURE(Restart(pair));
  std::sort(files.begin(), files.end());
  {
    std::fstream f(files[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x7f');
  }
  fs::resize_file(files[1], fs::file_size(files[1]) / 2);
  fs::remove(files[2]);
  ASSERT_NO_FATAL_FAILURE(Run(kTiny, prompt, &cached, &computed));
  EXPECT_LT(cached, 39);
  EXPECT_TRUE(computed);
  st = WaitForPrefillIdle(prefill_address(), DeadlineAfterMs(5000));
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(Tier(*st, "disk")->read_failures(), 3u);

  // Another cluster secret: entries that do not verify (as a forger's would not) are deleted
  // at start and never used.
  DaemonPair rotated = pair;
  rotated.prefill.back() = "--kv_tier_secret_file=" + SecretFile("kv2.secret", "another-secret-0123456789");
  ASSERT_NO_FATAL_FAILURE(Restart(rotated));
  // (The log file holds every start's lines.) The first model's 3 damaged files were all read
  // above (in parallel), refused and deleted, and the computed prompt wrote all 3 again: they
  // fail their HMAC under the new secret.
  EXPECT_NE(prefill_->Log().find(", 3 that did not verify deleted"), std::string::npos)
      << prefill_->Log();
  st = WaitForPrefillIdle(prefill_address(), DeadlineAfterMs(5000));
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(Tier(*st, "disk")->entries(), 0u);
  ASSERT_NO_FATAL_FAILURE(Run(kTiny, prompt, &cached, &computed));
  EXPECT_EQ(cached, 0);
  EXPECT_TRUE(computed);

  // Erase everything (any model's) at start.
  DaemonPair erase = rotated;
  erase.prefill.push_back("--kv_disk_tier_erase");
  ASSERT_NO_FATAL_FAILURE(Restart(erase));
  EXPECT_TRUE(fs::is_empty(tier_dir));
  st = WaitForPrefillIdle(prefill_address(), DeadlineAfterMs(5000));
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(Tier(*st, "disk")->entries(), 0u);
  EXPECT_TRUE(WaitForAllBlocksFree(decode_address(), true, DeadlineAfterMs(5000)).ok());
  prefill_->Signal(SIGTERM);
  EXPECT_EQ(prefill_->Wait(DeadlineAfterMs(15000)), 0);
  EXPECT_NE(prefill_->Log().find("32/32 blocks free"), std::string::npos) << prefill_->Log();
}

// --kv_tier_write_policy write_back with a prompt cache of 4 blocks: a prefill writes nothing
// down; the next prompt's insert evicts the first's least recently used blocks, which are
// written then; a shutdown writes every cached block; after the restart (cache and host tier
// empty) both prompts come up from disk whole, without a forward, with the same tokens.
TEST_F(KvTiersTest, WriteBackWritesEvictedBlocksAndTheCacheAtShutdown) {
  const std::string tier_dir = dir_.path() + "/kv-disk";
  DaemonPair pair;
  pair.common = kTiny;
  pair.common.push_back("--pool_blocks=32");
  pair.prefill = {"--prompt_cache_blocks=4", "--kv_tier_write_policy=write_back",
                  "--kv_disk_tier_dir=" + tier_dir, "--kv_prefetch_threshold_tokens=0",
                  "--kv_tier_secret_file=" + SecretFile("kv.secret", "write-back-test-secret-012")};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  // The cache keeps its blocks: idle is nothing in flight nor queued.
  auto idle = [&] {
    auto stub = PrefillStub(prefill_address());
    Result<v1::StatsResponse> st = Timeout("prefill never idle");
    for (int i = 0; i < 200; ++i) {
      st = CallStats(*stub);
      if (st.ok() && st->requests_in_flight() == 0 && st->kv_tier_queued_blocks() == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return st;
  };
  const auto a = MakePrompt(40, 512, 95);  // 39 tokens at the prefill: 2 blocks and 7 tokens
  const auto b = MakePrompt(40, 512, 96);
  int32_t cached = -1;
  bool computed = false;
  ASSERT_NO_FATAL_FAILURE(Run(kTiny, a, &cached, &computed));
  EXPECT_TRUE(computed);
  auto st = idle();
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ASSERT_NE(Tier(*st, "disk"), nullptr);
  EXPECT_EQ(Tier(*st, "disk")->written_blocks(), 0u) << "write-back wrote at the prefill";
  EXPECT_EQ(st->pool().prompt_cache_blocks(), 3);
  // b's second block finds the cache full: down to floor(4 * 0.9) - 1 = 2 blocks, evicting a's
  // partial block and its second (its first, their parent, stays).
  ASSERT_NO_FATAL_FAILURE(Run(kTiny, b, &cached, &computed));
  EXPECT_TRUE(computed);
  st = idle();
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(Tier(*st, "disk")->written_blocks(), 2u);
  EXPECT_EQ(st->kv_tier_write_back_blocks(), 2u);
  EXPECT_EQ(st->kv_tier_skipped_blocks(), 0u);
  EXPECT_EQ(st->pool().prompt_cache_blocks(), 4);

  ASSERT_NO_FATAL_FAILURE(Restart(pair));
  EXPECT_NE(prefill_->Log().find("6 entries"), std::string::npos) << prefill_->Log();
  for (const auto& p : {a, b}) {
    ASSERT_NO_FATAL_FAILURE(Run(kTiny, p, &cached, &computed));
    EXPECT_EQ(cached, 39);
    EXPECT_FALSE(computed);
  }
  st = idle();
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(Tier(*st, "disk")->hit_blocks(), 6u);
  EXPECT_EQ(Tier(*st, "disk")->written_blocks(), 0u);
  EXPECT_TRUE(WaitForAllBlocksFree(decode_address(), true, DeadlineAfterMs(5000)).ok());
  prefill_->Signal(SIGTERM);
  EXPECT_EQ(prefill_->Wait(DeadlineAfterMs(15000)), 0);
  EXPECT_NE(prefill_->Log().find("32/32 blocks free"), std::string::npos) << prefill_->Log();
}

// Write-back under pool pressure: a pool of 8 blocks, a cache of up to 7. The third prompt
// finds 2 free blocks, evicts the least recently used cached block for its third, and waits for
// that block's write (to disk: long enough that the pool has no free block meanwhile) rather
// than failing; the first prompt, evicted whole, comes back from disk without a forward.
TEST_F(KvTiersTest, WriteBackUnderPoolPressureWaitsForTheEvictedBlocksWrite) {
  DaemonPair pair;
  pair.common = kTiny;
  pair.common.push_back("--pool_blocks=8");
  pair.prefill = {"--prompt_cache_blocks=7", "--kv_tier_write_policy=write_back",
                  "--kv_disk_tier_dir=" + dir_.path() + "/kv-disk", "--kv_prefetch_threshold_tokens=0",
                  "--kv_tier_secret_file=" + SecretFile("kv.secret", "write-back-test-secret-012")};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  int32_t cached = -1;
  bool computed = false;
  std::vector<std::vector<int32_t>> prompts;
  for (uint64_t seed : {101, 102, 103}) {
    prompts.push_back(MakePrompt(40, 512, seed));  // 3 blocks at the prefill
    ASSERT_NO_FATAL_FAILURE(Run(kTiny, prompts.back(), &cached, &computed));
    EXPECT_TRUE(computed);
  }
  auto stub = PrefillStub(prefill_address());
  auto st = CallStats(*stub);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  // One block evicted for room, two more by the third prompt's insert (down to 5 cached).
  EXPECT_EQ(st->kv_tier_write_back_blocks(), 3u);
  EXPECT_EQ(st->kv_tier_skipped_blocks(), 0u);
  EXPECT_EQ(st->counters().requests_failed(), 0u);
  ASSERT_NO_FATAL_FAILURE(Run(kTiny, prompts[0], &cached, &computed));
  EXPECT_EQ(cached, 39);
  EXPECT_FALSE(computed);
}

TEST_F(KvTiersTest, DiskTierWithoutASecretIsRefusedAtStart) {
  std::vector<std::string> args = DefaultDaemonFlags();
  args.push_back("--model=tiny");
  args.push_back("--kv_disk_tier_dir=" + dir_.path() + "/kv");
  DaemonProcess p("prefill-nosecret", PrefillBin(), args, dir_.path());
  EXPECT_FALSE(p.Start(DeadlineAfterMs(30000)).ok());
  EXPECT_NE(p.Log().find("kv_tier_secret_file"), std::string::npos) << p.Log();
  args.push_back("--kv_tier_secret_file=" + SecretFile("short.secret", "short"));
  DaemonProcess q("prefill-shortsecret", PrefillBin(), args, dir_.path());
  EXPECT_FALSE(q.Start(DeadlineAfterMs(30000)).ok());
  EXPECT_NE(q.Log().find("shorter than 16 bytes"), std::string::npos) << q.Log();
}

}  // namespace
}  // namespace kvstream::testing
