// kvstream bench serve: a load generator for any OpenAI-compatible server (kvstream-decode
// --http, vLLM, SGLang, ...) with vLLM's serving-benchmark metrics (docs/benchmarks.md).
// The parts: cli/serve/sse_client (HTTP + server-sent events on Boost.Beast), dataset (the
// workloads and request bodies), runner (arrivals, concurrency, one coroutine per request),
// metrics (vLLM's definitions, the table, JSON lines and CSV).
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <sstream>

#include <utility>  // before Boost 1.74's awaitable.hpp, which uses std::exchange

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_future.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/remote.h"
#include "cli/serve/dataset.h"
#include "cli/serve/grpc_client.h"
#include "cli/serve/metrics.h"
#include "cli/serve/runner.h"
#include "cli/serve/sse_client.h"
#include "daemon/credentials.h"

namespace kvstream::cli {

namespace {

using json = nlohmann::ordered_json;
namespace asio = boost::asio;
namespace v1 = kvstream::v1;
const char kCmd[] = "bench serve";

std::vector<FlagSpec> ServeFlagSpecs() {
  std::vector<FlagSpec> s = {
      {"url", true, "the server: http://HOST:PORT or https://HOST:PORT (optionally a base path); "
              "grpc://HOST:PORT: a decode daemon's gRPC Generate (TLS and token from the auth flags)", ""},
      {"model", true, "model id sent (default: the first of GET /v1/models)", ""},
      {"endpoint", true, "completions (/v1/completions) or chat (/v1/chat/completions)", "completions"},
      {"dataset", true, "random, jsonl or multiturn", "random"},
      {"dataset-path", true, "jsonl: a file of {\"prompt\": text or [ids], \"max_tokens\": n} lines", ""},
      {"num-prompts", true, "requests per run (random, jsonl)", "1000"},
      {"input-len", true, "prompt tokens (random), user-message tokens per turn (multiturn)", "1024"},
      {"output-len", true, "max_tokens per request (jsonl: where a line has none)", "128"},
      {"range-ratio", true, "lengths drawn from [len*(1-r), len*(1+r)], as vLLM's random dataset", "0"},
      {"prompt-format", true, "text (words) or ids (token ids; needs --vocab-size)", "text"},
      {"vocab-size", true, "vocabulary size for --prompt-format ids", ""},
      {"conversations", true, "multiturn: conversations", "16"},
      {"turns", true, "multiturn: turns per conversation", "4"},
      {"system-len", true, "multiturn: tokens of the system prompt all conversations share", "512"},
      {"request-rate", true, "conversations (requests) per second, Poisson; inf: all at once; a list sweeps", "inf"},
      {"burstiness", true, "gamma shape of the arrivals (1: Poisson), as vLLM's", "1"},
      {"max-concurrency", true, "requests in flight at most (0: unbounded); a list sweeps", "0"},
      {"warmup", true, "unrecorded requests sent first, once", "0"},
      {"seed", true, "seed of the dataset and the arrivals", "0"},
      {"temperature", true, "sampling temperature sent", "0"},
      {"load-mode", true, "kvstream's load mode: pipelined, non-pipelined or local (the decode computes "
                    "the prompt itself: colocated); empty: the daemon's default", ""},
      {"ignore-eos", false, "send ignore_eos (vLLM's extension): every answer runs to max_tokens", ""},
      {"extra-body", true, "JSON object merged into every request body", ""},
      {"goodput", true, "SLOs for goodput, vLLM's form: ttft:MS tpot:MS e2el:MS", ""},
      {"percentiles", true, "comma-separated percentiles reported besides mean and median", "90,99"},
      {"timeout-s", true, "per request, connect to last byte", "3600"},
      {"label", true, "a name for this run's series in the JSON lines and the plot", ""},
      {"json-out", true, "append one JSON line per run here", ""},
      {"requests-out", true, "append one JSON line per request here (label, start, TTFT, E2EL, tokens, "
                        "error): for figures over a part of a run", ""},
      {"csv-out", true, "write one CSV row per run here (with a header)", ""},
      {"no-progress", false, "no progress bar (it is drawn only when stderr is a terminal)", ""},
  };
  for (auto& a : AuthFlagSpecs()) s.push_back(a);
  return s;
}

Result<std::vector<double>> ParseList(const std::string& text, const std::string& flag, bool allow_inf) {
  std::vector<double> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (allow_inf && item == "inf") {
      out.push_back(INFINITY);
      continue;
    }
    try {
      size_t used = 0;
      const double v = std::stod(item, &used);
      if (used != item.size() || v < 0 || !std::isfinite(v)) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (const std::exception&) {
      return InvalidArgument("--" + flag + ": '" + item + "' is not a non-negative number");
    }
  }
  if (out.empty()) return InvalidArgument("--" + flag + " is empty");
  return out;
}

// vLLM writes --goodput ttft:500 tpot:50 as separate words: join them into the flag's value.
std::vector<std::string> JoinGoodput(std::span<const std::string> args) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    out.push_back(args[i]);
    if (args[i] != "--goodput") continue;
    if (i + 1 < args.size()) out.push_back(args[++i]);
    while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) out.back() += " " + args[++i];
  }
  return out;
}

Result<double> GetDouble(const Flags& f, const std::string& name) {
  try {
    size_t used = 0;
    const std::string v = f.Get(name);
    const double d = std::stod(v, &used);
    if (used != v.size() || !std::isfinite(d)) throw std::invalid_argument(v);
    return d;
  } catch (const std::exception&) {
    return InvalidArgument("--" + name + ": '" + f.Get(name) + "' is not a number");
  }
}

template <typename T>
T RunSync(asio::io_context& io, asio::awaitable<T> a) {
  auto fut = asio::co_spawn(io, std::move(a), asio::use_future);
  io.restart();
  io.run();
  return fut.get();
}

}  // namespace

int RunBenchServe(std::span<const std::string> raw_args) {
  using namespace serve;
  const std::vector<std::string> args = JoinGoodput(raw_args);
  const std::vector<FlagSpec> specs = ServeFlagSpecs();
  auto flags = Flags::Parse(args, specs);
  if (!flags.ok()) return ReportError(kCmd, flags.status(), true);
  if (flags->help()) {
    std::cout << "usage: kvstream bench serve --url http://HOST:PORT|grpc://HOST:PORT [flags]\n\n"
                 "Streams requests to an OpenAI-compatible server (or a decode daemon's gRPC\n"
                 "Generate, same workloads and metrics) at a Poisson rate or a fixed\n"
                 "concurrency and reports vLLM's serving metrics (TTFT, TPOT, ITL, E2EL, throughput,\n"
                 "goodput). docs/benchmarks.md has the definitions side by side with vLLM's.\n\n"
              << FlagsHelp(specs);
    return kExitOk;
  }
  auto usage = [](const Status& s) { return ReportError(kCmd, s, true); };
  if (!flags->Has("url")) return usage(InvalidArgument("--url is required"));
  const std::string url_text = flags->Get("url");
  const bool grpc = url_text.rfind("grpc://", 0) == 0;
  Url url;
  if (!grpc) {
    auto u = ParseUrl(url_text);
    if (!u.ok()) return usage(u.status());
    url = *u;
  } else if (url_text.size() <= 7 || url_text.find('/', 7) != std::string::npos) {
    return usage(InvalidArgument("--url grpc://HOST:PORT takes no path"));
  }

  DatasetOptions d;
  d.kind = flags->Get("dataset");
  d.path = flags->Get("dataset-path");
  const std::string format = flags->Get("prompt-format");
  if (format != "text" && format != "ids") return usage(InvalidArgument("--prompt-format must be text or ids"));
  d.ids = format == "ids";
  for (auto [name, dst, lo] : {std::tuple{"num-prompts", &d.num_prompts, 1}, {"input-len", &d.input_len, 1},
                               {"output-len", &d.output_len, 1}, {"conversations", &d.conversations, 1},
                               {"turns", &d.turns, 1}, {"system-len", &d.system_len, 0}}) {
    auto v = flags->GetInt(name, lo, 1 << 24);
    if (!v.ok()) return usage(v.status());
    *dst = static_cast<int>(*v);
  }
  if (flags->Has("vocab-size")) {
    auto v = flags->GetInt("vocab-size", 1, 1 << 24);
    if (!v.ok()) return usage(v.status());
    d.vocab_size = static_cast<int>(*v);
  }
  auto seed = flags->GetInt("seed", 0, INT64_MAX);
  auto warmup = flags->GetInt("warmup", 0, 1 << 20);
  auto timeout_s = flags->GetInt("timeout-s", 1, 1 << 24);
  for (auto* r : {&seed, &warmup, &timeout_s})
    if (!r->ok()) return usage(r->status());
  d.seed = static_cast<uint64_t>(*seed);
  auto range = GetDouble(*flags, "range-ratio");
  auto burst = GetDouble(*flags, "burstiness");
  auto temperature = GetDouble(*flags, "temperature");
  for (auto* r : {&range, &burst, &temperature})
    if (!r->ok()) return usage(r->status());
  if (!(*burst > 0)) return usage(InvalidArgument("--burstiness must be positive"));
  d.range_ratio = *range;
  auto rates = ParseList(flags->Get("request-rate"), "request-rate", true);
  if (!rates.ok()) return usage(rates.status());
  for (double r : *rates)
    if (!(r > 0)) return usage(InvalidArgument("--request-rate must be positive (or inf)"));
  auto concurrencies = ParseList(flags->Get("max-concurrency"), "max-concurrency", false);
  if (!concurrencies.ok()) return usage(concurrencies.status());
  auto percentiles = ParseList(flags->Get("percentiles"), "percentiles", false);
  if (!percentiles.ok()) return usage(percentiles.status());
  for (double p : *percentiles)
    if (p > 100) return usage(InvalidArgument("--percentiles must be in [0, 100]"));
  Slo slo;
  std::string slo_error;
  if (!ParseSlo(flags->Get("goodput"), &slo, &slo_error)) return usage(InvalidArgument(slo_error));

  BodyOptions body;
  const std::string endpoint = flags->Get("endpoint");
  if (endpoint != "completions" && endpoint != "chat")
    return usage(InvalidArgument("--endpoint must be completions or chat"));
  body.chat = endpoint == "chat";
  if (grpc && (body.chat || flags->Has("extra-body")))
    return usage(InvalidArgument("--url grpc:// sends Generate requests: no --endpoint chat, no --extra-body"));
  body.load_mode = flags->Get("load-mode");
  if (!body.load_mode.empty() && body.load_mode != "pipelined" && body.load_mode != "non-pipelined" &&
      body.load_mode != "local")
    return usage(InvalidArgument("--load-mode must be pipelined, non-pipelined or local"));
  if (body.chat && d.ids) return usage(InvalidArgument("--endpoint chat needs text prompts (--prompt-format text)"));
  body.temperature = *temperature;
  body.ignore_eos = flags->Has("ignore-eos");
  if (flags->Has("extra-body")) {
    body.extra = nlohmann::json::parse(flags->Get("extra-body"), nullptr, false);
    if (body.extra.is_discarded() || !body.extra.is_object())
      return usage(InvalidArgument("--extra-body must be a JSON object"));
  }
  auto dataset = MakeDataset(d);
  if (!dataset.ok()) return usage(dataset.status());
  if (body.chat)
    for (const Conversation& c : *dataset)
      if (c.ids) return usage(InvalidArgument("--endpoint chat needs text prompts; the dataset has token ids"));

  ClientOptions copt;
  copt.timeout = std::chrono::seconds(*timeout_s);
  copt.tls_ca = flags->Get("tls-ca");
  copt.tls_cert = flags->Get("tls-cert");
  copt.tls_key = flags->Get("tls-key");
  if (copt.tls_cert.empty() != copt.tls_key.empty())
    return usage(InvalidArgument("--tls-cert and --tls-key go together"));
  if (flags->Has("token-file")) {
    auto token = daemon::ReadTokenFile("--token-file", flags->Get("token-file"));
    if (!token.ok()) return usage(token.status());
    copt.bearer_token = *token;
  }
  // One socket per request in flight: lift the soft limit on open files to the hard one.
  if (rlimit nofile{}; getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    setrlimit(RLIMIT_NOFILE, &nofile);
  }
  asio::io_context io;
  std::unique_ptr<SseClient> http;
  std::unique_ptr<GrpcClient> grpc_client;
  Target target;
  body.model = flags->Get("model");
  if (grpc) {
    auto channel = RemoteChannel(*flags, url_text.substr(7));
    if (!channel.ok()) return usage(channel.status());
    auto stub = v1::Decode::NewStub(*channel);
    auto stats = FetchStats(*stub, 10000, "Stats of " + url_text);
    if (!stats.ok()) return ReportError(kCmd, stats.status(), false);
    if (body.model.empty()) body.model = stats->model_name();
    grpc_client = std::make_unique<GrpcClient>(io, *channel, std::chrono::seconds(*timeout_s));
    target.grpc = grpc_client.get();
  } else {
    auto client = SseClient::Create(io, url, copt);
    if (!client.ok()) return ReportError(kCmd, client.status(), client.status().code() == StatusCode::kInvalidArgument);
    http = std::move(client).value();
    target.http = http.get();
  }
  if (body.model.empty()) {
    const StreamOutcome models = RunSync(io, http->Get("/v1/models"));
    const auto j = nlohmann::json::parse(models.body, nullptr, false);
    if (!models.error.empty() || j.is_discarded() || !j.contains("data") || !j["data"].is_array() ||
        j["data"].empty() || !j["data"][0].contains("id"))
      return ReportError(kCmd, Unavailable("GET /v1/models: " + (models.error.empty() ? "no model listed" : models.error) +
                                           " (or give --model)"), false);
    body.model = j["data"][0]["id"].get<std::string>();
  }

  LoadOptions lo;
  lo.burstiness = *burst;
  lo.seed = d.seed;
  lo.path = body.chat ? "/v1/chat/completions" : "/v1/completions";
  lo.body = body;
  lo.progress = isatty(STDERR_FILENO) && !flags->Has("no-progress");
  if (*warmup > 0) {
    std::vector<Conversation> w;
    for (int i = 0; i < *warmup; ++i) {
      Conversation c = (*dataset)[i % dataset->size()];
      c.turns.resize(1);
      w.push_back(std::move(c));
    }
    LoadOptions wo = lo;
    wo.request_rate = INFINITY;
    wo.max_concurrency = static_cast<int>((*concurrencies)[0]);
    wo.label = "warmup";
    const LoadResult r = RunLoad(io, target, w, wo);
    int failed = 0;
    for (const RequestRecord& x : r.records) failed += x.ok ? 0 : 1;
    std::cerr << "warmup: " << r.records.size() << " requests, " << failed << " failed\n";
  }

  std::ofstream json_out;
  if (flags->Has("json-out")) {
    json_out.open(flags->Get("json-out"), std::ios::app);
    if (!json_out) return usage(InvalidArgument("--json-out: cannot write " + flags->Get("json-out")));
  }
  std::ofstream requests_out;
  if (flags->Has("requests-out")) {
    requests_out.open(flags->Get("requests-out"), std::ios::app);
    if (!requests_out) return usage(InvalidArgument("--requests-out: cannot write " + flags->Get("requests-out")));
  }
  std::vector<json> rows;
  bool some_run_all_failed = false;
  for (double conc : *concurrencies) {
    for (double rate : *rates) {
      RunInfo info;
      info.label = flags->Get("label");
      info.endpoint = grpc ? "grpc" : endpoint;
      info.model = body.model;
      info.dataset = d.kind;
      info.url = url_text;
      info.request_rate = rate;
      info.max_concurrency = static_cast<int>(conc);
      info.multiturn = d.kind == "multiturn";
      info.load_mode = body.load_mode;
      lo.request_rate = rate;
      lo.max_concurrency = info.max_concurrency;
      std::ostringstream label;
      label << "rate " << rate;
      if (conc > 0) label << " concurrency " << conc;
      lo.label = label.str();
      const LoadResult r = RunLoad(io, target, *dataset, lo);
      info.num_requests = static_cast<int>(r.records.size());
      const RunMetrics m = ComputeMetrics(r.records, r.duration_s, *percentiles, slo);
      std::cout << SummaryTable(info, m, slo) << std::flush;
      json row = MetricsJson(info, m, slo);
      if (json_out.is_open()) json_out << row.dump() << "\n" << std::flush;
      for (size_t i = 0; requests_out.is_open() && i < r.records.size(); ++i) {
        const RequestRecord& x = r.records[i];
        json q;
        q["label"] = info.label;
        q["request_rate"] = std::isinf(rate) ? json("inf") : json(rate);
        q["max_concurrency"] = info.max_concurrency;
        q["index"] = i;
        q["turn"] = x.turn;
        q["ok"] = x.ok;
        q["start_s"] = x.start_s;
        q["ttft_ms"] = x.ttft_s * 1e3;
        q["e2el_ms"] = x.latency_s * 1e3;
        q["prompt_tokens"] = x.prompt_len;
        q["output_tokens"] = x.output_tokens;
        json itl = json::array();
        for (double g : x.itl_s) itl.push_back(std::llround(g * 1e6));
        q["itl_us"] = std::move(itl);
        if (!x.ok) q["error"] = x.error;
        requests_out << q.dump() << "\n";
      }
      if (requests_out.is_open()) requests_out << std::flush;
      rows.push_back(std::move(row));
      some_run_all_failed |= m.completed == 0;
    }
  }
  if (flags->Has("csv-out")) {
    std::ofstream csv(flags->Get("csv-out"));
    csv << MetricsCsv(rows);
    if (!csv) return ReportError(kCmd, Internal("--csv-out: cannot write " + flags->Get("csv-out")), false);
  }
  if (some_run_all_failed) {
    std::cerr << "kvstream bench serve: every request of a run failed (see the errors above)\n";
    return kExitFailed;
  }
  return kExitOk;
}

}  // namespace kvstream::cli
