// Many decodes behind one address (issue 18 item 3, docs/http.md): HAProxy with
// deploy/haproxy/haproxy.cfg in front of two decode daemons' HTTP endpoints, one prefill behind
// both, real processes on loopback. Requests spread over both decodes (each one's Stats); a
// decode drained with SIGTERM (its /ready answers 503 at once while it still admits requests for
// drain_delay_ms) gets no new request while the other serves them all; the tokens equal
// colocated. The gRPC API balanced on the client: `kvstream bench ttft` with an
// ipv4:A,B target (a stand-in for a DNS name with one address per decode: /etc/hosts is not the
// test's to edit) and round_robin spreads its calls over both decodes, whose connections age out
// every --max_connection_age_ms (1 s here) without failing a call. Exits 77 (skipped) without
// haproxy (scripts/install-deps.sh installs it).
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/daemons/disagg_fixture.h"
#include "tests/daemons/metrics_probe.h"

namespace kvstream::testing {
namespace {

namespace v1 = kvstream::v1;
using json = nlohmann::json;

uint64_t RequestsTotal(v1::Decode::Stub& stub) {
  auto s = CallStats(stub);
  return s.ok() ? s->counters().requests_total() : ~uint64_t{0};
}

class BalancerTest : public DisaggTest {
 protected:
  void TearDown() override {
    std::ifstream in(dir_.path() + "/haproxy.pid");
    pid_t pid = 0;
    if (in >> pid && pid > 0) ::kill(pid, SIGTERM);
    if (decode2_) decode2_->Signal(SIGKILL);
    DisaggTest::TearDown();
  }
  std::string Curl(const std::string& args, int* rc) { return RunCapture("curl -sS --max-time 60 " + args, rc); }
  // HAProxy's view of a server ("UP", "DOWN", ...; "" before it answers).
  std::string LbStatus(const std::string& server) {
    int rc = 0;
    const std::string csv = Curl("http://127.0.0.1:" + std::to_string(stats_port_) + "/stats\\;csv", &rc);
    const size_t at = csv.find("decodes," + server + ",");
    if (at == std::string::npos) return "";
    std::string line = csv.substr(at, csv.find('\n', at) - at);
    for (int field = 0; field < 17; ++field) line = line.substr(line.find(',') + 1);  // status: field 18
    return line.substr(0, line.find(','));
  }
  bool WaitLbStatus(const std::string& server, const std::string& want, int ms) {
    const Deadline d = DeadlineAfterMs(ms);
    while (Clock::now() < d) {
      if (LbStatus(server) == want) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }
  // `n` greedy completions through the balancer at once; their tokens against colocated.
  void Completions(int n, int first_seed) {
    std::vector<std::thread> threads;
    std::mutex mu;
    for (int i = 0; i < n; ++i) {
      threads.emplace_back([&, i] {
        const auto prompt = MakePrompt(12 + i, 512, first_seed + i);
        int rc = 0;
        const std::string out = Curl("-d '" + json({{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 6},
                                                     {"temperature", 0}, {"return_token_ids", true}}).dump() +
                                         "' http://127.0.0.1:" + std::to_string(lb_port_) + "/v1/completions", &rc);
        std::lock_guard<std::mutex> lock(mu);
        const json j = json::parse(out, nullptr, false);
        if (rc != 0 || j.is_discarded() || !j.contains("choices")) {
          ADD_FAILURE() << "request " << i << ": " << out;
          return;
        }
        tokens_.emplace_back(prompt, j["choices"][0]["token_ids"].get<std::vector<int32_t>>());
      });
    }
    for (auto& t : threads) t.join();
  }
  std::unique_ptr<DaemonProcess> decode2_;
  int lb_port_ = 0, stats_port_ = 0;
  std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> tokens_;
};

TEST_F(BalancerTest, SpreadsOverDecodesSkipsADrainedOneTokensEqualColocated) {
  int rc = 0;
  RunCapture("haproxy -v", &rc);
  if (rc != 0) {
    std::printf("skipped: haproxy is not installed (scripts/install-deps.sh)\n");
    std::exit(77);
  }
  const std::string d = dir_.path();
  DaemonPair pair;
  pair.common = {"--model=tiny", "--pool_blocks=64"};
  // Drained, a decode admits for 6 s more: what keeps requests off it is the balancer.
  pair.decode = {"--http=127.0.0.1:0", "--http_port_file=" + d + "/http1.port", "--drain_delay_ms=6000",
                 "--max_connection_age_ms=1000"};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  std::vector<std::string> args = DefaultDaemonFlags();
  for (const char* a : {"--model=tiny", "--pool_blocks=64", "--listen=127.0.0.1:0", "--http=127.0.0.1:0",
                        "--drain_delay_ms=6000", "--max_connection_age_ms=1000"})
    args.push_back(a);
  args.push_back("--http_port_file=" + d + "/http2.port");
  args.push_back("--peer=" + prefill_address());
  decode2_ = std::make_unique<DaemonProcess>("decode2", DecodeBin(), args, d);
  ASSERT_TRUE(decode2_->Start(DeadlineAfterMs(120000)).ok()) << decode2_->Log();
  auto stub2 = DecodeStub(decode2_->address());
  const int http1 = ReadMetricsPort(d + "/http1.port", DeadlineAfterMs(10000));
  const int http2 = ReadMetricsPort(d + "/http2.port", DeadlineAfterMs(10000));
  ASSERT_GT(http1, 0);
  ASSERT_GT(http2, 0);

  lb_port_ = PickFreePort();
  stats_port_ = PickFreePort();
  const std::string env = "KVSTREAM_LB_BIND=127.0.0.1:" + std::to_string(lb_port_) +
                          " KVSTREAM_LB_STATS=127.0.0.1:" + std::to_string(stats_port_) +
                          " KVSTREAM_DECODE_1=127.0.0.1:" + std::to_string(http1) +
                          " KVSTREAM_DECODE_2=127.0.0.1:" + std::to_string(http2);
  const std::string out = RunCapture("env " + env + " haproxy -D -p " + d + "/haproxy.pid -f " +
                                         std::string(KVSTREAM_SOURCE_DIR) + "/deploy/haproxy/haproxy.cfg",
                                     &rc, true);
  ASSERT_EQ(rc, 0) << out;
  ASSERT_TRUE(WaitLbStatus("decode1", "UP", 10000)) << LbStatus("decode1");
  ASSERT_TRUE(WaitLbStatus("decode2", "UP", 10000)) << LbStatus("decode2");

  // Spread: 8 requests at once, least connections: both decodes serve some.
  const uint64_t a0 = RequestsTotal(*stub_), b0 = RequestsTotal(*stub2);
  Completions(8, 100);
  const uint64_t a1 = RequestsTotal(*stub_), b1 = RequestsTotal(*stub2);
  EXPECT_EQ((a1 - a0) + (b1 - b0), 8u);
  EXPECT_GE(a1 - a0, 2u) << "decode1 served " << a1 - a0 << " of 8";
  EXPECT_GE(b1 - b0, 2u) << "decode2 served " << b1 - b0 << " of 8";
  std::printf("spread: decode1 %llu, decode2 %llu of 8\n", (unsigned long long)(a1 - a0),
              (unsigned long long)(b1 - b0));

  // gRPC, balanced by the client: round_robin over both decodes' addresses, through GOAWAYs.
  const std::string target = "ipv4:" + decode_address() + "," + decode2_->address();
  const std::string bench = RunCapture(std::string(KVSTREAM_CLI_BIN) + " bench ttft --decode " + target +
                                           " --model tiny --threads 1 --requests 12 --warmup 0 --prompt-lens 8"
                                           " --max-new-tokens 40 --modes pipelined", &rc, true);
  EXPECT_EQ(rc, 0) << bench;
  const uint64_t a2 = RequestsTotal(*stub_), b2 = RequestsTotal(*stub2);
  EXPECT_EQ((a2 - a1) + (b2 - b1), 12u) << bench;
  EXPECT_GE(a2 - a1, 4u) << "decode1 got " << a2 - a1 << " of 12 gRPC calls";
  EXPECT_GE(b2 - b1, 4u) << "decode2 got " << b2 - b1 << " of 12 gRPC calls";
  std::printf("gRPC round_robin: decode1 %llu, decode2 %llu of 12\n", (unsigned long long)(a2 - a1),
              (unsigned long long)(b2 - b1));

  // Drain decode2: /ready goes 503 at once, HAProxy takes it out, every new request goes to
  // decode1 while decode2 would still admit them.
  decode2_->Signal(SIGTERM);
  const Deadline until = DeadlineAfterMs(3000);
  std::string ready;
  while (Clock::now() < until) {
    ready = Curl("-o /dev/null -w '%{http_code}' http://127.0.0.1:" + std::to_string(http2) + "/ready", &rc);
    if (ready == "503") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(ready, "503");
  ASSERT_TRUE(WaitLbStatus("decode2", "DOWN", 3000)) << LbStatus("decode2");
  Completions(6, 200);
  const uint64_t a3 = RequestsTotal(*stub_), b3 = RequestsTotal(*stub2);
  EXPECT_EQ(a3 - a2, 6u);
  EXPECT_EQ(b3, b2) << "the drained decode got new requests";
  ASSERT_TRUE(decode2_->Running()) << "decode2 stopped before the check: the drain delay is too short";
  EXPECT_EQ(decode2_->Wait(DeadlineAfterMs(20000)), 0) << decode2_->Log();

  // Tokens: every request's equal the colocated model's.
  ASSERT_EQ(tokens_.size(), 14u);
  for (const auto& [prompt, toks] : tokens_) EXPECT_EQ(toks, Colocated({"--model=tiny"}, prompt, 6));
  EXPECT_EQ(BlocksNotFree(decode_address(), true, DeadlineAfterMs(10000)), 0);
}

}  // namespace
}  // namespace kvstream::testing
