#include "daemon/metrics.h"

#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include "common/log.h"
#include "daemon/credentials.h"
#include "daemon/daemon_config.h"
#include "daemon/daemon_runtime.h"
#include "proto/kvstream.pb.h"

// civetweb (the endpoint's HTTP server) asks for 100 KiB thread stacks (its build's
// USE_STACK_SIZE), and glibc refuses (EINVAL) a stack smaller than the static TLS of every loaded
// library, which CUDA's libraries alone take past 100 KiB. The executable's definition (exported:
// daemon/CMakeLists.txt) adds glibc's minimum stack, TLS included, to every size asked for.
extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) {
  using SetStackSize = int (*)(pthread_attr_t*, size_t);
  using MinStack = size_t (*)(const pthread_attr_t*);
  static const auto real =
      reinterpret_cast<SetStackSize>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  static const auto min_stack =
      reinterpret_cast<MinStack>(dlsym(RTLD_DEFAULT, "__pthread_get_minstack"));
  if (real == nullptr) return EINVAL;
  return real(attr, size + (min_stack ? min_stack(attr) : size_t{1} << 20));
}

namespace kvstream::daemon {

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)),
      counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  std::sort(bounds_.begin(), bounds_.end());
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double value) {
  // The first bound >= value (Prometheus' "le"); past the last: +Inf.
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot s;
  s.upper_bounds = bounds_;
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    total += counts_[i].load(std::memory_order_relaxed);
    s.cumulative.push_back(total);
  }
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

namespace buckets {
std::vector<double> RequestSeconds() {
  return {0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.035, 0.05, 0.075, 0.1,
          0.15, 0.25, 0.35, 0.5, 0.75, 1, 1.5, 2.5, 5, 10, 30, 60};
}
std::vector<double> TokenSeconds() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5};
}
std::vector<double> LayerWaitSeconds() {
  return {0.00001, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
          0.1, 0.25, 1, 5};
}
std::vector<double> Bytes() {
  std::vector<double> b;
  for (double v = 4096; v <= 17179869184.0; v *= 4) b.push_back(v);
  return b;
}
}  // namespace buckets

namespace {

std::vector<prometheus::ClientMetric::Label> ToLabels(const MetricLabels& labels) {
  std::vector<prometheus::ClientMetric::Label> out;
  for (const auto& [k, v] : labels) out.push_back({k, v});
  return out;
}

// Groups samples by name, in the order names first appear.
class FamilyWriter final : public MetricsWriter {
 public:
  explicit FamilyWriter(std::vector<prometheus::MetricFamily>* out) : out_(out) {}
  void Counter(const std::string& name, const std::string& help, const MetricLabels& labels,
               double value) override {
    prometheus::ClientMetric m;
    m.label = ToLabels(labels);
    m.counter.value = value;
    Family(name, help, prometheus::MetricType::Counter).metric.push_back(std::move(m));
  }
  void Gauge(const std::string& name, const std::string& help, const MetricLabels& labels,
             double value) override {
    prometheus::ClientMetric m;
    m.label = ToLabels(labels);
    m.gauge.value = value;
    Family(name, help, prometheus::MetricType::Gauge).metric.push_back(std::move(m));
  }
  prometheus::MetricFamily& Family(const std::string& name, const std::string& help,
                                   prometheus::MetricType type) {
    auto [it, fresh] = index_.try_emplace(name, out_->size());
    if (fresh) out_->push_back(prometheus::MetricFamily{name, help, type, {}});
    return (*out_)[it->second];
  }

 private:
  std::vector<prometheus::MetricFamily>* out_;
  std::map<std::string, size_t> index_;
};

}  // namespace

class MetricsRegistry::Impl final : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out;
    FamilyWriter w(&out);
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& r : readers_) r(w);
    for (const auto& h : histograms_) {
      const Histogram::Snapshot s = h.histogram->Read();
      prometheus::ClientMetric m;
      m.label = ToLabels(h.labels);
      m.histogram.sample_count = s.cumulative.back();
      m.histogram.sample_sum = s.sum;
      for (size_t i = 0; i < s.cumulative.size(); ++i) {
        const double le = i < s.upper_bounds.size() ? s.upper_bounds[i]
                                                     : std::numeric_limits<double>::infinity();
        m.histogram.bucket.push_back({s.cumulative[i], le});
      }
      w.Family(h.name, h.help, prometheus::MetricType::Histogram).metric.push_back(std::move(m));
    }
    return out;
  }

  struct Series {
    std::string name, help;
    MetricLabels labels;
    std::unique_ptr<Histogram> histogram;
  };
  mutable std::mutex mu_;
  std::vector<Series> histograms_;
  std::vector<std::function<void(MetricsWriter&)>> readers_;
};

MetricsRegistry::MetricsRegistry() : impl_(std::make_unique<Impl>()) {}
MetricsRegistry::~MetricsRegistry() = default;

Histogram* MetricsRegistry::AddHistogram(const std::string& name, const std::string& help,
                                         const MetricLabels& labels,
                                         std::vector<double> upper_bounds) {
  std::lock_guard<std::mutex> lock(impl_->mu_);
  impl_->histograms_.push_back(
      {name, help, labels, std::make_unique<Histogram>(std::move(upper_bounds))});
  return impl_->histograms_.back().histogram.get();
}

void MetricsRegistry::AddReader(std::function<void(MetricsWriter&)> reader) {
  std::lock_guard<std::mutex> lock(impl_->mu_);
  impl_->readers_.push_back(std::move(reader));
}

std::string MetricsRegistry::Text() const {
  std::ostringstream os;
  prometheus::TextSerializer().Serialize(os, impl_->Collect());
  return os.str();
}

void WriteStatsMetrics(const v1::StatsResponse& s, int peers_connected, MetricsWriter& out) {
  const std::string role = s.role();
  const std::string p = "kvstream_" + role + "_";
  const v1::Counters& c = s.counters();
  out.Gauge("kvstream_daemon_info",
            "Always 1; labels: the daemon's role, model, compute backend and data-plane transport",
            {{"role", role}, {"model", s.model_name()}, {"backend", s.backend()},
             {"transport", s.transport()}},
            1);
  const std::string req_help = role == "decode"
      ? "Generate requests that ended, by outcome (failed includes those refused at admission)"
      : "Prefill calls that ended, by outcome";
  out.Counter(p + "requests_total", req_help, {{"outcome", "ok"}}, double(c.requests_ok()));
  out.Counter(p + "requests_total", req_help, {{"outcome", "failed"}}, double(c.requests_failed()));
  out.Counter(p + "requests_total", req_help, {{"outcome", "cancelled"}},
              double(c.requests_cancelled()));
  out.Gauge(p + "requests_in_flight",
            role == "decode" ? "Generate requests admitted and not yet ended"
                             : "Prefill calls running",
            {}, s.requests_in_flight());
  out.Counter(p + "kv_bytes_total",
              role == "decode" ? "KV bytes loaded into this pool by prefills (completed loads)"
                               : "KV bytes written to decode pools",
              {}, double(c.kv_bytes_moved()));
  out.Counter(p + "handshakes_total",
              role == "decode" ? "Handshakes this decode completed with its prefills"
                               : "Handshakes accepted from decode daemons",
              {}, double(c.handshakes()));
  out.Gauge(p + "peers_connected",
            role == "decode" ? "Prefill daemons whose last handshake is valid"
                             : "Decode daemons with a connected data-plane link",
            {}, peers_connected);
  const std::string pool_help = "KV pool blocks by state (used includes prompt-cache blocks)";
  out.Gauge("kvstream_pool_blocks", pool_help, {{"state", "free"}}, s.pool().free_blocks());
  out.Gauge("kvstream_pool_blocks", pool_help, {{"state", "used"}},
            s.pool().num_blocks() - s.pool().free_blocks());
  out.Gauge("kvstream_pool_block_bytes", "Bytes of one KV block over every layer", {},
            double(s.pool().block_bytes()) * s.pool().num_layers());
  if (role == "decode") {
    out.Counter(p + "tokens_generated_total", "Tokens streamed to clients", {},
                double(c.tokens_generated()));
    out.Counter(p + "loads_recomputed_total",
                "Prompts computed locally after their KV load failed (on_load_failure=recompute)",
                {}, double(c.loads_recomputed()));
    out.Counter(p + "stale_signals_ignored_total",
                "Layer notifications for unknown or finished requests, ignored", {},
                double(c.stale_signals_ignored()));
    out.Counter(p + "data_connections_refused_total",
                "Data-plane (UCX) connections refused: no authenticated handshake admitted them",
                {}, double(c.data_connections_refused()));
    out.Counter(p + "notifications_dropped_total",
                "Layer notifications dropped: their MAC did not verify (forged, stale or foreign)",
                {}, double(c.notifications_dropped()));
    out.Gauge(p + "quarantined_blocks",
              "Blocks held after losing their writer, until it is safe to reuse them", {},
              s.quarantined_blocks());
    out.Counter(p + "steps_total", "Decode steps (one token for every running stream)", {},
                double(c.decode_steps()));
    out.Counter(p + "step_seconds_total",
                "Wall time of the scheduler iterations that ran a decode step", {},
                double(c.decode_loop_us()) * 1e-6);
    out.Counter(p + "step_forward_seconds_total", "Model forward time of the decode steps", {},
                double(c.decode_forward_us()) * 1e-6);
    out.Counter(p + "joins_deferred_total",
                "Landed prompts whose first step was put off by the ITL target, per step", {},
                double(c.decode_joins_deferred()));
  } else {
    out.Gauge(p + "prompt_cache_blocks", "Pool blocks held by the prefix cache", {},
              s.pool().prompt_cache_blocks());
    const std::string pc_help = "Prefill calls by prefix-cache result: hit = at least one block "
                                "of the prompt cached (miss counted only while the cache is on)";
    out.Counter(p + "prompt_cache_requests_total", pc_help, {{"result", "hit"}},
                double(c.prompt_cache_hits()));
    out.Counter(p + "prompt_cache_requests_total", pc_help, {{"result", "miss"}},
                double(c.prompt_cache_misses()));
    out.Counter(p + "prompt_cache_evicted_blocks_total", "Blocks evicted from the prefix cache",
                {}, double(c.prompt_cache_evictions()));
    out.Counter(p + "prompt_cache_hit_tokens_total", "Prompt tokens taken from the prefix cache",
                {}, double(c.prompt_cache_hit_tokens()));
    if (s.kv_tiers_size() > 0) {
      out.Counter(p + "kv_tier_fetched_tokens_total",
                  "Prompt tokens whose KV came up from a tier below the pool", {},
                  double(s.kv_tier_fetched_tokens()));
      out.Counter(p + "kv_tier_fetch_seconds_total",
                  "Time prefill calls waited for reads from the KV tiers", {},
                  double(s.kv_tier_fetch_us()) * 1e-6);
      out.Counter(p + "kv_tier_recomputed_tokens_total",
                  "Prompt tokens found in a tier but computed (threshold, policy, late or failed read)",
                  {}, double(s.kv_tier_recomputed_tokens()));
      out.Counter(p + "kv_tier_late_blocks_total",
                  "Disk or store reads not done when the tier policy stopped waiting", {},
                  double(s.kv_tier_late_blocks()));
    }
  }
  // Both roles: the tiers below the pool (the decode's: the store its finished conversations
  // are written down to) and their write-down.
  for (const auto& t : s.kv_tiers()) {
    const MetricLabels tier = {{"tier", t.name()}};
    out.Counter(p + "kv_tier_blocks_read_total", "KV blocks read back up into the pool from a tier",
                tier, double(t.hit_blocks()));
    out.Counter(p + "kv_tier_misses_total", "Reads of a block the tier did not hold", tier,
                double(t.miss_blocks()));
    out.Counter(p + "kv_tier_read_failures_total",
                "Tier reads refused: damaged, truncated, bad HMAC, I/O error", tier,
                double(t.read_failures()));
    out.Counter(p + "kv_tier_read_bytes_total", "Bytes read from a KV tier", tier,
                double(t.bytes_read()));
    out.Counter(p + "kv_tier_written_bytes_total", "Bytes written to a KV tier", tier,
                double(t.bytes_written()));
    out.Counter(p + "kv_tier_written_blocks_total", "Blocks written to a KV tier", tier,
                double(t.written_blocks()));
    out.Counter(p + "kv_tier_write_failures_total", "Tier writes that stored nothing", tier,
                double(t.write_failures()));
    out.Counter(p + "kv_tier_evicted_blocks_total", "Blocks evicted from a tier (LRU or age)",
                tier, double(t.evicted_blocks()));
    out.Gauge(p + "kv_tier_entries", "Blocks a KV tier holds", tier, double(t.entries()));
    out.Gauge(p + "kv_tier_used_bytes", "Bytes a KV tier holds", tier, double(t.bytes_used()));
    out.Gauge(p + "kv_tier_capacity_bytes", "A KV tier's size bound", tier,
              double(t.capacity_bytes()));
  }
  if (s.kv_tiers_size() > 0) {
    out.Gauge(p + "kv_tier_queued_blocks", "Blocks waiting to be written down to the tiers", {},
              double(s.kv_tier_queued_blocks()));
    out.Counter(p + "kv_tier_skipped_blocks_total",
                "Blocks not written down to the tiers: the write-down queue was full", {},
                double(s.kv_tier_skipped_blocks()));
    out.Counter(p + "kv_tier_held_blocks_total",
                "Blocks of write-downs that every tier held already (not written again)", {},
                double(s.kv_tier_held_blocks()));
    if (s.role() == "prefill")
      out.Counter(p + "kv_tier_write_back_blocks_total",
                  "Blocks queued for the write-down when the prompt cache evicted them "
                  "(kv_tier_write_policy write_back)", {},
                  double(s.kv_tier_write_back_blocks()));
  }
  if (s.has_prefill_routes()) {
    const v1::PrefillRouteStats& r = s.prefill_routes();
    const std::string routes_help =
        "Requests given a prefill among several, by how: prefix (the prefill ranked for the "
        "prompt's prefix), load (no route key: least loaded), round_robin (none ready)";
    out.Counter(p + "prefill_routes_total", routes_help, {{"by", "prefix"}}, double(r.by_prefix()));
    out.Counter(p + "prefill_routes_total", routes_help, {{"by", "load"}}, double(r.by_load()));
    out.Counter(p + "prefill_routes_total", routes_help, {{"by", "round_robin"}},
                double(r.round_robin()));
    const std::string moves_help =
        "Requests routed by prefix to another prefill than the first-ranked one, by its state";
    out.Counter(p + "prefill_route_moves_total", moves_help, {{"reason", "down"}},
                double(r.moved_down()));
    out.Counter(p + "prefill_route_moves_total", moves_help, {{"reason", "overloaded"}},
                double(r.moved_busy()));
  }
}

namespace {

class CivetEndpoint final : public MetricsEndpoint {
 public:
  CivetEndpoint(std::unique_ptr<prometheus::Exposer> exposer, int port,
                std::shared_ptr<MetricsRegistry> registry)
      : exposer_(std::move(exposer)), port_(port), registry_(std::move(registry)) {}
  int port() const override { return port_; }

 private:
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_;
  std::shared_ptr<MetricsRegistry> registry_;  // outlives the exposer's last scrape
};

}  // namespace

Result<std::unique_ptr<MetricsEndpoint>> StartMetricsEndpoint(
    const DaemonConfig& cfg, const Security& security, std::shared_ptr<MetricsRegistry> registry) {
  if (cfg.metrics.empty()) return std::unique_ptr<MetricsEndpoint>();
  KV_ASSIGN_OR_RETURN(std::string address, ResolveListenAddress(cfg.metrics));
  // civetweb's worker threads answer one connection each; request_timeout_ms bounds how long a slow,
  // idle or non-reading client holds one.
  std::vector<std::string> options = {"listening_ports", address,
                                      "num_threads", "4",
                                      "request_timeout_ms", "5000",
                                      "keep_alive_timeout_ms", "5000",
                                      "enable_keep_alive", "yes",
                                      "max_request_size", "16384"};
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(options);
  } catch (const std::exception& e) {
    return Unavailable("metrics: cannot listen on " + cfg.metrics + ": " + e.what());
  }
  if (!security.metrics_user.empty()) {
    exposer->RegisterAuth(
        [user = security.metrics_user, password = security.metrics_password](
            const std::string& u, const std::string& p) {
          // Both compared in full, in constant time.
          const bool user_ok = ConstantTimeEquals(u, user);
          const bool password_ok = ConstantTimeEquals(p, password);
          return user_ok && password_ok;
        },
        "kvstream");
  }
  std::shared_ptr<prometheus::Collectable> collectable(registry, &registry->impl());
  exposer->RegisterCollectable(collectable);
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty()) return Unavailable("metrics: no listening port on " + cfg.metrics);
  const int port = ports.front();
  if (!cfg.metrics_port_file.empty()) KV_RETURN_IF_ERROR(WritePortFile(cfg.metrics_port_file, port));
  KV_LOG_INFO << "metrics: http://" << address.substr(0, address.rfind(':')) << ":" << port
              << "/metrics" << (security.metrics_user.empty() ? "" : " (basic auth)");
  return std::unique_ptr<MetricsEndpoint>(
      std::make_unique<CivetEndpoint>(std::move(exposer), port, std::move(registry)));
}

}  // namespace kvstream::daemon
