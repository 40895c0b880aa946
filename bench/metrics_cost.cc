// metrics_cost: what the daemons' metrics cost, measured in-process (no daemon, no network, so
// the figure holds on a noisy machine): ns per histogram observation (one thread, and four
// threads on one histogram), and the time to render one scrape of a decode's metrics (the
// daemon's families, 1 and 8 prefill peers).
//
//   metrics_cost [--observations 20000000] [--scrapes 2000] [--json-out FILE]
//
// Per token the decode observes one inter-token gap; per request a few more (TTFT, queue, one
// load wait per layer, a transfer's seconds and bytes). bench/run.sh metrics prints this beside
// the on/off runs; bench/results/metrics_overhead_*.md turns it into a share of a decode step.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/metrics.h"
#include "proto/kvstream.pb.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace d = kvstream::daemon;

double NsPerObservation(int threads, long n) {
  d::Histogram h(d::buckets::TokenSeconds());
  const auto t0 = Clock::now();
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&h, n, t] {
      double v = 0.0001 * (t + 1);
      for (long i = 0; i < n; ++i) {
        h.Observe(v);
        v = v < 1 ? v * 1.37 : 0.0001;  // walk the buckets
      }
    });
  for (auto& t : ts) t.join();
  const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  return ns / double(n);  // wall ns per observation of one thread, all threads at once
}

// A registry shaped like a decode daemon's with `peers` prefills, every histogram filled.
std::unique_ptr<d::MetricsRegistry> DecodeLikeRegistry(int peers) {
  auto r = std::make_unique<d::MetricsRegistry>();
  auto stats = std::make_shared<kvstream::v1::StatsResponse>();
  stats->set_role("decode");
  stats->set_model_name("tiny");
  stats->mutable_pool()->set_num_blocks(256);
  r->AddReader([stats](d::MetricsWriter& w) { d::WriteStatsMetrics(*stats, 1, w); });
  std::vector<d::Histogram*> hs = {
      r->AddHistogram("kvstream_decode_time_to_first_token_seconds", "h", {},
                      d::buckets::RequestSeconds()),
      r->AddHistogram("kvstream_decode_inter_token_latency_seconds", "h", {},
                      d::buckets::TokenSeconds()),
      r->AddHistogram("kvstream_decode_queue_seconds", "h", {}, d::buckets::RequestSeconds()),
      r->AddHistogram("kvstream_decode_layer_load_wait_seconds", "h", {},
                      d::buckets::LayerWaitSeconds())};
  for (int p = 0; p < peers; ++p) {
    const d::MetricLabels l = {{"transport", "ucx"}, {"peer", "prefill-" + std::to_string(p) + ":50061"}};
    hs.push_back(r->AddHistogram("kvstream_decode_kv_transfer_seconds", "h", l,
                                 d::buckets::RequestSeconds()));
    hs.push_back(r->AddHistogram("kvstream_decode_kv_transfer_bytes", "h", l, d::buckets::Bytes()));
  }
  for (auto* h : hs)
    for (double v = 1e-5; v < 1e10; v *= 3) h->Observe(v);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  long observations = 20000000, scrapes = 2000;
  std::string json_out;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--observations") observations = std::stol(argv[i + 1]);
    else if (a == "--scrapes") scrapes = std::stol(argv[i + 1]);
    else if (a == "--json-out") json_out = argv[i + 1];
    else {
      std::fprintf(stderr, "metrics_cost: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  nlohmann::ordered_json j;
  j["bench"] = "metrics_cost";
  j["observe_ns_1_thread"] = NsPerObservation(1, observations);
  j["observe_ns_4_threads"] = NsPerObservation(4, observations / 4);
  for (int peers : {1, 8}) {
    auto r = DecodeLikeRegistry(peers);
    size_t bytes = 0;
    const auto t0 = Clock::now();
    for (long i = 0; i < scrapes; ++i) bytes = r->Text().size();
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    j["scrape_us_" + std::to_string(peers) + "_peers"] = us / double(scrapes);
    j["scrape_bytes_" + std::to_string(peers) + "_peers"] = bytes;
  }
  std::printf("metrics_cost: observe %.1f ns (1 thread), %.1f ns (4 threads on one histogram); "
              "scrape %.0f us / %zu bytes (1 peer), %.0f us / %zu bytes (8 peers)\n",
              j["observe_ns_1_thread"].get<double>(), j["observe_ns_4_threads"].get<double>(),
              j["scrape_us_1_peers"].get<double>(), j["scrape_bytes_1_peers"].get<size_t>(),
              j["scrape_us_8_peers"].get<double>(), j["scrape_bytes_8_peers"].get<size_t>());
  if (!json_out.empty()) std::ofstream(json_out, std::ios::app) << j.dump() << "\n";
  else std::printf("%s\n", j.dump().c_str());
  return 0;
}
