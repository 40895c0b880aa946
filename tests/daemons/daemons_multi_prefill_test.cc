// One decode daemon with two prefill daemons (--peer a,b): loads are spread over both, a killed
// prefill is skipped (its in-flight loads recomputed), and one that comes back on its port takes
// loads again; the decode counts how it routed (Stats, /metrics). Real processes, real gRPC and
// UCX on loopback, tiny model on the CPU.
#include <gtest/gtest.h>

#include <csignal>
#include <cstdio>
#include <thread>

#include "tests/daemons/disagg_fixture.h"
#include "tests/daemons/metrics_probe.h"

namespace kvstream::testing {
namespace {

class MultiPrefillTest : public DisaggTest {
 protected:
  std::unique_ptr<DaemonProcess> StartPrefillOn(const std::string& name, int port,
                                                const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = DefaultDaemonFlags();
    for (const char* a : {"--model=tiny", "--pool_blocks=64"}) args.push_back(a);
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back("--listen=127.0.0.1:" + std::to_string(port));
    auto p = std::make_unique<DaemonProcess>(name, PrefillBin(), args, dir_.path());
    Status s = p->Start(DeadlineAfterMs(60000));
    EXPECT_TRUE(s.ok()) << s.ToString();
    return s.ok() ? std::move(p) : nullptr;
  }
  void TearDown() override {
    if (HasFailure()) {
      for (auto* p : {&a, &b})
        if (*p) std::fprintf(stderr, "---- %s log ----\n%s\n", p == &a ? "prefill a" : "prefill b",
                             (*p)->Log().c_str());
    }
    DisaggTest::TearDown();
  }
  void StartDecode(int port_a, int port_b, const std::vector<std::string>& extra) {
    std::vector<std::string> args = DefaultDaemonFlags();
    for (const char* f : {"--model=tiny", "--pool_blocks=256", "--on_load_failure=recompute"})
      args.push_back(f);
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back("--listen=127.0.0.1:0");
    args.push_back("--peer=127.0.0.1:" + std::to_string(port_a) + ",127.0.0.1:" +
                   std::to_string(port_b));
    decode_ = std::make_unique<DaemonProcess>("decode", DecodeBin(), args, dir_.path());
    ASSERT_TRUE(decode_->Start(DeadlineAfterMs(60000)).ok());
    stub_ = DecodeStub(decode_->address());
  }
  // Members, so that a failure prints their logs.
  std::unique_ptr<DaemonProcess> a, b;
  uint64_t PrefillOk(const std::string& address) {
    auto stub = PrefillStub(address);
    auto st = CallStats(*stub);
    return st.ok() ? st->counters().requests_ok() : 0;
  }
};

TEST_F(MultiPrefillTest, LoadsSpreadOverBothAndSurviveOneDying) {
  const int port_a = PickFreePort(), port_b = PickFreePort();
  a = StartPrefillOn("prefill_a", port_a);
  b = StartPrefillOn("prefill_b", port_b);
  ASSERT_TRUE(a && b);
  // The least-loaded policy: one prompt repeated spreads (prefix routing would keep it on one).
  ASSERT_NO_FATAL_FAILURE(StartDecode(port_a, port_b, {"--prefill_routing=least_loaded"}));

  // Spread: 8 requests one after another land on both prefills; tokens equal colocated.
  const std::vector<int32_t> prompt = MakePrompt(40, 512, 5);
  const std::vector<int32_t> want = Colocated({"--model=tiny"}, prompt, 5);
  for (int i = 0; i < 8; ++i) {
    auto r = CallGenerate(*stub_, prompt, 5, v1::LOAD_MODE_PIPELINED, 30000);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens, want);
    ASSERT_FALSE(r.messages.empty());
    EXPECT_TRUE(r.messages.front().load().loaded_remotely()) << "request " << i;
  }
  const uint64_t a_before = PrefillOk("127.0.0.1:" + std::to_string(port_a));
  const uint64_t b_before = PrefillOk("127.0.0.1:" + std::to_string(port_b));
  EXPECT_EQ(a_before + b_before, 8u);
  EXPECT_GE(a_before, 2u) << "loads did not spread";
  EXPECT_GE(b_before, 2u) << "loads did not spread";

  // Prefill A dies: every request still gets its tokens (recomputed if its load was on A), and
  // once A is known lost, loads go to B.
  a->Signal(SIGKILL);
  a->Wait(DeadlineAfterMs(10000));
  int remote_after = 0;
  for (int i = 0; i < 8; ++i) {
    auto r = CallGenerate(*stub_, prompt, 5, v1::LOAD_MODE_PIPELINED, 30000);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens, want);
    if (!r.messages.empty() && r.messages.front().load().loaded_remotely()) ++remote_after;
  }
  EXPECT_GE(remote_after, 6) << "B did not take the loads after A died";
  EXPECT_GE(PrefillOk("127.0.0.1:" + std::to_string(port_b)), b_before + 6);

  // A comes back on its port: the decode's prober handshakes again and A takes loads.
  a = StartPrefillOn("prefill_a2", port_a);
  ASSERT_TRUE(a);
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  for (int i = 0; i < 8; ++i) {
    auto r = CallGenerate(*stub_, prompt, 5, v1::LOAD_MODE_PIPELINED, 30000);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens, want);
  }
  EXPECT_GE(PrefillOk("127.0.0.1:" + std::to_string(port_a)), 2u) << "A did not take loads again";
  EXPECT_TRUE(WaitForAllBlocksFree(decode_->address(), true, DeadlineAfterMs(10000)).ok());
}

// Prefix-aware routing (the default with several prefills, decode/prefill_router.h): every
// turn of a conversation (the previous prompt, its answer and a new message) goes to the
// prefill that computed the previous turns, so it finds that prefix in its cache; a prefill
// going down moves only its own conversations.
TEST_F(MultiPrefillTest, TurnsOfAConversationLandOnOnePrefillThatHoldsTheirPrefix) {
  const int port_a = PickFreePort(), port_b = PickFreePort();
  // Room for every conversation's prefix (a cache cycled through by more than it holds would
  // miss every time under LRU, whatever the routing).
  const std::vector<std::string> cache = {"--pool_blocks=320", "--prompt_cache_blocks=256"};
  a = StartPrefillOn("prefill_a", port_a, cache);
  b = StartPrefillOn("prefill_b", port_b, cache);
  ASSERT_TRUE(a && b);
  ASSERT_NO_FATAL_FAILURE(StartDecode(
      port_a, port_b,
      {"--metrics=127.0.0.1:0", "--metrics_port_file=" + dir_.path() + "/d.mport"}));
  const int metrics = ReadMetricsPort(dir_.path() + "/d.mport", DeadlineAfterMs(5000));
  ASSERT_GT(metrics, 0);
  int requests = 0;  // Generate calls, each routed once
  const std::string addr[2] = {"127.0.0.1:" + std::to_string(port_a),
                               "127.0.0.1:" + std::to_string(port_b)};
  uint64_t served[2] = {0, 0}, hit_tokens[2] = {0, 0};
  // One turn: tokens equal colocated; which prefill served it (-1: none, recomputed) and the
  // prompt tokens it took from its cache (its Stats' deltas: requests go one at a time).
  auto turn = [&](const std::vector<int32_t>& prompt, std::vector<int32_t>* answer, int* where,
                  int* cached) {
    auto r = CallGenerate(*stub_, prompt, 5, v1::LOAD_MODE_PIPELINED, 30000);
    ++requests;
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    ASSERT_EQ(r.tokens, Colocated({"--model=tiny"}, prompt, 5));
    *answer = r.tokens;
    *cached = 0;
    *where = -1;
    const bool remote = r.messages.front().load().loaded_remotely();
    const Deadline deadline = DeadlineAfterMs(5000);
    while (remote && *where < 0 && Clock::now() < deadline) {
      for (int i = 0; i < 2; ++i) {
        if (i == 1 && !b) continue;  // killed
        auto stub = PrefillStub(addr[i]);
        auto st = CallStats(*stub);
        if (!st.ok() || st->counters().requests_ok() <= served[i]) continue;
        served[i] = st->counters().requests_ok();
        *cached = int(st->counters().prompt_cache_hit_tokens() - hit_tokens[i]);
        hit_tokens[i] = st->counters().prompt_cache_hit_tokens();
        *where = i;
      }
      if (*where < 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_TRUE(!remote || *where >= 0) << "no prefill counted the request";
  };
  struct Conversation {
    std::vector<int32_t> prompt;
    int owner = -1;
  };
  std::vector<Conversation> convs;
  int per[2] = {0, 0};
  // Turn 1 of conversations (70 tokens: the route key's 4 blocks) until each prefill has two.
  for (int c = 0; c < 16 && (per[0] < 2 || per[1] < 2); ++c) {
    Conversation conv{MakePrompt(70, 512, 1000 + c)};
    std::vector<int32_t> answer;
    int cached = 0;
    ASSERT_NO_FATAL_FAILURE(turn(conv.prompt, &answer, &conv.owner, &cached));
    ASSERT_GE(conv.owner, 0);
    ++per[conv.owner];
    conv.prompt.insert(conv.prompt.end(), answer.begin(), answer.end());
    convs.push_back(conv);
  }
  ASSERT_TRUE(per[0] >= 2 && per[1] >= 2) << per[0] << " / " << per[1];
  // Turns 2 and 3: the same prefill, which has the previous prompt's full blocks (at the
  // prefill the prompt less its last token) in its cache: hit rate not halved.
  auto next_turn = [&](Conversation& conv, uint64_t seed, int* where) {
    const int previous_blocks = (int(conv.prompt.size()) - 5 - 1) / 16;
    const auto message = MakePrompt(10, 512, seed);
    conv.prompt.insert(conv.prompt.end(), message.begin(), message.end());
    std::vector<int32_t> answer;
    int cached = 0;
    ASSERT_NO_FATAL_FAILURE(turn(conv.prompt, &answer, where, &cached));
    if (*where == conv.owner) {
      EXPECT_GE(cached, previous_blocks * 16) << "prefix not found";
    }
    conv.prompt.insert(conv.prompt.end(), answer.begin(), answer.end());
  };
  for (int t = 2; t <= 3; ++t) {
    // Another client's request between the rounds: requests of one conversation are not evenly
    // spaced (round robin over two prefills would otherwise put each turn where the last went).
    std::vector<int32_t> stray_answer;
    int stray_where = -1, stray_cached = 0;
    ASSERT_NO_FATAL_FAILURE(turn(MakePrompt(70, 512, 4000 + t), &stray_answer, &stray_where,
                                 &stray_cached));
    for (size_t c = 0; c < convs.size(); ++c) {
      int where = -1;
      ASSERT_NO_FATAL_FAILURE(next_turn(convs[c], 2000 + 100 * t + c, &where));
      EXPECT_EQ(where, convs[c].owner) << "conversation " << c << " turn " << t << " moved";
    }
  }
  // B goes down: A's conversations stay on A (and still hit); B's move to A once the decode
  // knows B is lost (the first may be recomputed), with the colocated tokens throughout.
  b->Signal(SIGKILL);
  b->Wait(DeadlineAfterMs(10000));
  b.reset();
  int moved_to_a = 0;
  for (size_t c = 0; c < convs.size(); ++c) {
    int where = -1;
    ASSERT_NO_FATAL_FAILURE(next_turn(convs[c], 3000 + c, &where));
    if (convs[c].owner == 0) {
      EXPECT_EQ(where, 0) << "a conversation of the live prefill moved";
    }
    if (convs[c].owner == 1 && where == 0) ++moved_to_a;
  }
  EXPECT_GE(moved_to_a, per[1] - 1);
  EXPECT_TRUE(WaitForAllBlocksFree(decode_->address(), true, DeadlineAfterMs(10000)).ok());
  // The decode counted its choices: every prompt has a route key (4 full blocks), so each went
  // by prefix (or round robin while no prefill was ready yet); those of B's conversations that
  // went to A because B was down count as moves; one at a time, none overloaded.
  auto st = CallStats(*stub_);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ASSERT_TRUE(st->has_prefill_routes());
  const v1::PrefillRouteStats& routes = st->prefill_routes();
  EXPECT_EQ(routes.by_prefix() + routes.round_robin(), uint64_t(requests));
  EXPECT_EQ(routes.by_load(), 0u);
  EXPECT_GE(routes.moved_down(), uint64_t(moved_to_a));
  EXPECT_EQ(routes.moved_busy(), 0u);
  const std::string d = Scrape(metrics);
  ASSERT_FALSE(d.empty());
  EXPECT_EQ(SampleValue(d, "kvstream_decode_prefill_routes_total{by=\"prefix\"}"),
            double(routes.by_prefix())) << d;
  EXPECT_EQ(SampleValue(d, "kvstream_decode_prefill_routes_total{by=\"load\"}"), 0);
  EXPECT_EQ(SampleValue(d, "kvstream_decode_prefill_routes_total{by=\"round_robin\"}"),
            double(routes.round_robin()));
  EXPECT_EQ(SampleValue(d, "kvstream_decode_prefill_route_moves_total{reason=\"down\"}"),
            double(routes.moved_down()));
  EXPECT_EQ(SampleValue(d, "kvstream_decode_prefill_route_moves_total{reason=\"overloaded\"}"), 0);
}

TEST_F(MultiPrefillTest, MalformedPeerListIsRefusedAtStart) {
  for (const char* peers : {"127.0.0.1:1,", "127.0.0.1:1,,127.0.0.1:2", "127.0.0.1"}) {
    std::vector<std::string> args = DefaultDaemonFlags();
    args.push_back("--model=tiny");
    args.push_back("--listen=127.0.0.1:0");
    args.push_back(std::string("--peer=") + peers);
    DaemonProcess d("decode_bad", DecodeBin(), args, dir_.path());
    ASSERT_TRUE(d.Spawn().ok());
    EXPECT_EQ(d.Wait(DeadlineAfterMs(20000)), 2) << peers << "\n" << d.Log();
    EXPECT_NE(d.Log().find("host:port"), std::string::npos) << d.Log();
  }
}

}  // namespace
}  // namespace kvstream::testing
