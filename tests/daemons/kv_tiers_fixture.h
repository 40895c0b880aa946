// The fixture of the KV tier daemon tests (daemons_kv_tiers_test, daemons_kv_store_test): real
// kvstream-prefill and kvstream-decode processes (tiny preset, CPU backend), tokens checked
// against the colocated model, the prefill's Stats once idle, restarts.
#pragma once

#include <sys/stat.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/daemons/disagg_fixture.h"

namespace kvstream::testing {

namespace v1 = kvstream::v1;

inline const std::vector<std::string> kTiny = {"--model=tiny"};

// The prefill's Stats once nothing is in flight, nothing is queued for the write-down and
// every pool block is free (no prompt cache in these tests: the tiers alone).
inline Result<v1::StatsResponse> WaitForPrefillIdle(const std::string& address, Deadline deadline) {
  auto stub = PrefillStub(address);
  std::string last = "no answer";
  while (Clock::now() < deadline) {
    auto st = CallStats(*stub);
    if (st.ok()) {
      if (st->requests_in_flight() == 0 && st->kv_tier_queued_blocks() == 0 &&
          st->pool().free_blocks() == st->pool().num_blocks())
        return st;
      last = std::to_string(st->pool().free_blocks()) + " free of " +
             std::to_string(st->pool().num_blocks()) + ", " +
             std::to_string(st->kv_tier_queued_blocks()) + " queued";
    } else {
      last = st.status().ToString();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  return Timeout("prefill: " + last);
}

inline const v1::LoadInfo* PrefillFigures(const GenerateResult& r) {
  for (const auto& m : r.messages)
    if (m.has_load() && m.load().transfer_us() > 0) return &m.load();
  return nullptr;
}

inline const v1::KvTierStats* Tier(const v1::StatsResponse& s, const std::string& name) {
  for (const auto& t : s.kv_tiers())
    if (t.name() == name) return &t;
  return nullptr;
}

class KvTiersTest : public DisaggTest {
 protected:
  std::string SecretFile(const std::string& name, const std::string& secret) {
    const std::string path = dir_.path() + "/" + name;
    std::ofstream(path) << secret << "\n";
    ::chmod(path.c_str(), 0600);
    return path;
  }
  // Generates and checks the tokens against the colocated model; returns the prefill's
  // cached-prefix figure (-1 without one) and whether it ran a forward.
  void Run(const std::vector<std::string>& model, const std::vector<int32_t>& prompt,
           int32_t* cached, bool* computed) {
    auto r = CallGenerate(*stub_, prompt, 6, v1::LOAD_MODE_PIPELINED, 30000);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens, Colocated(model, prompt, 6));
    const v1::LoadInfo* f = PrefillFigures(r);
    ASSERT_NE(f, nullptr);
    *cached = f->prefix_cached_tokens();
    *computed = f->prefill_compute_us() > 0;
  }
  void Restart(const DaemonPair& pair) {
    prefill_->Signal(SIGTERM);
    decode_->Signal(SIGTERM);
    EXPECT_EQ(prefill_->Wait(DeadlineAfterMs(15000)), 0);
    EXPECT_EQ(decode_->Wait(DeadlineAfterMs(15000)), 0);
    ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  }
};

}  // namespace kvstream::testing
