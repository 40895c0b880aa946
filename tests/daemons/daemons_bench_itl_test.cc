// Integration: `kvstream bench itl` against real daemons (tiny preset, CPU backend, UCX), and the
// ITL-target pacing keys as the prefill daemon applies them.
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "tests/daemons/disagg_fixture.h"

namespace kvstream::testing {
namespace {

// `kvstream bench itl` against the running pair, and the JSON lines it wrote, by kind/phase.
class BenchItlTest : public DisaggTest {
 protected:
  std::string RunBenchItl(const std::string& flags, int* rc) {
    return RunCapture(std::string(KVSTREAM_CLI_BIN) + " bench itl --decode " + decode_address() +
                          " --prefill " + prefill_address() + " " + flags + " --json-out " +
                          json_path(),
                      rc, /*with_stderr=*/true);
  }
  std::string json_path() const { return dir_.path() + "/itl.jsonl"; }
  // "idle" / "landing" -> that phase's itl_phase line; "comparison" -> the itl_comparison line.
  std::map<std::string, nlohmann::json> ReadJson() const {
    std::map<std::string, nlohmann::json> out;
    std::ifstream in(json_path());
    std::string line;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line);
      if (j["kind"] == "itl_phase") out[j["phase"].get<std::string>()] = j;
      if (j["kind"] == "itl_comparison") out["comparison"] = j;
    }
    return out;
  }
};

TEST_F(BenchItlTest, MeasuresIdleAndLandingPhases) {
  DaemonPair pair;
  pair.common = {"--model=tiny"};
  pair.prefill = {"--pool_blocks=64", "--prompt_cache_blocks=32"};
  pair.decode = {"--pool_blocks=1024", "--max_batch=16"};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  int rc = 0;
  std::string out = RunBenchItl(
      "--streams 4 --stream-prompt-len 24 --stream-max-tokens 1000 --landing-clients 2"
      " --landing-prompt-len 200 --rounds 2 --phase-s 0.6 --min-samples 120 --settle-ms 100 --warmup-s 0.2"
      " --label cpu-test",
      &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("ITL p50"), std::string::npos) << out;
  auto phases = ReadJson();
  const nlohmann::json comparison = phases["comparison"];
  phases.erase("comparison");
  ASSERT_EQ(phases.size(), 2u) << out;
  for (auto& [name, j] : phases) {
    SCOPED_TRACE(name);
    EXPECT_EQ(j["label"], "cpu-test");
    // Enough samples for a p99, and finite, ordered, non-zero figures.
    EXPECT_GE(j["samples"].get<int>(), 100) << j.dump();
    const double p50 = j["itl_ms"]["p50"].get<double>(), p99 = j["itl_ms"]["p99"].get<double>();
    EXPECT_TRUE(std::isfinite(p50) && p50 > 0) << j.dump();
    EXPECT_TRUE(std::isfinite(p99) && p99 >= p50) << j.dump();
    EXPECT_GE(j["itl_ms"]["max"].get<double>(), p99);
    // The decode's clock and the client's agree on the typical gap (same steps, seen twice).
    const double client = j["client_itl_ms"]["p50"].get<double>();
    EXPECT_GT(client, 0.3 * p50) << j.dump();
    EXPECT_LT(client, 3 * p50 + 1) << j.dump();
    EXPECT_GT(j["tokens_per_s"].get<double>(), 0) << j.dump();
    // The decode's own split of its step: steps counted, forward within the loop, and a loop
    // time near the streams' ITL (one step per token of every stream).
    ASSERT_TRUE(j.contains("decode_step_ms")) << j.dump();
    const auto& d = j["decode_step_ms"];
    EXPECT_GT(d["steps"].get<uint64_t>(), 10u) << j.dump();
    const double loop = d["loop"].get<double>(), fwd = d["forward"].get<double>();
    EXPECT_GT(fwd, 0) << j.dump();
    EXPECT_LE(fwd + d["first_steps"].get<double>(), loop * 1.001) << j.dump();
    EXPECT_GT(loop, 0.3 * p50) << j.dump();
    EXPECT_LT(loop, 3 * p50 + 1) << j.dump();
  }
  const auto& landing = phases["landing"];
  EXPECT_GT(landing["landed_requests"].get<int>(), 0) << landing.dump();
  // No itl_target_ms on the decode: landed prompts join the next step, never put off.
  EXPECT_EQ(landing["decode_step_ms"]["joins_deferred"].get<uint64_t>(), 0u) << landing.dump();
  EXPECT_GT(landing["landing_gbps"].get<double>(), 0) << landing.dump();
  // Landing rate from the decode's counters against the landed prompts' own bytes.
  EXPECT_GT(landing["landing_loadinfo_gbps"].get<double>(), 0) << landing.dump();
  // The prefill served the repeats from its prompt cache.
  EXPECT_GT(landing["prefill_cache_hits"].get<int>(), 0) << landing.dump();
  EXPECT_EQ(phases["idle"]["landing_clients"].get<int>(), 0);
  ASSERT_TRUE(comparison.is_object()) << out;
  EXPECT_TRUE(std::isfinite(comparison["p99_landing_over_idle"].get<double>()));
  // Every stream and landing request ended (the bench cancelled the streams): blocks are back.
  Status d = WaitForAllBlocksFree(decode_address(), true, DeadlineAfterMs(5000));
  EXPECT_TRUE(d.ok()) << d.ToString();
}

// itl_target_ms on the decode: a target no step can meet (1 us) puts every landed prompt's
// join off to every other step at best (decode/join_budget.h's progress rule), so joins are
// deferred while prompts keep landing and finishing, and every block comes back.
TEST_F(BenchItlTest, DecodeItlTargetPutsJoinsOffButTheyStillLand) {
  DaemonPair pair;
  pair.common = {"--model=tiny"};
  pair.prefill = {"--pool_blocks=64", "--prompt_cache_blocks=32"};
  pair.decode = {"--pool_blocks=1024", "--max_batch=16", "--itl_target_ms=0.001"};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  int rc = 0;
  std::string out = RunBenchItl(
      "--streams 3 --stream-prompt-len 24 --stream-max-tokens 1000 --landing-clients 4"
      " --landing-prompt-len 120 --rounds 1 --phase-s 1.0 --settle-ms 100 --warmup-s 0.2"
      " --phases landing",
      &rc);
  ASSERT_EQ(rc, 0) << out;
  const nlohmann::json landing = ReadJson()["landing"];
  ASSERT_TRUE(landing.is_object()) << out;
  EXPECT_GT(landing["landed_requests"].get<int>(), 0) << landing.dump();
  ASSERT_TRUE(landing.contains("decode_step_ms")) << landing.dump();
  EXPECT_GT(landing["decode_step_ms"]["joins_deferred"].get<uint64_t>(), 0u) << landing.dump();
  EXPECT_NE(out.find("joins put off"), std::string::npos) << out;
  Status d = WaitForAllBlocksFree(decode_address(), true, DeadlineAfterMs(5000));
  EXPECT_TRUE(d.ok()) << d.ToString();
}

TEST_F(DisaggTest, BenchItlRefusesBadFlags) {
  int rc = 0;
  std::string out = RunCapture(std::string(KVSTREAM_CLI_BIN) +
                                   " bench itl --decode 127.0.0.1:1 --phases idle,busy", &rc, /*with_stderr=*/true);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("busy"), std::string::npos) << out;
  out = RunCapture(std::string(KVSTREAM_CLI_BIN) + " bench itl --decode 127.0.0.1:1 --phase-s -1", &rc, /*with_stderr=*/true);
  EXPECT_EQ(rc, 2) << out;
  out = RunCapture(std::string(KVSTREAM_CLI_BIN) +
                       " bench itl --decode 127.0.0.1:1 --landing-clients 0", &rc, /*with_stderr=*/true);
  EXPECT_EQ(rc, 2) << out;
}

// The ITL-target keys reach the transport: the prefill logs the rate PaceRateForItlTarget gives
// (B * (1 - t0/T) / k = 1e9 * (1 - 1/2) / 2 = 0.25 GB/s), serves with it, and an explicit
// pace_bytes_per_s wins. A target the idle step misses is refused at start, naming the key.
TEST_F(DisaggTest, ItlTargetKeysPaceThePrefillsWrites) {
  DaemonPair pair;
  pair.common = {"--model=tiny", "--log_level=info"};
  pair.prefill = {"--itl_target_ms=2", "--itl_idle_step_ms=1",
                  "--itl_device_bw_bytes_per_s=1000000000"};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  EXPECT_NE(prefill_->Log().find("KV writes paced at 0.25 GB/s"), std::string::npos)
      << prefill_->Log();
  EXPECT_NE(prefill_->Log().find("from itl_target_ms"), std::string::npos);
  auto prompt = MakePrompt(40, 512, 5);
  auto r = CallGenerate(*stub_, prompt, 4, kvstream::v1::LOAD_MODE_PIPELINED, 30000);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, Colocated({"--model=tiny"}, prompt, 4));
  EXPECT_TRUE(r.messages.front().load().loaded_remotely());

  TempDir dir;
  std::vector<std::string> args = DefaultDaemonFlags();
  for (const char* a : {"--model=tiny", "--log_level=info", "--listen=127.0.0.1:0",
                        "--itl_target_ms=2", "--itl_idle_step_ms=1",
                        "--itl_device_bw_bytes_per_s=1000000000", "--pace_bytes_per_s=3000000000"})
    args.push_back(a);
  DaemonProcess explicit_rate("prefill2", PrefillBin(), args, dir.path());
  Status s = explicit_rate.Start(DeadlineAfterMs(60000));
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_NE(explicit_rate.Log().find("KV writes paced at 3 GB/s"), std::string::npos)
      << explicit_rate.Log();

  args = DefaultDaemonFlags();
  for (const char* a : {"--model=tiny", "--listen=127.0.0.1:0", "--itl_target_ms=1",
                        "--itl_idle_step_ms=1.5", "--itl_device_bw_bytes_per_s=1000000000"})
    args.push_back(a);
  DaemonProcess refused("prefill3", PrefillBin(), args, dir.path());
  ASSERT_TRUE(refused.Spawn().ok());
  EXPECT_EQ(refused.Wait(DeadlineAfterMs(30000)), 2);
  EXPECT_NE(refused.Log().find("itl_target_ms"), std::string::npos) << refused.Log();
}

}  // namespace
}  // namespace kvstream::testing
