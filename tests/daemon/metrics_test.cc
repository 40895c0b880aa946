// daemon/metrics: the histogram's buckets, the text exposition, the Stats mapping (the KV tiers
// of both roles, the decode's prefill routing), the start-up rule for the metrics address and
// the endpoint's basic auth (in this process, over loopback).
#include "daemon/metrics.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <thread>

#include "daemon/credentials.h"
#include "daemon/daemon_config.h"
#include "proto/kvstream.pb.h"
#include "tests/daemon/http_probe.h"

namespace kvstream::daemon {
namespace {

using kvstream::testing::HttpGet;

Result<DaemonConfig> Parse(std::vector<std::string> args, const std::string& role) {
  args.insert(args.begin(), "kvstream-" + role);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return ParseDaemonConfig(static_cast<int>(argv.size()), argv.data(), role);
}

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/kvstream_metrics_" + name;
  std::ofstream(path) << text;
  chmod(path.c_str(), 0600);
  return path;
}

TEST(Metrics, HistogramBucketsAreLessOrEqual) {
  Histogram h({0.1, 1, 10});
  for (double v : {0.05, 0.1, 0.5, 1.0, 20.0}) h.Observe(v);
  const Histogram::Snapshot s = h.Read();
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{2, 4, 4, 5}));  // le 0.1, 1, 10, +Inf
  EXPECT_DOUBLE_EQ(s.sum, 21.65);
}

TEST(Metrics, HistogramIsSafeFromManyThreads) {
  Histogram h(buckets::TokenSeconds());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&h] {
      for (int i = 0; i < 10000; ++i) h.Observe(0.001 * (i % 7));
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(h.Read().cumulative.back(), 40000u);
}

TEST(Metrics, TextHasEveryFamilyOnceWithHelpAndType) {
  MetricsRegistry r;
  Histogram* a = r.AddHistogram("kvstream_test_seconds", "a test", {{"peer", "x:1"}}, {1, 2});
  r.AddHistogram("kvstream_test_seconds", "a test", {{"peer", "y:1"}}, {1, 2});
  r.AddReader([](MetricsWriter& w) {
    w.Counter("kvstream_test_total", "counted", {{"outcome", "ok"}}, 3);
    w.Counter("kvstream_test_total", "counted", {{"outcome", "failed"}}, 1);
    w.Gauge("kvstream_test_blocks", "blocks", {}, 7);
  });
  a->Observe(1.5);
  const std::string text = r.Text();
  EXPECT_NE(text.find("# TYPE kvstream_test_seconds histogram"), std::string::npos) << text;
  EXPECT_NE(text.find("kvstream_test_seconds_bucket{peer=\"x:1\",le=\"2\"} 1"), std::string::npos)
      << text;
  EXPECT_NE(text.find("kvstream_test_seconds_bucket{peer=\"x:1\",le=\"+Inf\"} 1"),
            std::string::npos);
  EXPECT_NE(text.find("kvstream_test_seconds_count{peer=\"y:1\"} 0"), std::string::npos);
  EXPECT_NE(text.find("kvstream_test_total{outcome=\"failed\"} 1"), std::string::npos);
  EXPECT_NE(text.find("kvstream_test_blocks 7"), std::string::npos);
  for (const char* family : {"kvstream_test_seconds", "kvstream_test_total", "kvstream_test_blocks"}) {
    const std::string type = std::string("# TYPE ") + family + " ";
    EXPECT_EQ(text.find(type), text.rfind(type)) << family << " twice";
  }
}

TEST(Metrics, StatsBecomeCountersAndGauges) {
  v1::StatsResponse s;
  s.set_role("decode");
  s.set_model_name("tiny");
  s.mutable_pool()->set_num_blocks(10);
  s.mutable_pool()->set_free_blocks(4);
  s.mutable_counters()->set_requests_ok(5);
  s.mutable_counters()->set_requests_failed(2);
  s.mutable_counters()->set_loads_recomputed(1);
  MetricsRegistry r;
  r.AddReader([&s](MetricsWriter& w) { WriteStatsMetrics(s, 2, w); });
  const std::string text = r.Text();
  for (const char* sample : {"kvstream_decode_requests_total{outcome=\"ok\"} 5",
                             "kvstream_decode_requests_total{outcome=\"failed\"} 2",
                             "kvstream_decode_loads_recomputed_total 1",
                             "kvstream_decode_peers_connected 2",
                             "kvstream_pool_blocks{state=\"free\"} 4",
                             "kvstream_pool_blocks{state=\"used\"} 6"})
    EXPECT_NE(text.find(sample), std::string::npos) << sample << "\n" << text;
}

// The decode's store tier (its finished conversations' write-down) and its prefill routing
// (several prefills) as metrics; a decode without them exports neither.
TEST(Metrics, DecodeStoreTierAndPrefillRoutesBecomeCounters) {
  v1::StatsResponse s;
  s.set_role("decode");
  MetricsRegistry bare;
  bare.AddReader([&s](MetricsWriter& w) { WriteStatsMetrics(s, 1, w); });
  const std::string none = bare.Text();
  EXPECT_EQ(none.find("kv_tier"), std::string::npos) << none;
  EXPECT_EQ(none.find("prefill_route"), std::string::npos) << none;

  v1::KvTierStats* store = s.add_kv_tiers();
  store->set_name("store");
  store->set_written_blocks(3);
  store->set_bytes_written(3000);
  store->set_write_failures(1);
  s.set_kv_tier_queued_blocks(2);
  s.set_kv_tier_skipped_blocks(4);
  s.set_kv_tier_held_blocks(5);
  s.set_kv_tier_write_back_blocks(8);
  v1::PrefillRouteStats* routes = s.mutable_prefill_routes();
  routes->set_by_prefix(7);
  routes->set_by_load(6);
  routes->set_round_robin(1);
  routes->set_moved_down(2);
  routes->set_moved_busy(3);
  MetricsRegistry r;
  r.AddReader([&s](MetricsWriter& w) { WriteStatsMetrics(s, 2, w); });
  const std::string text = r.Text();
  for (const char* sample : {"kvstream_decode_kv_tier_written_blocks_total{tier=\"store\"} 3",
                             "kvstream_decode_kv_tier_written_bytes_total{tier=\"store\"} 3000",
                             "kvstream_decode_kv_tier_write_failures_total{tier=\"store\"} 1",
                             "kvstream_decode_kv_tier_queued_blocks 2",
                             "kvstream_decode_kv_tier_skipped_blocks_total 4",
                             "kvstream_decode_kv_tier_held_blocks_total 5",
                             "kvstream_decode_prefill_routes_total{by=\"prefix\"} 7",
                             "kvstream_decode_prefill_routes_total{by=\"load\"} 6",
                             "kvstream_decode_prefill_routes_total{by=\"round_robin\"} 1",
                             "kvstream_decode_prefill_route_moves_total{reason=\"down\"} 2",
                             "kvstream_decode_prefill_route_moves_total{reason=\"overloaded\"} 3"})
    EXPECT_NE(text.find(sample), std::string::npos) << sample << "\n" << text;
  // The prefill's read-path figures and write-back stay the prefill's.
  EXPECT_EQ(text.find("kv_tier_fetched_tokens"), std::string::npos);
  EXPECT_EQ(text.find("kv_tier_write_back_blocks"), std::string::npos);

  s.set_role("prefill");
  s.clear_prefill_routes();
  const std::string prefill = r.Text();
  for (const char* sample : {"kvstream_prefill_kv_tier_written_blocks_total{tier=\"store\"} 3",
                             "kvstream_prefill_kv_tier_skipped_blocks_total 4",
                             "kvstream_prefill_kv_tier_held_blocks_total 5",
                             "kvstream_prefill_kv_tier_write_back_blocks_total 8",
                             "kvstream_prefill_kv_tier_fetched_tokens_total 0"})
    EXPECT_NE(prefill.find(sample), std::string::npos) << sample << "\n" << prefill;
  EXPECT_EQ(prefill.find("prefill_route"), std::string::npos);
}

TEST(Metrics, NonLoopbackMetricsNeedAuthOrInsecure) {
  auto cfg = Parse({"--metrics=0.0.0.0:0"}, "prefill");
  ASSERT_TRUE(cfg.ok());
  auto s = SecurityFromConfig(*cfg, "prefill");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("metrics_auth_file"), std::string::npos);
  EXPECT_NE(s.status().message().find("--insecure"), std::string::npos);

  cfg = Parse({"--metrics=0.0.0.0:0", "--insecure"}, "prefill");
  ASSERT_TRUE(SecurityFromConfig(*cfg, "prefill").ok());
  const std::string auth = WriteFile("auth", "scraper:0123456789abcdef0123\n");
  cfg = Parse({"--metrics=0.0.0.0:0", "--metrics_auth_file=" + auth, "--peer=127.0.0.1:1"}, "decode");
  s = SecurityFromConfig(*cfg, "decode");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->metrics_user, "scraper");
  EXPECT_EQ(s->metrics_password, "0123456789abcdef0123");
  // A short password, no user: refused without echoing the file's content.
  for (const char* bad : {"scraper:short-secret", ":0123456789abcdef0123", "0123456789abcdef0123"}) {
    cfg = Parse({"--metrics_auth_file=" + WriteFile("bad", bad), "--peer=127.0.0.1:1"}, "decode");
    s = SecurityFromConfig(*cfg, "decode");
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.status().message().find("0123456789abcdef"), std::string::npos);
    EXPECT_EQ(s.status().message().find("short-secret"), std::string::npos);
  }
}

TEST(Metrics, EndpointServesTextAndChecksBasicAuth) {
  auto registry = std::make_shared<MetricsRegistry>();
  registry->AddReader([](MetricsWriter& w) { w.Gauge("kvstream_test_up", "up", {}, 1); });
  auto cfg = Parse({"--metrics=127.0.0.1:0"}, "prefill");
  ASSERT_TRUE(cfg.ok());
  Security open;
  auto ep = StartMetricsEndpoint(*cfg, open, registry);
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  auto r = HttpGet((*ep)->port(), "/metrics");
  EXPECT_EQ(r.status, 200) << r.head;
  EXPECT_NE(r.body.find("kvstream_test_up 1"), std::string::npos) << r.body;
  EXPECT_NE(r.head.find("text/plain"), std::string::npos) << r.head;

  Security locked;
  locked.metrics_user = "scraper";
  locked.metrics_password = "0123456789abcdef0123";
  auto ep2 = StartMetricsEndpoint(*cfg, locked, registry);
  ASSERT_TRUE(ep2.ok()) << ep2.status().ToString();
  const int port = (*ep2)->port();
  EXPECT_EQ(HttpGet(port, "/metrics").status, 401);
  EXPECT_EQ(HttpGet(port, "/metrics", "scraper:0123456789abcdef0124").status, 401);
  EXPECT_EQ(HttpGet(port, "/metrics", "other:0123456789abcdef0123").status, 401);
  r = HttpGet(port, "/metrics", "scraper:0123456789abcdef0123");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body.find("0123456789abcdef"), std::string::npos);

  // A port in use is refused with the address named.
  cfg = Parse({"--metrics=127.0.0.1:" + std::to_string(port)}, "prefill");
  auto busy = StartMetricsEndpoint(*cfg, open, registry);
  ASSERT_FALSE(busy.ok());
  EXPECT_EQ(busy.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(busy.status().message().find(std::to_string(port)), std::string::npos);
}

}  // namespace
}  // namespace kvstream::daemon
