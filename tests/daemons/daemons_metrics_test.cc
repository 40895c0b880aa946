// The daemons' Prometheus endpoint (--metrics), with real processes: the figures agree with
// Stats and with the requests made, promtool finds nothing to warn about, hostile HTTP clients
// neither stall nor abort the daemon or its gRPC service, basic auth and the loopback rule hold,
// and no secret shows in a scrape.
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <future>
#include <thread>

#include "tests/daemons/disagg_fixture.h"
#include "tests/daemons/metrics_probe.h"
#include "tests/fault_record.h"

namespace kvstream::testing {
namespace {

namespace v1 = kvstream::v1;

const std::vector<std::string> kTiny = {"--model=tiny"};
const char* kPeerToken = "peer-0123456789abcdef0123456789";
const char* kClientToken = "client-0123456789abcdef01234567";
const char* kMetricsAuth = "scraper:metrics-0123456789abcdef0123";

class MetricsTest : public DisaggTest {
 protected:
  // Both daemons with --metrics on loopback port 0; `extra_*` more flags.
  void StartWithMetrics(std::vector<std::string> extra_prefill = {},
                        std::vector<std::string> extra_decode = {}) {
    DaemonPair pair;
    pair.common = kTiny;
    pair.prefill = {"--metrics=127.0.0.1:0", "--metrics_port_file=" + dir_.path() + "/p.mport"};
    pair.decode = {"--metrics=127.0.0.1:0", "--metrics_port_file=" + dir_.path() + "/d.mport"};
    pair.prefill.insert(pair.prefill.end(), extra_prefill.begin(), extra_prefill.end());
    pair.decode.insert(pair.decode.end(), extra_decode.begin(), extra_decode.end());
    ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
    prefill_metrics_ = ReadMetricsPort(dir_.path() + "/p.mport", DeadlineAfterMs(5000));
    decode_metrics_ = ReadMetricsPort(dir_.path() + "/d.mport", DeadlineAfterMs(5000));
    ASSERT_GT(prefill_metrics_, 0);
    ASSERT_GT(decode_metrics_, 0);
  }
  // A Generate through the decode that must succeed with the colocated tokens, within 10 s.
  bool ServesCorrectly(int seed) {
    auto prompt = MakePrompt(20, 512, seed);
    GenerateResult r = CallGenerate(*stub_, prompt, 4, v1::LOAD_MODE_PIPELINED, 10000);
    return r.status.ok() && r.tokens == Colocated(kTiny, prompt, 4);
  }
  int prefill_metrics_ = -1, decode_metrics_ = -1;
};

TEST_F(MetricsTest, FiguresMatchStatsAndTheRequestsMade) {
  ASSERT_NO_FATAL_FAILURE(StartWithMetrics());
  int tokens = 0;
  for (int i = 0; i < 4; ++i) {
    auto prompt = MakePrompt(24 + i, 512, i);
    auto mode = i % 2 ? v1::LOAD_MODE_LOCAL : v1::LOAD_MODE_PIPELINED;
    GenerateResult r = CallGenerate(*stub_, prompt, 3 + i, mode, 10000);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    tokens += static_cast<int>(r.tokens.size());
  }
  // One refused request (max_tokens 0): counted as failed.
  EXPECT_FALSE(CallGenerate(*stub_, MakePrompt(8, 512, 9), 0, v1::LOAD_MODE_PIPELINED, 5000)
                   .status.ok());
  // A request's blocks go back just after its last message: wait for them, then scrape (a
  // scrape at once saw 3 blocks used on a busy machine).
  ASSERT_TRUE(WaitForAllBlocksFree(decode_address(), true, DeadlineAfterMs(5000)).ok());
  const std::string d = Scrape(decode_metrics_);
  const std::string p = Scrape(prefill_metrics_);
  ASSERT_FALSE(d.empty());
  ASSERT_FALSE(p.empty());
  EXPECT_EQ(SampleValue(d, "kvstream_decode_requests_total{outcome=\"ok\"}"), 4);
  EXPECT_EQ(SampleValue(d, "kvstream_decode_requests_total{outcome=\"failed\"}"), 1);
  EXPECT_EQ(SampleValue(d, "kvstream_decode_tokens_generated_total"), tokens);
  EXPECT_EQ(SampleValue(d, "kvstream_decode_time_to_first_token_seconds_count"), 4);
  EXPECT_EQ(SampleValue(d, "kvstream_decode_inter_token_latency_seconds_count"), tokens - 4);
  EXPECT_EQ(SampleValue(d, "kvstream_decode_queue_seconds_count"), 4);
  EXPECT_EQ(SampleValue(d, "kvstream_decode_peers_connected"), 1);
  EXPECT_EQ(SampleValue(d, "kvstream_pool_blocks{state=\"used\"}"), 0);
  const std::string peer = "{transport=\"ucx\",peer=\"" + prefill_address() + "\"}";
  EXPECT_EQ(SampleValue(d, "kvstream_decode_kv_transfer_seconds_count" + peer), 2) << d;
  EXPECT_EQ(SampleValue(d, "kvstream_decode_kv_transfer_bytes_sum" + peer),
            SampleValue(d, "kvstream_decode_kv_bytes_total"));
  EXPECT_EQ(SampleValue(p, "kvstream_prefill_requests_total{outcome=\"ok\"}"), 2);
  EXPECT_EQ(SampleValue(p, "kvstream_prefill_compute_seconds_count"), 2);
  EXPECT_EQ(SampleValue(p, "kvstream_prefill_kv_transfer_bytes_sum{transport=\"ucx\"}"),
            SampleValue(p, "kvstream_prefill_kv_bytes_total"));
  EXPECT_EQ(SampleValue(p, "kvstream_prefill_peers_connected"), 1);
  // The same counters as the Stats call (one source).
  auto stats = CallStats(*stub_);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(SampleValue(d, "kvstream_decode_kv_bytes_total"), stats->counters().kv_bytes_moved());
  EXPECT_EQ(SampleValue(d, "kvstream_decode_handshakes_total"), stats->counters().handshakes());
  // Labels stay bounded: no per-start instance id anywhere.
  EXPECT_EQ(d.find(stats->instance_id()), std::string::npos);
  auto pstats = CallStats(*PrefillStub(prefill_address()));
  ASSERT_TRUE(pstats.ok());
  EXPECT_EQ(p.find(pstats->instance_id()), std::string::npos);
}

TEST_F(MetricsTest, PromtoolFindsNothingToWarnAbout) {
  ASSERT_NO_FATAL_FAILURE(StartWithMetrics());
  ASSERT_TRUE(ServesCorrectly(1));
  for (int port : {decode_metrics_, prefill_metrics_}) {
    const std::string text = Scrape(port);
    ASSERT_FALSE(text.empty());
    int rc = 0;
    const std::string out = PromtoolCheck(text, dir_.path(), &rc);
    if (rc == -2) GTEST_SKIP() << "promtool is not installed (scripts/install-deps.sh installs it)";
    EXPECT_EQ(rc, 0) << out;
    EXPECT_EQ(out, "") << out;
  }
}

TEST_F(MetricsTest, MalformedAndOversizedRequestsAreRefused) {
  ASSERT_NO_FATAL_FAILURE(StartWithMetrics());
  const std::vector<std::pair<std::string, std::string>> inputs = {
      {"garbage line", "GARBAGE\r\n\r\n"},
      {"HTTP/9.9", "GET /metrics HTTP/9.9\r\n\r\n"},
      {"NUL and high bytes", std::string("GET /\0\xff\xfe metrics HTTP/1.1\r\n\r\n", 30)},
      {"100 KB URL", "GET /" + std::string(100000, 'a') + " HTTP/1.1\r\n\r\n"},
      {"100 KB header", "GET /metrics HTTP/1.1\r\nX: " + std::string(100000, 'b') + "\r\n\r\n"},
      {"header without colon", "GET /metrics HTTP/1.1\r\nnocolon\r\n\r\n"},
      {"huge Content-Length, short body",
       "POST /metrics HTTP/1.1\r\nContent-Length: 99999999999999\r\n\r\nabc"},
      {"bad chunk size",
       "POST /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nZZZZ\r\nx\r\n"},
      {"path traversal", "GET /../../../../etc/passwd HTTP/1.1\r\n\r\n"},
  };
  int ok_after = 0, served = 0, leaked = 0;
  for (const auto& [what, raw] : inputs) {
    HttpReply r = HttpRaw(decode_metrics_, raw, 3000);
    EXPECT_NE(r.status, 200) << what << ": " << r.head;
    if (r.body.find("root:") != std::string::npos) ++leaked;
    ok_after += Scrape(decode_metrics_).empty() ? 0 : 1;
  }
  served = ServesCorrectly(3) ? 1 : 0;
  EXPECT_EQ(leaked, 0);
  EXPECT_EQ(ok_after, static_cast<int>(inputs.size()));
  EXPECT_EQ(served, 1);
  EXPECT_TRUE(decode_->Running());
  FaultOutcome o;
  o.tries = static_cast<int>(inputs.size());
  o.requests = 1;
  o.lost = 1 - served;
  o.blocks_leaked = BlocksNotFree(decode_address(), true, DeadlineAfterMs(5000));
  o.aborts = decode_->Running() ? 0 : 1;
  o.outcome = "each refused (4xx or closed), " + std::to_string(ok_after) + "/" +
              std::to_string(inputs.size()) + " scrapes right after served, Generate served";
  RecordFault("metrics.malformed_http",
              "malformed, oversized (100 KB URL, 100 KB header), chunked and traversal requests "
              "to /metrics",
              o);
}

TEST_F(MetricsTest, IdleConnectionsAndANonReadingClientStallNeitherDaemonNorGrpc) {
  ASSERT_NO_FATAL_FAILURE(StartWithMetrics());
  // The same three calls with no metrics client: what "at once" means on this machine (a loaded
  // or sanitized build serves slower, with or without the clients below).
  const auto b0 = Clock::now();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(ServesCorrectly(20 + i));
  const double baseline_s = std::chrono::duration<double>(Clock::now() - b0).count();
  // 200 connections that send nothing, and one that pipelines 2000 scrapes and never reads.
  std::vector<int> idle;
  for (int i = 0; i < 200; ++i) {
    const int fd = HttpConnect(decode_metrics_);
    if (fd >= 0) idle.push_back(fd);
  }
  const int greedy = HttpConnect(decode_metrics_);
  ASSERT_GE(greedy, 0);
  std::string pipelined;
  for (int i = 0; i < 2000; ++i) pipelined += "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  std::thread writer([&] {
    size_t sent = 0;
    while (sent < pipelined.size()) {  // blocks once the daemon stops reading: shutdown ends it
      const ssize_t n = send(greedy, pipelined.data() + sent, pipelined.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += size_t(n);
    }
  });
  // While they hold on: the gRPC service serves at once.
  int served = 0;
  const auto t0 = Clock::now();
  for (int i = 0; i < 3; ++i) served += ServesCorrectly(10 + i) ? 1 : 0;
  const double serve_s = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(served, 3);
  EXPECT_LT(serve_s, std::max(10.0, 3 * baseline_s)) << "baseline " << baseline_s << " s";
  // Then they go: the endpoint serves again within the request timeout.
  for (int fd : idle) close(fd);
  shutdown(greedy, SHUT_RDWR);
  writer.join();
  close(greedy);
  const auto t1 = Clock::now();
  std::string text;
  while (text.empty() && Clock::now() < t1 + std::chrono::seconds(15)) {
    text = Scrape(decode_metrics_);
    if (text.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const double recovered_s = std::chrono::duration<double>(Clock::now() - t1).count();
  EXPECT_FALSE(text.empty()) << "no scrape served 15 s after the clients left";
  EXPECT_TRUE(decode_->Running());
  FaultOutcome o;
  o.tries = static_cast<int>(idle.size()) + 1;
  o.requests = 3;
  o.lost = 3 - served;
  o.blocks_leaked = BlocksNotFree(decode_address(), true, DeadlineAfterMs(5000));
  o.aborts = decode_->Running() ? 0 : 1;
  char buf[160];
  std::snprintf(buf, sizeof(buf),
                "3 Generate calls served in %.2f s meanwhile; /metrics served again %.2f s after "
                "the clients left",
                serve_s, recovered_s);
  o.outcome = buf;
  RecordFault("metrics.idle_and_non_reading_clients",
              "200 idle connections to /metrics plus one pipelining 2000 scrapes that never reads",
              o);
}

TEST_F(MetricsTest, BasicAuthIsRequiredAndNoSecretIsExported) {
  const std::string peer = dir_.path() + "/peer.token", client = dir_.path() + "/client.token",
                    auth = dir_.path() + "/metrics.auth";
  std::ofstream(peer) << kPeerToken;
  std::ofstream(client) << kClientToken;
  std::ofstream(auth) << kMetricsAuth;
  for (const auto& f : {peer, client, auth}) chmod(f.c_str(), 0600);
  ASSERT_NO_FATAL_FAILURE(StartWithMetrics(
      {"--peer_token_file=" + peer, "--metrics_auth_file=" + auth},
      {"--peer_token_file=" + peer, "--client_token_file=" + client,
       "--metrics_auth_file=" + auth}));
  int refused = 0;
  for (const char* bad : {"", "scraper:wrong-0123456789abcdef0123", "other:metrics-0123456789abcdef0123"})
    refused += HttpGet(decode_metrics_, "/metrics", bad).status == 401 ? 1 : 0;
  refused += HttpRaw(decode_metrics_,
                     "GET /metrics HTTP/1.1\r\nAuthorization: Basic !!!!\r\n\r\n", 3000)
                         .status == 401 ? 1 : 0;
  EXPECT_EQ(refused, 4);
  for (int port : {decode_metrics_, prefill_metrics_}) {
    const std::string text = Scrape(port, kMetricsAuth);
    ASSERT_FALSE(text.empty());
    for (const std::string& secret : {std::string(kPeerToken), std::string(kClientToken),
                                     std::string("metrics-0123456789abcdef0123")})
      EXPECT_EQ(text.find(secret), std::string::npos) << "a secret in the scrape";
  }
  FaultOutcome o;
  o.tries = 4;
  o.aborts = decode_->Running() ? 0 : 1;
  o.outcome = std::to_string(refused) + "/4 refused with 401; no token or password in a scrape";
  RecordFault("metrics.wrong_credentials",
              "/metrics without credentials, with a wrong password, a wrong user, a header that "
              "is not base64",
              o);
}

TEST_F(MetricsTest, NonLoopbackMetricsWithoutAuthRefuseToStart) {
  DaemonProcess p("prefill", PrefillBin(),
                  {"--model=tiny", "--metrics=0.0.0.0:0", "--listen=127.0.0.1:0"}, dir_.path());
  ASSERT_TRUE(p.Spawn().ok());
  EXPECT_EQ(p.Wait(DeadlineAfterMs(30000)), 2);
  EXPECT_NE(p.Log().find("metrics_auth_file"), std::string::npos) << p.Log();
}

}  // namespace
}  // namespace kvstream::testing
