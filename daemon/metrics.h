// Prometheus metrics of the daemons (docs/operations.md lists every one): a registry the services
// fill once at start, and an HTTP endpoint serving it in the Prometheus text format at /metrics.
//
// Guarantees:
//  - Histogram::Observe is lock-free and wait-free (a search over the fixed bounds, then relaxed
//    atomic adds); any thread may call it. Label values are fixed when a series is made, at
//    start, never per request.
//  - Counters and gauges are not kept here: a reader (AddReader) turns the service's own
//    counters, the ones its gRPC Stats call reports, into samples at each scrape, so the two
//    always agree and nothing is counted twice.
//  - The endpoint (StartMetricsEndpoint) binds exactly cfg.metrics; with a credential
//    (Security::metrics_user/password) every request without the right basic-auth pair gets 401.
//    It runs on its own threads: slow, idle or malformed HTTP clients delay only other scrapes,
//    never the gRPC service (bounded by a request timeout, docs/security.md).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace kvstream::v1 {
class StatsResponse;
}

namespace kvstream::daemon {

struct DaemonConfig;
struct Security;

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// Cumulative histogram over fixed upper bounds (a value v counts in every bucket whose bound
// is >= v; +Inf is implicit).
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double value);
  struct Snapshot {
    std::vector<double> upper_bounds;     // without +Inf
    std::vector<uint64_t> cumulative;     // one per bound, then +Inf (== count)
    double sum = 0;
  };
  Snapshot Read() const;

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // per bucket, not cumulative; +Inf last
  std::atomic<double> sum_{0};
};

// Bucket bounds, in base units, for what the daemons measure.
namespace buckets {
std::vector<double> RequestSeconds();  // TTFT, queue time, prefill compute, transfers: 0.5 ms - 60 s
std::vector<double> TokenSeconds();    // inter-token latency: 0.1 ms - 5 s
std::vector<double> LayerWaitSeconds();  // per-layer load wait: 10 us - 5 s
std::vector<double> Bytes();           // KV bytes per transfer: 4 KiB - 16 GiB, x4
}  // namespace buckets

// Samples a reader writes at scrape time. Samples of one name form one family (its first
// help and type win).
class MetricsWriter {
 public:
  virtual ~MetricsWriter() = default;
  virtual void Counter(const std::string& name, const std::string& help,
                       const MetricLabels& labels, double value) = 0;
  virtual void Gauge(const std::string& name, const std::string& help,
                     const MetricLabels& labels, double value) = 0;
};

class MetricsRegistry {
 public:
  MetricsRegistry();
  ~MetricsRegistry();
  // A histogram series (at start only). The same name again adds a series to its family: give
  // it the same help, bounds and label names. The pointer lives as long as the registry.
  Histogram* AddHistogram(const std::string& name, const std::string& help,
                          const MetricLabels& labels, std::vector<double> upper_bounds);
  // Called at every scrape, in the order added (at start only).
  void AddReader(std::function<void(MetricsWriter&)> reader);
  // The text exposition of every metric (what GET /metrics answers).
  std::string Text() const;

  class Impl;
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// The figures of a Stats response as metrics: the role's request counters by outcome, tokens,
// KV bytes, recomputes, stale signals, handshakes, prompt cache, scheduler time; gauges of the
// pool, requests in flight, quarantined blocks, `peers_connected`; kvstream_daemon_info; the KV
// tiers and their write-down where the response has tiers (either role); the decode's prefill
// routing where it has several prefills (`prefill_routes`).
void WriteStatsMetrics(const kvstream::v1::StatsResponse& stats, int peers_connected,
                       MetricsWriter& out);

class MetricsEndpoint {
 public:
  virtual ~MetricsEndpoint() = default;
  virtual int port() const = 0;
};
// Serves `registry` at http://<cfg.metrics>/metrics (port 0: one is picked; cfg.metrics_port_file
// gets the bound port); null when cfg.metrics is empty. The loopback / credential rule is SecurityFromConfig's. kUnavailable when
// the address cannot be bound.
Result<std::unique_ptr<MetricsEndpoint>> StartMetricsEndpoint(
    const DaemonConfig& cfg, const Security& security, std::shared_ptr<MetricsRegistry> registry);

}  // namespace kvstream::daemon
