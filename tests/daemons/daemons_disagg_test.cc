// Integration: real kvstream-prefill and kvstream-decode processes, real gRPC, real UCX.
#include <sys/wait.h>

#include <cstdio>
#include <sstream>
#include <thread>

#include "tests/daemons/disagg_fixture.h"

namespace kvstream::testing {
namespace {

namespace v1 = kvstream::v1;

const std::vector<std::string> kTiny = {"--model=tiny"};

TEST_F(DisaggTest, TinyTokensEqualColocatedPipelinedAndNot) {
  DaemonPair pair;
  pair.common = kTiny;
  pair.common.push_back("--pool_blocks=64");
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  const int vocab = 512;
  int seed = 1;
  for (int n : {1, 2, 15, 16, 17, 40, 100}) {
    auto prompt = MakePrompt(n, vocab, seed++);
    auto expected = Colocated(kTiny, prompt, 8);
    ASSERT_EQ(expected.size(), 8u);
    for (auto mode : {v1::LOAD_MODE_PIPELINED, v1::LOAD_MODE_NON_PIPELINED, v1::LOAD_MODE_LOCAL}) {
      auto r = CallGenerate(*stub_, prompt, 8, mode, 30000);
      ASSERT_TRUE(r.status.ok()) << "prompt " << n << " mode " << mode << ": "
                                 << r.status.error_message();
      EXPECT_EQ(r.tokens, expected) << "prompt " << n << " mode " << mode;
      ASSERT_FALSE(r.messages.empty());
      const auto& first = r.messages.front();
      EXPECT_EQ(first.index(), 0);
      EXPECT_TRUE(r.messages.back().last());
      const bool remote = n > 1 && mode != v1::LOAD_MODE_LOCAL;
      EXPECT_EQ(first.load().loaded_remotely(), remote) << "prompt " << n << " mode " << mode;
      if (remote) {
        EXPECT_EQ(first.load().pipelined(), mode == v1::LOAD_MODE_PIPELINED);
      }
    }
  }
  EXPECT_TRUE(WaitForAllBlocksFree(decode_address(), true, DeadlineAfterMs(5000)).ok());
  EXPECT_TRUE(WaitForAllBlocksFree(prefill_address(), false, DeadlineAfterMs(5000)).ok());
  // Every remote load moved the prompt's KV: the counters say so.
  auto stats = CallStats(*stub_);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->counters().requests_failed(), 0u);
  EXPECT_GT(stats->counters().kv_bytes_moved(), 0u);
}

TEST_F(DisaggTest, DaemonPipeliningFlagIsTheDefaultMode) {
  DaemonPair pair;
  pair.common = kTiny;
  pair.decode = {"--pipelining=false"};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  auto prompt = MakePrompt(33, 512, 7);
  auto r = CallGenerate(*stub_, prompt, 4, v1::LOAD_MODE_DEFAULT, 30000);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, Colocated(kTiny, prompt, 4));
  EXPECT_TRUE(r.messages.front().load().loaded_remotely());
  EXPECT_FALSE(r.messages.front().load().pipelined());
}

TEST_F(DisaggTest, ManyConcurrentRequestsThenEveryBlockIsBack) {
  DaemonPair pair;
  pair.common = kTiny;
  pair.common.push_back("--pool_blocks=256");
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  constexpr int kRequests = 24;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int32_t>> expected;
  for (int i = 0; i < kRequests; ++i) {
    prompts.push_back(MakePrompt(5 + 7 * i, 512, 100 + i));
    expected.push_back(Colocated(kTiny, prompts.back(), 6));
  }
  std::vector<GenerateResult> results(kRequests);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] {
      auto stub = DecodeStub(decode_address());
      results[i] = CallGenerate(*stub, prompts[i], 6,
                                i % 2 ? v1::LOAD_MODE_PIPELINED : v1::LOAD_MODE_NON_PIPELINED, 60000);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
    EXPECT_EQ(results[i].tokens, expected[i]) << "request " << i;
  }
  Status d = WaitForAllBlocksFree(decode_address(), true, DeadlineAfterMs(5000));
  EXPECT_TRUE(d.ok()) << d.ToString();
  Status p = WaitForAllBlocksFree(prefill_address(), false, DeadlineAfterMs(5000));
  EXPECT_TRUE(p.ok()) << p.ToString();
  auto stats = CallStats(*stub_);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->counters().requests_ok(), static_cast<uint64_t>(kRequests));
}

TEST_F(DisaggTest, BadRequestsGetClearStatusAndFreeNothing) {
  DaemonPair pair;
  pair.common = kTiny;
  pair.common.push_back("--pool_blocks=8");
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  auto r = CallGenerate(*stub_, {}, 4, v1::LOAD_MODE_DEFAULT, 5000);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  r = CallGenerate(*stub_, {1, 2, 100000}, 4, v1::LOAD_MODE_DEFAULT, 5000);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(r.status.error_message().find("vocabulary"), std::string::npos);
  r = CallGenerate(*stub_, MakePrompt(200, 512, 1), 4, v1::LOAD_MODE_DEFAULT, 5000);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);  // > pool
  r = CallGenerate(*stub_, {1, 2}, 0, v1::LOAD_MODE_DEFAULT, 5000);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(WaitForAllBlocksFree(decode_address(), true, DeadlineAfterMs(3000)).ok());
}

// first_step_after_load: the decode's first step waits for every layer before layer 0; the
// load itself stays pipelined at the prefill. Same tokens.
TEST_F(DisaggTest, FirstStepAfterLoadGivesTheSameTokens) {
  DaemonPair pair;
  pair.common = kTiny;
  pair.common.push_back("--pool_blocks=32");
  pair.decode = {"--first_step_after_load=true"};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  for (int n : {2, 17, 40}) {
    auto prompt = MakePrompt(n, 512, 500 + n);
    auto expected = Colocated(kTiny, prompt, 4);
    auto r = CallGenerate(*stub_, prompt, 4, v1::LOAD_MODE_PIPELINED, 30000);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens, expected) << "prompt " << n;
    EXPECT_TRUE(r.messages.front().load().loaded_remotely());
  }
  EXPECT_TRUE(WaitForAllBlocksFree(decode_address(), true, DeadlineAfterMs(5000)).ok());
}

TEST_F(DisaggTest, HandshakeMismatchIsRefusedAtStartup) {
  DaemonPair pair;
  pair.common = kTiny;
  pair.decode = {"--seed=7"};  // different weights: model_hash differs
  pair_ = pair;
  ASSERT_NO_FATAL_FAILURE(StartPrefill());
  std::vector<std::string> args = DefaultDaemonFlags();
  for (auto& a : pair.common) args.push_back(a);
  args.push_back("--seed=7");
  args.push_back("--peer=" + prefill_address());
  DaemonProcess decode("decode-mismatch", KVSTREAM_DECODE_BIN, args, dir_.path());
  Status s = decode.Start(DeadlineAfterMs(30000));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(decode.Log().find("model_hash differs"), std::string::npos) << decode.Log();
  EXPECT_NE(decode.Wait(DeadlineAfterMs(5000)), 0);

  // Block size too.
  args.pop_back();
  args.pop_back();
  args.push_back("--block_size=32");
  args.push_back("--peer=" + prefill_address());
  DaemonProcess decode2("decode-mismatch2", KVSTREAM_DECODE_BIN, args, dir_.path());
  EXPECT_FALSE(decode2.Start(DeadlineAfterMs(30000)).ok());
  EXPECT_NE(decode2.Log().find("block_size differs"), std::string::npos) << decode2.Log();

  // Another data plane (the prefill runs ucx): refused by name, not failing later in Connect.
  args.pop_back();
  args.pop_back();
  args.push_back("--transport=fake");
  args.push_back("--peer=" + prefill_address());
  DaemonProcess decode3("decode-mismatch3", KVSTREAM_DECODE_BIN, args, dir_.path());
  EXPECT_FALSE(decode3.Start(DeadlineAfterMs(30000)).ok());
  EXPECT_NE(decode3.Log().find("transport differs"), std::string::npos) << decode3.Log();
}

}  // namespace
}  // namespace kvstream::testing

namespace kvstream::testing {
namespace {

// kvstream stats: both daemons' Stats, as lines and as JSON; an unreachable daemon is a clear
// error (exit 1) within the deadline, the reachable ones still printed.
TEST_F(DisaggTest, CliStatsReportsBothDaemons) {
  DaemonPair pair;
  pair.common = {"--model=tiny"};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  auto r = CallGenerate(*stub_, MakePrompt(40, 512, 3), 4, v1::LOAD_MODE_PIPELINED, 30000);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  const std::string kv = KVSTREAM_CLI_BIN;
  int rc = 0;
  std::string out = RunCapture(kv + " stats --decode " + decode_address() + " --prefill " +
                                   prefill_address() + " --json", &rc);
  ASSERT_EQ(rc, 0) << out;
  std::istringstream lines(out);
  std::string decode_line, prefill_line;
  std::getline(lines, decode_line);
  std::getline(lines, prefill_line);
  EXPECT_NE(decode_line.find("\"role\":\"decode\""), std::string::npos) << out;
  EXPECT_NE(decode_line.find("\"requests_ok\":\"1\""), std::string::npos) << out;
  EXPECT_NE(decode_line.find("\"tokens_generated\":\"4\""), std::string::npos) << out;
  EXPECT_NE(prefill_line.find("\"role\":\"prefill\""), std::string::npos) << out;
  EXPECT_NE(prefill_line.find("\"requests_ok\":\"1\""), std::string::npos) << out;
  out = RunCapture(kv + " stats --decode " + decode_address(), &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("decode"), std::string::npos) << out;
  EXPECT_NE(out.find("requests 1 ok 1"), std::string::npos) << out;
  const auto t0 = Clock::now();
  out = RunCapture(kv + " stats --decode " + decode_address() +
                       " --prefill 127.0.0.1:1 --deadline-ms 500", &rc, /*with_stderr=*/true);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("Stats of 127.0.0.1:1"), std::string::npos) << out;
  EXPECT_NE(out.find("requests 1 ok 1"), std::string::npos) << "the reachable daemon: " << out;
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0);
}

TEST_F(DisaggTest, CliGenerateThroughDaemonsAndBenchTtft) {
  DaemonPair pair;
  pair.common = {"--model=tiny"};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  const std::string kv = KVSTREAM_CLI_BIN;
  int rc = 0;
  std::string remote = RunCapture(kv + " generate --decode " + decode_address() +
                                      " --prompt-len 37 --max-new-tokens 6 --json", &rc);
  ASSERT_EQ(rc, 0) << remote;
  std::string local = RunCapture(kv + " generate --model tiny --prompt-len 37 --max-new-tokens 6 --json", &rc);
  ASSERT_EQ(rc, 0) << local;
  auto tokens_of = [](const std::string& j) {
    auto at = j.find("\"tokens\":");
    return at == std::string::npos ? std::string() : j.substr(at, j.find(']', at) - at);
  };
  EXPECT_FALSE(tokens_of(remote).empty()) << remote;
  EXPECT_EQ(tokens_of(remote), tokens_of(local));
  EXPECT_NE(remote.find("\"loaded_remotely\":true"), std::string::npos) << remote;

  std::string bench = RunCapture(kv + " bench ttft --decode " + decode_address() + " --prefill " +
                                     prefill_address() +
                                     " --model tiny --threads 1 --requests 2 --warmup 0 "
                                     "--prompt-lens 8,40 --max-new-tokens 3",
                                 &rc);
  EXPECT_EQ(rc, 0) << bench;
  EXPECT_NE(bench.find("\"kind\":\"comparison\",\"prompt_len\":40,\"tokens_identical_across_modes\":true"),
            std::string::npos) << bench;
  EXPECT_NE(bench.find("\"kind\":\"summary\",\"mode\":\"pipelined\""), std::string::npos);
  EXPECT_NE(bench.find("TTFT p50"), std::string::npos);
  // A model other than the daemons' is refused, naming the hash.
  bench = RunCapture(kv + " bench ttft --decode " + decode_address() +
                         " --model tiny --seed 3 --requests 1 --prompt-lens 8", &rc);
  EXPECT_NE(rc, 0);
}

}  // namespace
}  // namespace kvstream::testing

namespace kvstream::testing {
namespace {

TEST_F(DisaggTest, BurstLargerThanThePoolQueuesThenAllSucceed) {
  DaemonPair pair;
  pair.common = {"--model=tiny", "--pool_blocks=8"};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  // Each request needs 4 of the 8 blocks (50 + 10 tokens): at most two fit at once.
  constexpr int kRequests = 6;
  std::vector<GenerateResult> results(kRequests);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i)
    threads.emplace_back([&, i] {
      auto stub = DecodeStub(decode_address());
      results[i] = CallGenerate(*stub, MakePrompt(50, 512, 300 + i), 10,
                                kvstream::v1::LOAD_MODE_PIPELINED, 30000);
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
    EXPECT_EQ(results[i].tokens, Colocated({"--model=tiny"}, MakePrompt(50, 512, 300 + i), 10));
  }
  EXPECT_TRUE(WaitForAllBlocksFree(decode_address(), true, DeadlineAfterMs(5000)).ok());
}

}  // namespace
}  // namespace kvstream::testing
