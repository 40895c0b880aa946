// kvstream bench ttft: time-to-first-token and inter-token latency through the daemons, with
// layer-by-layer pipelining on and off, side by side with colocated generation in this process.
//
// For each prompt length, requests run one at a time, cycling through the modes (so drift in
// the machine's load hits every mode alike). Output: JSON lines (one per request with
// --per-request, one per mode and length, one comparison per length) then a table.
//
// Figures: TTFT = client's call start to first token; ITL = gaps between later tokens;
// "prefill" = the prefill daemon's forward up to the last layer's KV; "xfer" = first write
// posted to last write complete at the destination (with pipelining this spans the forward);
// "exposed" = prefill waiting for its writes after its forward; GB/s = KV bytes / xfer of the
// non-pipelined runs (all writes back to back); "wait" = decode blocked in wait_for_layer.
// Comparison: saved = TTFT p50 non-pipelined - pipelined; hidden = saved / xfer(non-pipelined)
// (>1 when pipelining also overlaps compute, not only the transfer); "xfer hidden (pf)" =
// 1 - exposed(pipelined) / exposed(non-pipelined), measured inside the prefill.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/remote.h"
#include "cli/sampling_flags.h"
#include "common/time.h"
#include "model/generate.h"
#include "model/weights.h"

#if KVSTREAM_CLI_HAVE_DAEMONS
#include <grpcpp/grpcpp.h>

#include "connector/grpc_status.h"
#include "proto/kvstream.grpc.pb.h"
#endif

namespace kvstream::cli {

#if KVSTREAM_CLI_HAVE_DAEMONS
int RunBenchItl(std::span<const std::string> args);    // cmd_bench_itl.cc
int RunBenchServe(std::span<const std::string> args);  // cmd_bench_serve.cc

namespace {
namespace v1 = kvstream::v1;
using json = nlohmann::ordered_json;

struct Sample {
  double ttft_s = 0;
  double server_ttft_s = 0;  // decode's own clock: request arrival to first token ready
  std::vector<double> itl_s;
  std::vector<int32_t> tokens;
  double prefill_compute_s = 0;
  double transfer_s = 0;
  double exposed_s = 0;  // prefill: waiting for its writes after its forward
  double load_wait_s = 0;
  uint64_t kv_bytes = 0;
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * v.size()));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

Result<std::vector<int>> ParseIntList(const std::string& s, const std::string& flag) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      int v = std::stoi(item, &used);
      if (used != item.size() || v <= 0) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (const std::exception&) {
      return InvalidArgument("--" + flag + ": '" + item + "' is not a positive integer");
    }
  }
  if (out.empty()) return InvalidArgument("--" + flag + " is empty");
  return out;
}

Result<Sample> RemoteOnce(v1::Decode::Stub& stub, const std::vector<int32_t>& prompt, int max_new,
                          v1::LoadMode mode, int64_t deadline_ms, const SamplingFlags& sampling) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
  v1::GenerateRequest req;
  *req.mutable_prompt_tokens() = {prompt.begin(), prompt.end()};
  req.set_max_tokens(max_new);
  req.set_load_mode(mode);
  req.set_client_request_tag("bench");
  SetRequestSampling(sampling, &req);
  Sample s;
  auto start = Clock::now();
  auto last = start;
  auto reader = stub.Generate(&ctx, req);
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    auto now = Clock::now();
    if (s.tokens.empty()) {
      s.ttft_s = std::chrono::duration<double>(now - start).count();
      s.server_ttft_s = msg.since_arrival_us() * 1e-6;
    }
    else s.itl_s.push_back(std::chrono::duration<double>(now - last).count());
    last = now;
    s.tokens.push_back(msg.token_id());
    if (msg.has_load()) {
      const v1::LoadInfo& l = msg.load();
      if (l.kv_bytes() > 0) s.kv_bytes = l.kv_bytes();
      if (l.load_wait_us() > 0) s.load_wait_s = l.load_wait_us() * 1e-6;
      // The prefill's own figures arrive with a later token when its call ends after the
      // first token (pipelined).
      if (l.prefill_compute_us() > 0) s.prefill_compute_s = l.prefill_compute_us() * 1e-6;
      if (l.transfer_us() > 0) s.transfer_s = l.transfer_us() * 1e-6;
      if (l.transfer_exposed_us() > 0) s.exposed_s = l.transfer_exposed_us() * 1e-6;
    }
  }
  grpc::Status st = reader->Finish();
  if (!st.ok()) return connector::FromGrpc(st);
  return s;
}

int RunBenchTtft(std::span<const std::string> args) {
  std::vector<FlagSpec> specs = ModelFlagSpecs();
  for (auto& s : BackendFlagSpecs()) specs.push_back(s);
  specs.push_back({"decode", true, "decode daemon HOST:PORT", ""});
  specs.push_back({"prefill", true, "prefill daemon HOST:PORT (for its Stats; optional)", ""});
  specs.push_back({"requests", true, "requests per mode and prompt length", "5"});
  specs.push_back({"warmup", true, "unrecorded requests per mode first", "1"});
  specs.push_back({"prompt-lens", true, "comma-separated prompt lengths", "16,128,512"});
  specs.push_back({"max-new-tokens", true, "tokens per request (ITL uses tokens 2..n)", "8"});
  specs.push_back({"modes", true, "comma-separated: pipelined, non-pipelined, colocated",
                   "pipelined,non-pipelined,colocated"});
  specs.push_back({"block-size", true, "KV block size for colocated runs", "16"});
  specs.push_back({"deadline-ms", true, "deadline per request", "120000"});
  specs.push_back({"json-out", true, "write the JSON lines here instead of stdout", ""});
  specs.push_back({"per-request", false, "also emit one JSON line per request", ""});
  for (auto& s : AuthFlagSpecs()) specs.push_back(s);
  for (auto& s : SamplingFlagSpecs()) specs.push_back(s);
  auto flags = Flags::Parse(args, specs);
  if (!flags.ok()) return ReportError("bench ttft", flags.status(), true);
  if (flags->help()) {
    std::cout << "usage: kvstream bench ttft --decode HOST:PORT [--prefill HOST:PORT] [flags]\n\n"
                 "The model flags describe the model for the colocated runs; they must give the\n"
                 "daemons' model (checked through the model hash).\n\n"
              << FlagsHelp(specs);
    return kExitOk;
  }
  if (!flags->Has("decode")) return ReportError("bench ttft", InvalidArgument("--decode is required"), true);
  auto requests = flags->GetInt("requests", 1, 100000);
  auto warmup = flags->GetInt("warmup", 0, 1000);
  auto max_new = flags->GetInt("max-new-tokens", 1, 1 << 20);
  auto block_size = flags->GetInt("block-size", 1, 1 << 16);
  auto deadline_ms = flags->GetInt("deadline-ms", 1, int64_t(1) << 40);
  for (auto* r : {&requests, &warmup, &max_new, &block_size, &deadline_ms})
    if (!r->ok()) return ReportError("bench ttft", r->status(), true);
  auto sampling = SamplingFromFlags(*flags);
  if (!sampling.ok()) return ReportError("bench ttft", sampling.status(), true);
  auto lens = ParseIntList(flags->Get("prompt-lens"), "prompt-lens");
  if (!lens.ok()) return ReportError("bench ttft", lens.status(), true);
  std::vector<std::string> modes;
  {
    std::stringstream ss(flags->Get("modes"));
    std::string m;
    while (std::getline(ss, m, ',')) {
      if (m != "pipelined" && m != "non-pipelined" && m != "colocated")
        return ReportError("bench ttft", InvalidArgument("--modes: unknown mode '" + m + "'"), true);
      modes.push_back(m);
    }
  }

  auto channel = RemoteChannel(*flags, flags->Get("decode"));
  if (!channel.ok()) return ReportError("bench ttft", channel.status(), true);
  auto stub = v1::Decode::NewStub(*channel);
  auto dstats_or = FetchStats(*stub, 10000, "decode Stats");
  if (!dstats_or.ok()) return ReportError("bench ttft", dstats_or.status(), false);
  const v1::StatsResponse& dstats = *dstats_or;
  std::string prefill_transport = "?";
  if (flags->Has("prefill")) {
    auto pchannel = RemoteChannel(*flags, flags->Get("prefill"));
    if (!pchannel.ok()) return ReportError("bench ttft", pchannel.status(), true);
    auto pstub = v1::Prefill::NewStub(*pchannel);
    auto ps = FetchStats(*pstub, 10000, "prefill Stats");
    if (!ps.ok()) return ReportError("bench ttft", ps.status(), false);
    if (ps->model_hash() != dstats.model_hash())
      return ReportError("bench ttft", FailedPrecondition("prefill and decode serve different models"), false);
    prefill_transport = ps->transport();
  }

  // The colocated reference: the same model in this process.
  std::unique_ptr<model::ModelBackend> local;
  const bool want_colocated = std::find(modes.begin(), modes.end(), "colocated") != modes.end();
  if (want_colocated) {
    auto spec = ModelSpecFromFlags(*flags);
    if (!spec.ok()) return ReportError("bench ttft", spec.status(), true);
    auto bo = BackendOptionsFromFlags(*flags);
    if (!bo.ok()) return ReportError("bench ttft", bo.status(), true);
    std::cerr << "[bench] loading " << spec->model << " for the colocated runs...\n";
    auto b = model::CreateBackend(*spec, *bo);
    if (!b.ok()) return ReportError("bench ttft", b.status().WithContext("loading model"), false);
    local = std::move(b).value();
    if (local->config().hash() != dstats.model_hash())
      return ReportError("bench ttft",
                         FailedPrecondition("model_hash differs between --model flags (" +
                                            local->config().name + ") and the decode daemon (" +
                                            dstats.model_name() + "): pass the daemons' model flags"),
                         true);
  }

  std::ofstream json_file;
  std::ostream* jout = &std::cout;
  if (flags->Has("json-out")) {
    json_file.open(flags->Get("json-out"));
    if (!json_file)
      return ReportError("bench ttft", InvalidArgument("cannot write " + flags->Get("json-out")), true);
    jout = &json_file;
  }

  const int vocab = dstats.vocab_size();
  if (vocab <= 0)
    return ReportError("bench ttft", FailedPrecondition("decode daemon reports no vocabulary size"), false);
  const int total_runs = static_cast<int>(lens->size() * modes.size() * (*requests + *warmup));
  int done_runs = 0;
  std::map<std::pair<int, std::string>, std::vector<Sample>> samples;
  std::map<int, bool> tokens_match;
  auto bench_start = Clock::now();
  for (int len : *lens) {
    tokens_match[len] = true;
    for (int i = 0; i < *warmup + *requests; ++i) {
      // Distinct prompts per request: nothing is cached anywhere, but deterministic.
      std::vector<int32_t> prompt(len);
      uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t(len) * 1000 + i + 1);
      for (auto& t : prompt) {
        x ^= x >> 33;
        x *= 0xff51afd7ed558ccdull;
        x ^= x >> 29;
        t = static_cast<int32_t>(x % vocab);
      }
      std::vector<int32_t> reference;
      for (const std::string& mode : modes) {
        std::fprintf(stderr, "\r[bench] prompt %d, %s, request %d/%d (%s)   [%d/%d runs, %.0f s]   ",
                     len, mode.c_str(), i + 1, int(*warmup + *requests),
                     i < *warmup ? "warmup" : "measured", done_runs + 1, total_runs,
                     SecondsSince(bench_start));
        Sample s;
        if (mode == "colocated") {
          auto pool = local->CreatePool(
              model::BlocksForTokens(len + int(*max_new), int(*block_size)), int(*block_size));
          if (!pool.ok()) return ReportError("bench ttft", pool.status(), false);
          model::GenerateOptions go;
          go.max_new_tokens = static_cast<int>(*max_new);
          go.sampling = sampling->params;
          auto r = model::Generate(*local, **pool, prompt, go);
          if (!r.ok()) return ReportError("bench ttft", r.status().WithContext("colocated"), false);
          s.ttft_s = r->ttft_seconds;
          s.itl_s = r->decode_seconds;
          s.tokens = r->tokens;
          s.prefill_compute_s = r->prefill_seconds;
        } else {
          auto r = RemoteOnce(*stub, prompt, static_cast<int>(*max_new),
                              mode == "pipelined" ? v1::LOAD_MODE_PIPELINED
                                                  : v1::LOAD_MODE_NON_PIPELINED,
                              *deadline_ms, *sampling);
          if (!r.ok())
            return ReportError("bench ttft", r.status().WithContext(mode + " request"), false);
          s = std::move(r).value();
        }
        ++done_runs;
        if (reference.empty()) reference = s.tokens;
        else if (s.tokens != reference) tokens_match[len] = false;
        if (i < *warmup) continue;
        if (flags->Has("per-request")) {
          json j;
          j["kind"] = "request";
          j["mode"] = mode;
          j["prompt_len"] = len;
          j["ttft_ms"] = s.ttft_s * 1e3;
          j["server_ttft_ms"] = s.server_ttft_s * 1e3;
          j["itl_ms"] = s.itl_s;
          j["kv_bytes"] = s.kv_bytes;
          j["prefill_compute_ms"] = s.prefill_compute_s * 1e3;
          j["transfer_ms"] = s.transfer_s * 1e3;
          j["load_wait_ms"] = s.load_wait_s * 1e3;
          *jout << j.dump() << "\n";
        }
        samples[{len, mode}].push_back(std::move(s));
      }
    }
  }
  std::fprintf(stderr, "\r[bench] done: %d runs in %.1f s%40s\n", done_runs, SecondsSince(bench_start), "");

  // Per mode and length.
  struct Row {
    double ttft[3], itl[3], gbps, prefill_ms, transfer_ms, exposed_ms, wait_ms;
  };
  std::map<std::pair<int, std::string>, Row> rows;
  for (auto& [key, v] : samples) {
    std::vector<double> ttft, itl, gbps, prefill, transfer, exposed, wait, sttft;
    for (auto& s : v) {
      ttft.push_back(s.ttft_s * 1e3);
      sttft.push_back(s.server_ttft_s * 1e3);
      for (double d : s.itl_s) itl.push_back(d * 1e3);
      if (s.transfer_s > 0) gbps.push_back(s.kv_bytes / s.transfer_s / 1e9);
      prefill.push_back(s.prefill_compute_s * 1e3);
      transfer.push_back(s.transfer_s * 1e3);
      exposed.push_back(s.exposed_s * 1e3);
      wait.push_back(s.load_wait_s * 1e3);
    }
    Row r{{Percentile(ttft, 50), Percentile(ttft, 90), Percentile(ttft, 99)},
          {Percentile(itl, 50), Percentile(itl, 90), Percentile(itl, 99)},
          Percentile(gbps, 50), Percentile(prefill, 50), Percentile(transfer, 50),
          Percentile(exposed, 50), Percentile(wait, 50)};
    rows[key] = r;
    json j;
    j["kind"] = "summary";
    j["mode"] = key.second;
    j["prompt_len"] = key.first;
    j["requests"] = v.size();
    j["max_new_tokens"] = *max_new;
    j["ttft_ms"] = {{"p50", r.ttft[0]}, {"p90", r.ttft[1]}, {"p99", r.ttft[2]}};
    j["itl_ms"] = {{"p50", r.itl[0]}, {"p90", r.itl[1]}, {"p99", r.itl[2]}};
    if (key.second != "colocated") j["server_ttft_ms_p50"] = Percentile(sttft, 50);
    if (key.second != "colocated") {
      j["kv_bytes"] = v.front().kv_bytes;
      if (key.second == "non-pipelined") j["transfer_gbps_p50"] = r.gbps;
      j["transfer_ms_p50"] = r.transfer_ms;
      j["transfer_exposed_ms_p50"] = r.exposed_ms;
      j["load_wait_ms_p50"] = r.wait_ms;
    }
    j["prefill_compute_ms_p50"] = r.prefill_ms;
    j["model"] = dstats.model_name();
    j["decode_backend"] = dstats.backend();
    j["transport"] = dstats.transport();
    *jout << j.dump() << "\n";
  }
  // Pipelining against the same system without it, per length.
  std::map<int, json> comparisons;
  for (int len : *lens) {
    json j;
    j["kind"] = "comparison";
    j["prompt_len"] = len;
    j["tokens_identical_across_modes"] = tokens_match[len];
    auto p = rows.find({len, "pipelined"});
    auto n = rows.find({len, "non-pipelined"});
    auto c = rows.find({len, "colocated"});
    if (p != rows.end() && n != rows.end()) {
      const double saved = n->second.ttft[0] - p->second.ttft[0];
      const double xfer = n->second.transfer_ms;
      j["ttft_p50_pipelined_over_non_pipelined"] = p->second.ttft[0] / n->second.ttft[0];
      j["transfer_ms_non_pipelined_p50"] = xfer;
      j["transfer_share_of_prefill"] = xfer / n->second.prefill_ms;
      j["ttft_saved_ms"] = saved;
      j["transfer_hidden_fraction"] = xfer > 0 ? saved / xfer : NAN;
      // Inside the prefill: how much of the transfer still follows its forward when pipelined.
      j["transfer_exposed_ms_pipelined_p50"] = p->second.exposed_ms;
      j["transfer_hidden_fraction_prefill"] =
          n->second.exposed_ms > 0 ? 1.0 - p->second.exposed_ms / n->second.exposed_ms : NAN;
    }
    if (p != rows.end() && c != rows.end())
      j["ttft_p50_pipelined_over_colocated"] = p->second.ttft[0] / c->second.ttft[0];
    *jout << j.dump() << "\n";
    comparisons[len] = j;
  }
  jout->flush();

  std::printf("\nTTFT / ITL, model %s (%s), decode backend %s, transport %s%s; %lld requests per cell, "
              "%lld new tokens\n",
              dstats.model_name().c_str(), flags->Get("decode").c_str(), dstats.backend().c_str(),
              dstats.transport().c_str(),
              flags->Has("prefill") ? (", prefill transport " + prefill_transport).c_str() : "",
              static_cast<long long>(*requests), static_cast<long long>(*max_new));
  std::printf("%-14s %6s | %9s %9s %9s | %8s %8s %8s | %9s %9s %9s %9s %9s\n", "mode", "prompt",
              "TTFT p50", "p90", "p99", "ITL p50", "p90", "p99", "prefill", "xfer ms", "exposed",
              "xfer GB/s", "wait ms");
  for (int len : *lens)
    for (const std::string& mode : modes) {
      auto it = rows.find({len, mode});
      if (it == rows.end()) continue;
      const Row& r = it->second;
      std::printf("%-14s %6d | %9.2f %9.2f %9.2f | %8.2f %8.2f %8.2f | %9.2f", mode.c_str(), len,
                  r.ttft[0], r.ttft[1], r.ttft[2], r.itl[0], r.itl[1], r.itl[2], r.prefill_ms);
      if (mode == "colocated") std::printf(" %9s %9s %9s %9s\n", "-", "-", "-", "-");
      else if (mode == "pipelined")  // its writes span the forward: no bandwidth figure
        std::printf(" %9.3f %9.3f %9s %9.2f\n", r.transfer_ms, r.exposed_ms, "-", r.wait_ms);
      else std::printf(" %9.3f %9.3f %9.3f %9.2f\n", r.transfer_ms, r.exposed_ms, r.gbps, r.wait_ms);
    }
  std::printf("\n%6s | %-24s | %-20s | %-12s | %-14s | %-18s | %s\n", "prompt",
              "TTFT pipelined/non-pipe", "pipelined/colocated", "xfer/prefill", "TTFT saved ms",
              "xfer hidden (pf)", "tokens equal");
  for (int len : *lens) {
    const json& j = comparisons[len];
    auto num = [&](const char* k, const char* fmt) {
      char buf[32];
      if (!j.contains(k) || !j[k].is_number()) return std::string("-");
      std::snprintf(buf, sizeof(buf), fmt, j[k].get<double>());
      return std::string(buf);
    };
    std::printf("%6d | %-24s | %-20s | %-12s | %-14s | %-18s | %s\n", len,
                num("ttft_p50_pipelined_over_non_pipelined", "%.3f").c_str(),
                num("ttft_p50_pipelined_over_colocated", "%.3f").c_str(),
                num("transfer_share_of_prefill", "%.4f").c_str(),
                num("ttft_saved_ms", "%.2f").c_str(),
                num("transfer_hidden_fraction_prefill", "%.2f").c_str(),
                tokens_match[len] ? "yes" : "NO");
  }
  for (int len : *lens)
    if (!tokens_match[len]) return kExitFailed;  // a correctness failure is a failed run
  return kExitOk;
}

}  // namespace
#endif

namespace {
// A dummy-weight HF checkpoint of a custom llama shape (a preset with fields overridden), so
// benchmarks can pick a shape whose KV transfer is a visible share of the prefill.
int RunBenchMakeModel(std::span<const std::string> args) {
  std::vector<FlagSpec> specs = {
      {"out", true, "output directory (created)", ""},
      {"from", true, "preset whose shape the flags below override", "tiny"},
      {"name", true, "model name in config.json", "tiny-custom"},
      {"layers", true, "decoder layers", ""},
      {"hidden", true, "hidden size", ""},
      {"heads", true, "attention heads", ""},
      {"kv-heads", true, "KV heads", ""},
      {"head-dim", true, "head size", ""},
      {"mlp", true, "MLP intermediate size", ""},
      {"vocab", true, "vocabulary size", ""},
      {"seed", true, "dummy-weight seed", "0"},
      {"dtype", true, "tensor dtype in the file: f16, bf16 or f32", "f16"},
  };
  auto flags = Flags::Parse(args, specs);
  if (!flags.ok()) return ReportError("bench make-model", flags.status(), true);
  if (flags->help()) {
    std::cout << "usage: kvstream bench make-model --out DIR [flags]\n\n" << FlagsHelp(specs);
    return kExitOk;
  }
  if (!flags->Has("out")) return ReportError("bench make-model", InvalidArgument("--out is required"), true);
  auto seed = flags->GetInt("seed", 0, INT64_MAX);
  if (!seed.ok()) return ReportError("bench make-model", seed.status(), true);
  auto cfg = model::PresetConfig(flags->Get("from"), static_cast<uint64_t>(*seed));
  if (!cfg.ok()) return ReportError("bench make-model", cfg.status(), true);
  struct Override { const char* flag; int* field; };
  for (Override o : {Override{"layers", &cfg->num_layers}, Override{"hidden", &cfg->hidden_size},
                     Override{"heads", &cfg->num_heads}, Override{"kv-heads", &cfg->num_kv_heads},
                     Override{"head-dim", &cfg->head_dim}, Override{"mlp", &cfg->intermediate_size},
                     Override{"vocab", &cfg->vocab_size}}) {
    if (!flags->Has(o.flag)) continue;
    auto v = flags->GetInt(o.flag, 1, 1 << 24);
    if (!v.ok()) return ReportError("bench make-model", v.status(), true);
    *o.field = static_cast<int>(*v);
  }
  cfg->name = flags->Get("name");
  if (Status s = cfg->Validate(); !s.ok()) return ReportError("bench make-model", s, true);
  auto dtype = flags->GetDType("dtype");
  if (!dtype.ok()) return ReportError("bench make-model", dtype.status(), true);
  auto src = model::DummyWeightsFor(*cfg);
  if (!src.ok()) return ReportError("bench make-model", src.status(), false);
  if (Status s = model::WriteHfCheckpoint(**src, *dtype, flags->Get("out")); !s.ok())
    return ReportError("bench make-model", s, false);
  std::cout << "wrote " << flags->Get("out") << ": " << cfg->num_layers << " layers, hidden "
            << cfg->hidden_size << ", heads " << cfg->num_heads << "/" << cfg->num_kv_heads
            << ", head " << cfg->head_dim << ", mlp " << cfg->intermediate_size << ", vocab "
            << cfg->vocab_size << "\n";
  return kExitOk;
}
}  // namespace

int RunBench(std::span<const std::string> args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cout << "usage: kvstream bench <what> [flags]\n\n  ttft         TTFT and inter-token latency "
                 "through the daemons: pipelined, non-pipelined, colocated\n"
                 "  itl          inter-token latency of steady streams, idle and while KV lands\n"
                 "  serve        load on any OpenAI-compatible server: vLLM's serving metrics\n"
                 "  make-model   write a dummy-weight checkpoint of a custom llama shape\n";
    return args.empty() ? kExitUsage : kExitOk;
  }
  if (args[0] == "make-model") return RunBenchMakeModel(args.subspan(1));
#if KVSTREAM_CLI_HAVE_DAEMONS
  if (args[0] == "ttft") return RunBenchTtft(args.subspan(1));
  if (args[0] == "itl") return RunBenchItl(args.subspan(1));
  if (args[0] == "serve") return RunBenchServe(args.subspan(1));
#else
  if (args[0] == "ttft" || args[0] == "itl" || args[0] == "serve")
    return ReportError("bench", NotSupported("this kvstream was built without the daemons' client "
                                             "(KVSTREAM_WITH_DAEMONS=OFF)"), false);
#endif
  return ReportError("bench", InvalidArgument("unknown benchmark '" + args[0] + "' (have: ttft, itl, serve, make-model)"), true);
}

}  // namespace kvstream::cli
