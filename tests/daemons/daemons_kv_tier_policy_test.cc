// Integration: the KV tiers' admission policies (--kv_tier_policy, --kv_tier_timeout_ms,
// --kv_prefetch_threshold_tokens; docs/kv_tiers.md) in real daemons. Under every policy the
// tokens equal the colocated model's, bit for bit (CPU): a prompt computed, then, after a
// restart that leaves it only on disk, fetched (wait_complete, timeout) or computed while its
// blocks come up into host memory for the next request (best_effort); a hit under the default
// threshold of 256 tokens is computed and counted.
#include <filesystem>

#include "tests/daemons/kv_tiers_fixture.h"

namespace kvstream::testing {
namespace {

class KvTierPolicyTest : public KvTiersTest {
 protected:
  DaemonPair Pair(const std::string& policy, const std::string& threshold) {
    DaemonPair pair;
    pair.common = kTiny;
    pair.common.push_back("--pool_blocks=32");
    pair.prefill = {"--kv_host_tier_mb=1", "--kv_disk_tier_dir=" + dir_.path() + "/kv-" + policy,
                    "--kv_tier_policy=" + policy, "--kv_tier_timeout_ms=5000",
                    "--kv_tier_secret_file=" + SecretFile("kv.secret", "policy-test-secret-0123456")};
    if (!threshold.empty()) pair.prefill.push_back("--kv_prefetch_threshold_tokens=" + threshold);
    return pair;
  }
  // Computes `prompt`, restarts (the host tier empties, the disk tier keeps it) and runs it
  // again: returns the second run's cached tokens and whether it computed.
  void ComputeRestartRun(const DaemonPair& pair, const std::vector<int32_t>& prompt, int32_t* cached,
                         bool* computed) {
    ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
    ASSERT_NO_FATAL_FAILURE(Run(kTiny, prompt, cached, computed));
    EXPECT_EQ(*cached, 0);
    ASSERT_TRUE(WaitForPrefillIdle(prefill_address(), DeadlineAfterMs(5000)).ok());
    ASSERT_NO_FATAL_FAILURE(Restart(pair));
    ASSERT_NO_FATAL_FAILURE(Run(kTiny, prompt, cached, computed));
  }
  void Stop() {
    prefill_->Signal(SIGTERM);
    decode_->Signal(SIGTERM);
    EXPECT_EQ(prefill_->Wait(DeadlineAfterMs(15000)), 0);
    EXPECT_EQ(decode_->Wait(DeadlineAfterMs(15000)), 0);
  }
};

TEST_F(KvTierPolicyTest, EveryPolicyGivesTheColocatedTokens) {
  const auto prompt = MakePrompt(40, 512, 101);  // 39 tokens at the prefill: 2 blocks and 7
  int32_t cached = -1;
  bool computed = false;
  for (const std::string policy : {"wait_complete", "timeout"}) {
    SCOPED_TRACE(policy);
    ASSERT_NO_FATAL_FAILURE(ComputeRestartRun(Pair(policy, "0"), prompt, &cached, &computed));
    EXPECT_EQ(cached, 39);  // from disk
    EXPECT_FALSE(computed);
    Stop();
  }
  {
    SCOPED_TRACE("best_effort");
    ASSERT_NO_FATAL_FAILURE(ComputeRestartRun(Pair("best_effort", "0"), prompt, &cached, &computed));
    EXPECT_EQ(cached, 0);  // nothing in host memory yet: computed
    EXPECT_TRUE(computed);
    // The disk reads went on in the background: host memory holds the prompt now.
    const Deadline deadline = DeadlineAfterMs(10000);
    do {
      ASSERT_NO_FATAL_FAILURE(Run(kTiny, prompt, &cached, &computed));
    } while (cached == 0 && Clock::now() < deadline);
    EXPECT_EQ(cached, 39);
    EXPECT_FALSE(computed);
    auto st = WaitForPrefillIdle(prefill_address(), DeadlineAfterMs(5000));
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    EXPECT_GE(st->kv_tier_recomputed_tokens(), 39u);
    Stop();
  }
  {
    SCOPED_TRACE("default threshold");
    ASSERT_NO_FATAL_FAILURE(ComputeRestartRun(Pair("wait_complete", ""), prompt, &cached, &computed));
    EXPECT_EQ(cached, 0);  // 39 < 256 tokens: computed, not fetched
    EXPECT_TRUE(computed);
    auto st = WaitForPrefillIdle(prefill_address(), DeadlineAfterMs(5000));
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    EXPECT_EQ(st->kv_tier_recomputed_tokens(), 39u);
    EXPECT_EQ(st->kv_tier_fetched_tokens(), 0u);
  }
}

}  // namespace
}  // namespace kvstream::testing
