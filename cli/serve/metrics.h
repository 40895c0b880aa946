// The figures of `kvstream bench serve`, with vLLM's serving-benchmark definitions
// (vllm/benchmarks/serve.py, calculate_metrics; docs/benchmarks.md puts them side by side):
//  - TTFT: request start (before connecting) to the first streamed chunk with a choice.
//  - E2EL: request start to the last chunk with a choice.
//  - ITL: every gap between consecutive chunks with a choice, pooled over all requests.
//  - TPOT: per request (E2EL - TTFT) / (output_tokens - 1), for requests with > 1 token.
//  - output_tokens: the server's usage.completion_tokens, else the number of chunks.
//  - throughputs: completed requests, output tokens, input + output tokens over the run's
//    duration (its start to its last answer); goodput: requests meeting every SLO given
//    (TPOT counted as 0 for 1-token answers) over the duration.
//  - percentiles interpolated linearly between samples (numpy's default); empty sets give 0.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvstream::cli::serve {

struct RequestRecord {
  bool ok = false;
  std::string error;       // the failure's kind (counted), when !ok
  double start_s = 0;      // since the run's start
  double ttft_s = 0, latency_s = 0;
  std::vector<double> itl_s;
  int prompt_len = 0;      // the server's usage.prompt_tokens, else the dataset's count
  int output_tokens = 0;
  int chunks = 0;          // streamed chunks with a choice
  bool usage = false;      // the server reported usage
  int turn = 0;            // multi-turn: 0 = a conversation's first turn
};

struct Slo {
  std::optional<double> ttft_ms, tpot_ms, e2el_ms;
  bool any() const { return ttft_ms || tpot_ms || e2el_ms; }
};
// "ttft:500 tpot:50" or "ttft:500,e2el:2000" (vLLM's --goodput KEY:MS pairs).
bool ParseSlo(const std::string& text, Slo* slo, std::string* error);

struct Dist {
  double mean = 0, median = 0, std = 0;
  std::vector<std::pair<double, double>> pct;  // (percentile, value), in ms
};
// numpy.percentile's linear interpolation.
double Percentile(std::vector<double> v, double p);
Dist Summarize(const std::vector<double>& seconds, const std::vector<double>& percentiles);

struct RunInfo {
  std::string label;  // names the series in plots (e.g. the server's mode)
  std::string endpoint, model, dataset, url;  // endpoint: completions, chat or grpc
  double request_rate = 0;   // requests/s; infinity: all at once
  int max_concurrency = 0;   // 0: unbounded
  int num_requests = 0;
  bool multiturn = false;
  std::string load_mode;     // kvstream's load mode asked for (empty: the daemon's default)
};

struct RunMetrics {
  int completed = 0, failed = 0;
  std::map<std::string, int> errors;  // kind -> count
  int64_t total_input = 0, total_output = 0, total_chunks = 0;
  int without_usage = 0;              // completed requests whose server sent no usage
  double duration_s = 0;
  double request_throughput = 0, request_goodput = 0, output_throughput = 0, total_token_throughput = 0;
  double max_output_tokens_per_s = 0;
  int max_concurrent_requests = 0;
  Dist ttft, tpot, itl, e2el;
  Dist ttft_first_turn, ttft_later_turns;  // multi-turn only
};

RunMetrics ComputeMetrics(const std::vector<RequestRecord>& records, double duration_s,
                          const std::vector<double>& percentiles, const Slo& slo);

// One JSON object per run (a line of --json-out): RunInfo, the counts, throughputs and each
// latency's mean/median/std/pNN in ms.
nlohmann::ordered_json MetricsJson(const RunInfo& info, const RunMetrics& m, const Slo& slo);
// CSV of the JSON objects' scalar fields (errors as "kind=count;..."), header first.
std::string MetricsCsv(const std::vector<nlohmann::ordered_json>& rows);
// vLLM's "Serving Benchmark Result" table.
std::string SummaryTable(const RunInfo& info, const RunMetrics& m, const Slo& slo);

}  // namespace kvstream::cli::serve
