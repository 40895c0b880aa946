#include "cli/serve/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <sstream>

namespace kvstream::cli::serve {

using json = nlohmann::ordered_json;

bool ParseSlo(const std::string& text, Slo* slo, std::string* error) {
  std::string t = text;
  std::replace(t.begin(), t.end(), ',', ' ');
  std::stringstream ss(t);
  std::string item;
  while (ss >> item) {
    const size_t colon = item.find(':');
    double v = 0;
    try {
      size_t used = 0;
      if (colon == std::string::npos) throw std::invalid_argument(item);
      v = std::stod(item.substr(colon + 1), &used);
      if (used != item.size() - colon - 1 || !(v > 0)) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      *error = "--goodput: '" + item + "' is not KEY:MILLISECONDS with a positive number";
      return false;
    }
    const std::string key = item.substr(0, colon);
    if (key == "ttft") slo->ttft_ms = v;
    else if (key == "tpot") slo->tpot_ms = v;
    else if (key == "e2el") slo->e2el_ms = v;
    else {
      *error = "--goodput: unknown metric '" + key + "' (have: ttft, tpot, e2el)";
      return false;
    }
  }
  return true;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = p / 100.0 * double(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - double(lo));
}

Dist Summarize(const std::vector<double>& seconds, const std::vector<double>& percentiles) {
  Dist d;
  std::vector<double> ms(seconds.size());
  std::transform(seconds.begin(), seconds.end(), ms.begin(), [](double s) { return s * 1e3; });
  if (!ms.empty()) {
    d.mean = std::accumulate(ms.begin(), ms.end(), 0.0) / double(ms.size());
    double var = 0;
    for (double x : ms) var += (x - d.mean) * (x - d.mean);
    d.std = std::sqrt(var / double(ms.size()));  // numpy.std: the population's
  }
  d.median = Percentile(ms, 50);
  for (double p : percentiles) d.pct.emplace_back(p, Percentile(ms, p));
  return d;
}

RunMetrics ComputeMetrics(const std::vector<RequestRecord>& records, double duration_s,
                          const std::vector<double>& percentiles, const Slo& slo) {
  RunMetrics m;
  m.duration_s = duration_s;
  std::vector<double> ttfts, tpots, itls, e2els, first, later;
  int good = 0;
  for (const RequestRecord& r : records) {
    if (!r.ok) {
      ++m.failed;
      ++m.errors[r.error];
      continue;
    }
    ++m.completed;
    m.total_input += r.prompt_len;
    m.total_output += r.output_tokens;
    m.total_chunks += r.chunks;
    if (!r.usage) ++m.without_usage;
    double tpot = 0;
    if (r.output_tokens > 1) {
      tpot = (r.latency_s - r.ttft_s) / double(r.output_tokens - 1);
      tpots.push_back(tpot);
    }
    itls.insert(itls.end(), r.itl_s.begin(), r.itl_s.end());
    ttfts.push_back(r.ttft_s);
    e2els.push_back(r.latency_s);
    (r.turn == 0 ? first : later).push_back(r.ttft_s);
    if (slo.any() && (!slo.ttft_ms || r.ttft_s * 1e3 <= *slo.ttft_ms) &&
        (!slo.tpot_ms || tpot * 1e3 <= *slo.tpot_ms) && (!slo.e2el_ms || r.latency_s * 1e3 <= *slo.e2el_ms))
      ++good;
  }
  if (duration_s > 0) {
    m.request_throughput = m.completed / duration_s;
    m.request_goodput = good / duration_s;
    m.output_throughput = double(m.total_output) / duration_s;
    m.total_token_throughput = double(m.total_input + m.total_output) / duration_s;
  }
  m.ttft = Summarize(ttfts, percentiles);
  m.tpot = Summarize(tpots, percentiles);
  m.itl = Summarize(itls, percentiles);
  m.e2el = Summarize(e2els, percentiles);
  m.ttft_first_turn = Summarize(first, percentiles);
  m.ttft_later_turns = Summarize(later, percentiles);

  // Peak output tokens in a one-second bucket, and the peak number of requests in flight.
  double t0 = INFINITY, t1 = -INFINITY;
  for (const RequestRecord& r : records)
    if (r.ok) t0 = std::min(t0, r.start_s), t1 = std::max(t1, r.start_s + r.latency_s);
  if (m.completed > 0) {
    std::vector<double> buckets(static_cast<size_t>(std::ceil(t1 - t0)) + 1, 0.0);
    std::vector<std::pair<double, int>> events;
    for (const RequestRecord& r : records) {
      if (!r.ok) continue;
      double t = r.start_s + r.ttft_s;
      auto add = [&](double at) {
        const auto b = static_cast<int64_t>(at - t0);
        if (b >= 0 && b < int64_t(buckets.size())) buckets[size_t(b)] += 1;
      };
      add(t);
      for (double g : r.itl_s) add(t += g);
      events.emplace_back(r.start_s, 1);
      events.emplace_back(r.start_s + r.latency_s, -1);
    }
    m.max_output_tokens_per_s = *std::max_element(buckets.begin(), buckets.end());
    std::sort(events.begin(), events.end());  // at equal times, -1 (an end) before +1
    int now = 0;
    for (const auto& e : events) m.max_concurrent_requests = std::max(m.max_concurrent_requests, now += e.second);
  }
  return m;
}

namespace {

std::string PctName(double p) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", p);
  std::string s = b;
  std::replace(s.begin(), s.end(), '.', '_');
  return "p" + s;
}

void PutDist(json& j, const std::string& name, const Dist& d) {
  j["mean_" + name + "_ms"] = d.mean;
  j["median_" + name + "_ms"] = d.median;
  j["std_" + name + "_ms"] = d.std;
  for (const auto& [p, v] : d.pct) j[PctName(p) + "_" + name + "_ms"] = v;
}

}  // namespace

json MetricsJson(const RunInfo& info, const RunMetrics& m, const Slo& slo) {
  json j;
  j["bench"] = "serve";
  j["label"] = info.label;
  j["url"] = info.url;
  j["endpoint"] = info.endpoint;
  j["model"] = info.model;
  j["dataset"] = info.dataset;
  j["load_mode"] = info.load_mode;
  j["request_rate"] = std::isinf(info.request_rate) ? json("inf") : json(info.request_rate);
  j["max_concurrency"] = info.max_concurrency;
  j["num_requests"] = info.num_requests;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["errors"] = m.errors;
  j["duration_s"] = m.duration_s;
  j["total_input_tokens"] = m.total_input;
  j["total_output_tokens"] = m.total_output;
  j["total_streamed_chunks"] = m.total_chunks;
  j["requests_without_usage"] = m.without_usage;
  j["request_throughput"] = m.request_throughput;
  if (slo.any()) {
    j["request_goodput"] = m.request_goodput;
    json s = json::object();
    if (slo.ttft_ms) s["ttft_ms"] = *slo.ttft_ms;
    if (slo.tpot_ms) s["tpot_ms"] = *slo.tpot_ms;
    if (slo.e2el_ms) s["e2el_ms"] = *slo.e2el_ms;
    j["goodput_slo"] = s;
  }
  j["output_throughput"] = m.output_throughput;
  j["total_token_throughput"] = m.total_token_throughput;
  j["max_output_tokens_per_s"] = m.max_output_tokens_per_s;
  j["max_concurrent_requests"] = m.max_concurrent_requests;
  PutDist(j, "ttft", m.ttft);
  PutDist(j, "tpot", m.tpot);
  PutDist(j, "itl", m.itl);
  PutDist(j, "e2el", m.e2el);
  if (info.multiturn) {
    PutDist(j, "ttft_first_turn", m.ttft_first_turn);
    PutDist(j, "ttft_later_turns", m.ttft_later_turns);
  }
  return j;
}

std::string MetricsCsv(const std::vector<json>& rows) {
  auto cell = [](const json& v) -> std::string {
    if (v.is_string()) {
      std::string s = v.get<std::string>(), out = "\"";
      for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
      return out + "\"";
    }
    if (v.is_object()) {  // errors, goodput_slo
      std::string s;
      for (const auto& [k, x] : v.items()) s += (s.empty() ? "" : ";") + k + "=" + x.dump();
      std::string out = "\"";
      for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
      return out + "\"";
    }
    return v.dump();
  };
  std::vector<std::string> keys;
  for (const json& r : rows)
    for (const auto& [k, v] : r.items())
      if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
  std::string out;
  for (size_t i = 0; i < keys.size(); ++i) out += (i ? "," : "") + keys[i];
  out += "\n";
  for (const json& r : rows) {
    for (size_t i = 0; i < keys.size(); ++i) out += (i ? "," : "") + (r.contains(keys[i]) ? cell(r[keys[i]]) : "");
    out += "\n";
  }
  return out;
}

namespace {

std::string Line(const std::string& label, const std::string& value) {
  char b[160];
  std::snprintf(b, sizeof b, "%-40s %-10s\n", label.c_str(), value.c_str());
  return b;
}
std::string Num(double v, int prec = 2) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", prec, v);
  return b;
}
std::string Rule(const std::string& title, char fill) {
  const size_t w = 50, pad = (w - std::min(w, title.size())) / 2;
  std::string s(pad, fill);
  s += title;
  s += std::string(w - s.size(), fill);
  return s + "\n";
}
std::string DistLines(const std::string& title, const std::string& name, const Dist& d) {
  std::string s = Rule(title, '-');
  s += Line("Mean " + name + " (ms):", Num(d.mean));
  s += Line("Median " + name + " (ms):", Num(d.median));
  for (const auto& [p, v] : d.pct) {
    char b[32];
    std::snprintf(b, sizeof b, "P%g", p);
    s += Line(std::string(b) + " " + name + " (ms):", Num(v));
  }
  return s;
}

}  // namespace

std::string SummaryTable(const RunInfo& info, const RunMetrics& m, const Slo& slo) {
  std::string s = Rule(" Serving Benchmark Result ", '=');
  s += Line("Successful requests:", std::to_string(m.completed));
  s += Line("Failed requests:", std::to_string(m.failed));
  for (const auto& [kind, n] : m.errors) s += "  " + std::to_string(n) + " x " + kind + "\n";
  s += Line("Request rate configured (RPS):", std::isinf(info.request_rate) ? "inf" : Num(info.request_rate));
  if (info.max_concurrency > 0) s += Line("Maximum request concurrency:", std::to_string(info.max_concurrency));
  s += Line("Benchmark duration (s):", Num(m.duration_s));
  s += Line("Total input tokens:", std::to_string(m.total_input));
  s += Line("Total generated tokens:", std::to_string(m.total_output));
  s += Line("Request throughput (req/s):", Num(m.request_throughput));
  if (slo.any()) s += Line("Request goodput (req/s):", Num(m.request_goodput));
  s += Line("Output token throughput (tok/s):", Num(m.output_throughput));
  s += Line("Peak output token throughput (tok/s):", Num(m.max_output_tokens_per_s));
  s += Line("Peak concurrent requests:", std::to_string(m.max_concurrent_requests));
  s += Line("Total Token throughput (tok/s):", Num(m.total_token_throughput));
  s += DistLines("Time to First Token", "TTFT", m.ttft);
  if (info.multiturn) {
    s += DistLines("TTFT, first turns", "TTFT", m.ttft_first_turn);
    s += DistLines("TTFT, later turns", "TTFT", m.ttft_later_turns);
  }
  s += DistLines("Time per Output Token (excl. 1st token)", "TPOT", m.tpot);
  s += DistLines("Inter-token Latency", "ITL", m.itl);
  s += DistLines("End-to-end Latency", "E2EL", m.e2el);
  s += std::string(50, '=') + "\n";
  return s;
}

}  // namespace kvstream::cli::serve
