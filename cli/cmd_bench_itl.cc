// kvstream bench itl: inter-token latency of a steady set of decode streams, with and without
// prompts' KV landing in the same decode daemon (issue 6, end-to-end form).
//
// Against a running decode daemon (connected to its prefill):
//  - S steady streams: Generate with a P-token prompt and a large max_tokens, all running at
//    once, so the decode daemon batches them into one decode step (its max_batch must be
//    >= S + landing clients). ITL = gap between consecutive tokens of one stream, from the
//    decode's own clock (GenerateResponse.server_time_us); the client's receive times give the
//    same figure as a cross-check (client_itl_ms).
//  - Phases, alternated for --rounds rounds so drift (the streams' contexts grow) hits every
//    phase alike: "idle" = only the streams; "landing" = also L clients each sending, back to
//    back, an N-token prompt with max_tokens 1 (pipelined load), always the same prompt, so a
//    prefill with a prompt cache (prompt_cache_blocks) writes it without computing: KV keeps
//    landing while the prefill's compute stays off the GPU.
//  - Per phase: ITL p50/p99/max over the samples whose both tokens fall inside the phase's
//    window (less the first --settle-ms, which belong to the switch), tokens/s of the streams,
//    landing requests and the landing rate (decode Stats kv_bytes_moved delta over the window;
//    the landed prompts' LoadInfo.kv_bytes as a cross-check), the landing requests' TTFT.
// Output: one JSON line per phase and one comparison line (to --json-out or stdout), then a
// table. Exit 1 when a phase has no ITL sample, a stream or a landing request fails.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/remote.h"
#include "cli/sampling_flags.h"
#include "common/time.h"
#include "connector/grpc_status.h"
#include "proto/kvstream.grpc.pb.h"

namespace kvstream::cli {
namespace {

namespace v1 = kvstream::v1;
using json = nlohmann::ordered_json;

int64_t WallMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double Pct(std::vector<double> v, double p) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * v.size()));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

Result<double> GetDouble(const Flags& f, const std::string& name, double min) {
  const std::string v = f.Get(name);
  try {
    size_t used = 0;
    double d = std::stod(v, &used);
    if (used != v.size() || !std::isfinite(d) || d < min) throw std::invalid_argument(v);
    return d;
  } catch (const std::exception&) {
    return InvalidArgument("--" + name + ": expected a number >= " + std::to_string(min) +
                           ", got '" + v + "'");
  }
}

std::vector<int32_t> Prompt(int n, int vocab, uint64_t seed) {
  std::vector<int32_t> p(n);
  uint64_t x = 0x9E3779B97F4A7C15ull * (seed + 1);
  for (auto& t : p) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 29;
    t = static_cast<int32_t>(x % uint64_t(vocab));
  }
  return p;
}

v1::LoadMode ModeOf(const std::string& m) {
  if (m == "local") return v1::LOAD_MODE_LOCAL;
  if (m == "non-pipelined") return v1::LOAD_MODE_NON_PIPELINED;
  return v1::LOAD_MODE_PIPELINED;
}

struct Token {
  int64_t server_us;
  int64_t client_us;
  int call;  // tokens of different calls of one stream are not consecutive
};

struct Window {
  std::string phase;
  int round;
  int64_t start_us, end_us;
  uint64_t kv_bytes_start = 0, kv_bytes_end = 0;
  uint64_t hits_start = 0, hits_end = 0;
  v1::Counters dec_start, dec_end;  // decode Stats counters at the window's ends
};

struct Landed {
  int64_t done_us;
  double ttft_ms;
  uint64_t kv_bytes;
};

class Bench {
 public:
  Bench(std::shared_ptr<grpc::Channel> channel, int64_t deadline_ms, SamplingFlags sampling)
      : channel_(std::move(channel)), deadline_ms_(deadline_ms), sampling_(sampling) {}

  // One steady stream: Generate calls back to back (a call that reaches max_tokens is
  // followed by another) until Stop().
  void Stream(int index, std::vector<int32_t> prompt, int max_tokens, v1::LoadMode mode) {
    auto stub = v1::Decode::NewStub(channel_);
    std::vector<Token>& out = streams_[index];
    for (int call = 0; !stop_; ++call) {
      auto ctx = std::make_shared<grpc::ClientContext>();
      ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms_));
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) break;
        contexts_.push_back(ctx);
      }
      v1::GenerateRequest req;
      *req.mutable_prompt_tokens() = {prompt.begin(), prompt.end()};
      req.set_max_tokens(max_tokens);
      req.set_load_mode(mode);
      req.set_client_request_tag("itl-stream-" + std::to_string(index));
      SetRequestSampling(sampling_, &req);
      auto reader = stub->Generate(ctx.get(), req);
      v1::GenerateResponse msg;
      while (reader->Read(&msg)) {
        out.push_back(Token{msg.server_time_us(), WallMicros(), call});
        ++stream_tokens_;
        if (out.size() == 1) ++started_;
      }
      grpc::Status st = reader->Finish();
      if (!st.ok() && !stop_) {
        std::lock_guard<std::mutex> lock(mu_);
        errors_.push_back("stream " + std::to_string(index) + ": " + st.error_message());
        return;
      }
    }
  }

  // One landing client: max_tokens 1 requests back to back while landing is on.
  void Landing(std::vector<int32_t> prompt, v1::LoadMode mode) {
    auto stub = v1::Decode::NewStub(channel_);
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || landing_; });
        if (stop_) return;
      }
      auto r = LandOnce(*stub, prompt, mode);
      std::lock_guard<std::mutex> lock(mu_);
      if (!r.ok()) {
        if (!stop_) errors_.push_back("landing request: " + r.status().ToString());
        return;
      }
      landed_.push_back(*r);
    }
  }

  Result<Landed> LandOnce(v1::Decode::Stub& stub, const std::vector<int32_t>& prompt,
                          v1::LoadMode mode) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms_));
    v1::GenerateRequest req;
    *req.mutable_prompt_tokens() = {prompt.begin(), prompt.end()};
    req.set_max_tokens(1);
    req.set_load_mode(mode);
    req.set_client_request_tag("itl-landing");
    auto start = Clock::now();
    auto reader = stub.Generate(&ctx, req);
    v1::GenerateResponse msg;
    Landed l{0, 0, 0};
    bool got = false;
    while (reader->Read(&msg)) {
      if (!got) l.ttft_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      got = true;
      if (msg.has_load() && msg.load().kv_bytes() > 0) l.kv_bytes = msg.load().kv_bytes();
    }
    grpc::Status st = reader->Finish();
    if (!st.ok()) return connector::FromGrpc(st);
    if (!got) return Internal("landing request returned no token");
    l.done_us = WallMicros();
    return l;
  }

  void SetLanding(bool on) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      landing_ = on;
    }
    cv_.notify_all();
  }
  void Stop() {
    std::vector<std::shared_ptr<grpc::ClientContext>> ctxs;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      ctxs = contexts_;
    }
    cv_.notify_all();
    for (auto& c : ctxs) c->TryCancel();
  }

  std::vector<std::vector<Token>> streams_;
  std::vector<Landed> landed_;
  std::vector<std::string> errors_;
  std::atomic<int> started_{0};
  std::atomic<int64_t> stream_tokens_{0};  // tokens the streams received so far
  std::mutex mu_;

 private:
  std::shared_ptr<grpc::Channel> channel_;
  int64_t deadline_ms_;
  SamplingFlags sampling_;
  std::condition_variable cv_;
  bool landing_ = false;
  std::atomic<bool> stop_{false};
  std::vector<std::shared_ptr<grpc::ClientContext>> contexts_;
};


}  // namespace

int RunBenchItl(std::span<const std::string> args) {
  const char* kCmd = "bench itl";
  std::vector<FlagSpec> specs = {
      {"decode", true, "decode daemon HOST:PORT", ""},
      {"prefill", true, "prefill daemon HOST:PORT (prompt-cache counters; optional)", ""},
      {"streams", true, "steady decode streams (S)", "8"},
      {"stream-prompt-len", true, "prompt tokens of each stream (P)", "64"},
      {"stream-max-tokens", true, "max_tokens of a stream's call (another call follows)", "2048"},
      {"stream-mode", true, "how the streams' prompts load: local | pipelined | non-pipelined",
       "local"},
      {"stream-same-prompt", false, "every stream the same prompt (prefill cache serves them)", ""},
      {"landing-clients", true, "concurrent landing clients (L)", "2"},
      {"landing-prompt-len", true, "tokens of the landing prompt (N)", "256"},
      {"landing-mode", true, "pipelined | non-pipelined", "pipelined"},
      {"phases", true, "phases of one round, in order: idle, landing", "idle,landing"},
      {"rounds", true, "rounds (each runs every phase once)", "2"},
      {"phase-s", true, "seconds per phase per round", "2"},
      {"min-samples", true,
       "a phase runs on past --phase-s (up to 20x) until its windows hold this many stream tokens "
       "after their settle time (enough for a p99 on a slow machine); 0 = off",
       "0"},
      {"settle-ms", true, "samples this soon after a phase switch are dropped", "200"},
      {"warmup-s", true, "seconds after every stream started, before the first phase", "1"},
      {"deadline-ms", true, "deadline of each Generate call", "600000"},
      {"label", true, "free text copied into the JSON lines (e.g. pacing=on)", ""},
      {"json-out", true, "write the JSON lines here instead of stdout", ""},
  };
  for (auto& s : AuthFlagSpecs()) specs.push_back(s);
  for (auto& s : SamplingFlagSpecs()) specs.push_back(s);
  auto flags = Flags::Parse(args, specs);
  if (!flags.ok()) return ReportError(kCmd, flags.status(), true);
  if (flags->help()) {
    std::cout << "usage: kvstream bench itl --decode HOST:PORT [--prefill HOST:PORT] [flags]\n\n"
                 "Inter-token latency of S steady streams with no landing traffic and while L\n"
                 "clients keep N-token prompts landing (max_tokens 1, the same prompt: a prefill\n"
                 "with prompt_cache_blocks writes it without computing). The decode daemon's\n"
                 "max_batch must be >= S + L so the streams share one decode step.\n\n"
              << FlagsHelp(specs);
    return kExitOk;
  }
  if (!flags->Has("decode")) return ReportError(kCmd, InvalidArgument("--decode is required"), true);
  auto streams = flags->GetInt("streams", 1, 4096);
  auto plen = flags->GetInt("stream-prompt-len", 1, 1 << 24);
  auto smax = flags->GetInt("stream-max-tokens", 2, 1 << 24);
  auto lclients = flags->GetInt("landing-clients", 0, 4096);
  auto nlen = flags->GetInt("landing-prompt-len", 2, 1 << 24);
  auto rounds = flags->GetInt("rounds", 1, 1000);
  auto deadline_ms = flags->GetInt("deadline-ms", 1, int64_t(1) << 40);
  auto min_samples = flags->GetInt("min-samples", 0, 1 << 30);
  for (auto* r : {&streams, &plen, &smax, &lclients, &nlen, &rounds, &deadline_ms, &min_samples})
    if (!r->ok()) return ReportError(kCmd, r->status(), true);
  auto sampling = SamplingFromFlags(*flags);
  if (!sampling.ok()) return ReportError(kCmd, sampling.status(), true);
  auto phase_s = GetDouble(*flags, "phase-s", 0.05);
  auto settle_ms = GetDouble(*flags, "settle-ms", 0);
  auto warmup_s = GetDouble(*flags, "warmup-s", 0);
  for (auto* r : {&phase_s, &settle_ms, &warmup_s})
    if (!r->ok()) return ReportError(kCmd, r->status(), true);
  const std::string smode = flags->Get("stream-mode"), lmode = flags->Get("landing-mode");
  if (smode != "local" && smode != "pipelined" && smode != "non-pipelined")
    return ReportError(kCmd, InvalidArgument("--stream-mode: local, pipelined or non-pipelined"), true);
  if (lmode != "pipelined" && lmode != "non-pipelined")
    return ReportError(kCmd, InvalidArgument("--landing-mode: pipelined or non-pipelined"), true);
  std::vector<std::string> phases;
  {
    std::stringstream ss(flags->Get("phases"));
    std::string p;
    while (std::getline(ss, p, ',')) {
      if (p != "idle" && p != "landing")
        return ReportError(kCmd, InvalidArgument("--phases: unknown phase '" + p + "'"), true);
      phases.push_back(p);
    }
    if (phases.empty()) return ReportError(kCmd, InvalidArgument("--phases is empty"), true);
  }
  const bool wants_landing = std::find(phases.begin(), phases.end(), "landing") != phases.end();
  if (wants_landing && *lclients == 0)
    return ReportError(kCmd, InvalidArgument("a landing phase needs --landing-clients >= 1"), true);

  auto channel_or = RemoteChannel(*flags, flags->Get("decode"));
  if (!channel_or.ok()) return ReportError(kCmd, channel_or.status(), true);
  std::shared_ptr<grpc::Channel> channel = *channel_or;
  auto dstub = v1::Decode::NewStub(channel);
  auto dstats = FetchStats(*dstub, 10000, "Stats");
  if (!dstats.ok()) return ReportError(kCmd, dstats.status().WithContext("decode"), false);
  std::unique_ptr<v1::Prefill::Stub> pstub;
  std::string prefill_transport;
  if (flags->Has("prefill")) {
    auto pchannel = RemoteChannel(*flags, flags->Get("prefill"));
    if (!pchannel.ok()) return ReportError(kCmd, pchannel.status(), true);
    pstub = v1::Prefill::NewStub(*pchannel);
    auto ps = FetchStats(*pstub, 10000, "Stats");
    if (!ps.ok()) return ReportError(kCmd, ps.status().WithContext("prefill"), false);
    if (ps->model_hash() != dstats->model_hash())
      return ReportError(kCmd, FailedPrecondition("prefill and decode serve different models"), false);
    prefill_transport = ps->transport();
  }
  const int vocab = dstats->vocab_size();
  if (vocab <= 0) return ReportError(kCmd, FailedPrecondition("decode reports no vocabulary size"), false);

  std::ofstream json_file;
  std::ostream* jout = &std::cout;
  if (flags->Has("json-out")) {
    json_file.open(flags->Get("json-out"));
    if (!json_file) return ReportError(kCmd, InvalidArgument("cannot write " + flags->Get("json-out")), true);
    jout = &json_file;
  }

  Bench bench(channel, *deadline_ms, *sampling);
  const auto landing_prompt = Prompt(int(*nlen), vocab, 1000003);
  const v1::LoadMode landing_mode = ModeOf(lmode);
  // The landing prompt once before anything runs: a prefill with a prompt cache computes it
  // now, and serves every later copy from the cache.
  double prime_ms = 0;
  if (wants_landing) {
    std::fprintf(stderr, "[bench itl] priming the landing prompt (%lld tokens)\n", (long long)*nlen);
    auto t = Clock::now();
    auto r = bench.LandOnce(*dstub, landing_prompt, landing_mode);
    if (!r.ok()) return ReportError(kCmd, r.status().WithContext("landing prompt"), false);
    prime_ms = std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  }

  const int S = static_cast<int>(*streams);
  bench.streams_.resize(S);
  std::vector<std::thread> threads;
  auto bench_start = Clock::now();
  for (int i = 0; i < S; ++i) {
    auto prompt = Prompt(int(*plen), vocab, flags->Has("stream-same-prompt") ? 7 : 7 + i);
    threads.emplace_back([&bench, i, prompt, m = int(*smax), mode = ModeOf(smode)] {
      bench.Stream(i, prompt, m, mode);
    });
    // A stream that loads through the prefill: let the first go alone (with a prompt cache,
    // it fills the cache for the others when they share the prompt).
    if (i == 0 && smode != "local") {
      while (bench.started_ == 0 && SecondsSince(bench_start) < *deadline_ms / 1e3) {
        std::lock_guard<std::mutex> lock(bench.mu_);
        if (!bench.errors_.empty()) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
  }
  for (int i = 0; i < *lclients && wants_landing; ++i)
    threads.emplace_back([&] { bench.Landing(landing_prompt, landing_mode); });
  auto fail = [&](const Status& s) {
    bench.Stop();
    for (auto& t : threads) t.join();
    return ReportError(kCmd, s, false);
  };
  while (bench.started_ < S) {
    {
      std::lock_guard<std::mutex> lock(bench.mu_);
      if (!bench.errors_.empty()) return fail(Internal(bench.errors_.front()));
    }
    if (SecondsSince(bench_start) > *deadline_ms / 1e3)
      return fail(Timeout("the streams did not all start"));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const double start_s = SecondsSince(bench_start);
  std::fprintf(stderr, "[bench itl] %d streams running after %.1f s; warm-up %.1f s\n", S, start_s,
               *warmup_s);
  std::this_thread::sleep_for(std::chrono::duration<double>(*warmup_s));

  std::vector<Window> windows;
  for (int r = 0; r < *rounds; ++r) {
    for (const std::string& phase : phases) {
      Window w;
      w.phase = phase;
      w.round = r;
      auto ds = FetchStats(*dstub, 10000, "Stats");
      if (!ds.ok()) return fail(ds.status());
      w.kv_bytes_start = ds->counters().kv_bytes_moved();
      w.dec_start = ds->counters();
      if (pstub) {
        auto ps = FetchStats(*pstub, 10000, "Stats");
        if (ps.ok()) w.hits_start = ps->counters().prompt_cache_hits();
      }
      w.start_us = WallMicros();
      bench.SetLanding(phase == "landing");
      std::fprintf(stderr, "[bench itl] round %d, %s, %.1f s\n", r + 1, phase.c_str(), *phase_s);
      const auto phase_start = Clock::now();
      const auto settle = std::chrono::duration<double, std::milli>(std::min(*settle_ms, *phase_s * 1e3));
      std::this_thread::sleep_for(settle);
      const int64_t tokens_at_settle = bench.stream_tokens_.load();
      std::this_thread::sleep_until(phase_start + std::chrono::duration<double>(*phase_s));
      if (*min_samples > 0) {
        // Each window's share of the samples, plus the first token of every call (no gap).
        const int64_t want = (*min_samples + *rounds - 1) / *rounds + S;
        const auto cap = phase_start + std::chrono::duration<double>(20 * *phase_s);
        while (bench.stream_tokens_.load() - tokens_at_settle < want && Clock::now() < cap)
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      w.end_us = WallMicros();
      ds = FetchStats(*dstub, 10000, "Stats");
      if (!ds.ok()) return fail(ds.status());
      w.kv_bytes_end = ds->counters().kv_bytes_moved();
      w.dec_end = ds->counters();
      if (pstub) {
        auto ps = FetchStats(*pstub, 10000, "Stats");
        if (ps.ok()) w.hits_end = ps->counters().prompt_cache_hits();
      }
      windows.push_back(w);
      std::lock_guard<std::mutex> lock(bench.mu_);
      if (!bench.errors_.empty()) break;
    }
  }
  bench.SetLanding(false);
  bench.Stop();
  for (auto& t : threads) t.join();
  if (!bench.errors_.empty()) return ReportError(kCmd, Internal(bench.errors_.front()), false);

  // Samples per phase.
  struct Acc {
    std::vector<double> itl, citl;
    double seconds = 0;       // windows less their settle time (ITL, tokens, landed prompts)
    double full_seconds = 0;  // whole windows (the Stats deltas span them)
    uint64_t tokens = 0, kv_bytes = 0, loadinfo_bytes = 0, hits = 0;
    // The decode scheduler's own split of its step time (Stats deltas over whole windows).
    uint64_t steps = 0, loop_us = 0, forward_us = 0, first_step_us = 0, joins_deferred = 0;
    int landed = 0;
    std::vector<double> landing_ttft;
    std::vector<double> round_p50;
  };
  std::map<std::string, Acc> acc;
  const int64_t settle_us = static_cast<int64_t>(*settle_ms * 1e3);
  for (const Window& w : windows) {
    Acc& a = acc[w.phase];
    const int64_t from = w.start_us + settle_us;
    a.seconds += (w.end_us - from) * 1e-6;
    a.full_seconds += (w.end_us - w.start_us) * 1e-6;
    a.kv_bytes += w.kv_bytes_end - w.kv_bytes_start;
    a.hits += w.hits_end - w.hits_start;
    a.steps += w.dec_end.decode_steps() - w.dec_start.decode_steps();
    a.loop_us += w.dec_end.decode_loop_us() - w.dec_start.decode_loop_us();
    a.forward_us += w.dec_end.decode_forward_us() - w.dec_start.decode_forward_us();
    a.first_step_us += w.dec_end.decode_first_step_us() - w.dec_start.decode_first_step_us();
    a.joins_deferred += w.dec_end.decode_joins_deferred() - w.dec_start.decode_joins_deferred();
    std::vector<double> round_itl;
    for (const auto& s : bench.streams_) {
      for (size_t i = 0; i < s.size(); ++i) {
        if (s[i].server_us >= from && s[i].server_us <= w.end_us) ++a.tokens;
        if (i == 0 || s[i].call != s[i - 1].call) continue;
        if (s[i - 1].server_us < from || s[i].server_us > w.end_us) continue;
        const double itl = (s[i].server_us - s[i - 1].server_us) * 1e-3;
        a.itl.push_back(itl);
        round_itl.push_back(itl);
        a.citl.push_back((s[i].client_us - s[i - 1].client_us) * 1e-3);
      }
    }
    a.round_p50.push_back(Pct(round_itl, 50));
    for (const Landed& l : bench.landed_) {
      if (l.done_us < from || l.done_us > w.end_us) continue;
      ++a.landed;
      a.loadinfo_bytes += l.kv_bytes;
      a.landing_ttft.push_back(l.ttft_ms);
    }
  }
  const std::string label = flags->Get("label");
  std::map<std::string, json> out;
  bool ok = true;
  for (const std::string& phase : phases) {
    if (out.count(phase)) continue;
    Acc& a = acc[phase];
    json j;
    j["kind"] = "itl_phase";
    j["label"] = label;
    j["phase"] = phase;
    j["streams"] = S;
    j["stream_prompt_len"] = *plen;
    j["landing_clients"] = phase == "landing" ? *lclients : 0;
    j["landing_prompt_len"] = *nlen;
    j["rounds"] = *rounds;
    j["seconds"] = a.seconds;
    j["samples"] = a.itl.size();
    j["itl_ms"] = {{"p50", Pct(a.itl, 50)}, {"p90", Pct(a.itl, 90)}, {"p99", Pct(a.itl, 99)},
                   {"max", Pct(a.itl, 100)}};
    j["client_itl_ms"] = {{"p50", Pct(a.citl, 50)}, {"p99", Pct(a.citl, 99)}};
    j["itl_p50_per_round_ms"] = a.round_p50;
    j["tokens_per_s"] = a.seconds > 0 ? a.tokens / a.seconds : NAN;
    j["landed_requests"] = a.landed;
    j["landing_bytes_per_s"] = a.full_seconds > 0 ? a.kv_bytes / a.full_seconds : NAN;
    j["landing_gbps"] = a.full_seconds > 0 ? a.kv_bytes / a.full_seconds / 1e9 : NAN;
    j["landing_loadinfo_gbps"] = a.seconds > 0 ? a.loadinfo_bytes / a.seconds / 1e9 : NAN;
    j["landing_ttft_ms_p50"] = Pct(a.landing_ttft, 50);
    if (pstub) j["prefill_cache_hits"] = a.hits;
    // Per decode step, from the decode daemon: the scheduler iteration (what a stream's ITL
    // sees), the step's forward, separate first-token forwards, and the host work left over.
    if (a.steps > 0) {
      const double n = double(a.steps);
      j["decode_step_ms"] = {{"loop", a.loop_us / n / 1e3},
                             {"forward", a.forward_us / n / 1e3},
                             {"first_steps", a.first_step_us / n / 1e3},
                             {"host", (double(a.loop_us) - a.forward_us - a.first_step_us) / n / 1e3},
                             {"steps", a.steps},
                             {"joins_deferred", a.joins_deferred}};
    }
    j["model"] = dstats->model_name();
    j["decode_backend"] = dstats->backend();
    j["transport"] = dstats->transport();
    if (!prefill_transport.empty()) j["prefill_transport"] = prefill_transport;
    j["landing_prime_ms"] = prime_ms;
    j["streams_started_s"] = start_s;
    if (a.itl.empty()) ok = false;
    *jout << j.dump() << "\n";
    out[phase] = j;
  }
  if (out.count("idle") && out.count("landing")) {
    json c;
    c["kind"] = "itl_comparison";
    c["label"] = label;
    auto ratio = [&](const char* q) {
      return out["landing"]["itl_ms"][q].get<double>() / out["idle"]["itl_ms"][q].get<double>();
    };
    c["p50_landing_over_idle"] = ratio("p50");
    c["p99_landing_over_idle"] = ratio("p99");
    c["landing_gbps"] = out["landing"]["landing_gbps"];
    *jout << c.dump() << "\n";
    out["comparison"] = c;
  }
  jout->flush();

  std::printf("\nITL of %d streams (prompt %lld, %s), model %s, decode %s, transport %s%s%s\n", S,
              (long long)*plen, smode.c_str(), dstats->model_name().c_str(),
              dstats->backend().c_str(), dstats->transport().c_str(),
              label.empty() ? "" : ", ", label.c_str());
  std::printf("%-8s | %7s | %8s %8s %8s | %10s %8s | %9s | %8s %10s %9s\n", "phase", "samples",
              "ITL p50", "p99", "max", "client p50", "p99", "tokens/s", "landed", "land GB/s",
              "land TTFT");
  for (const std::string& phase : phases) {
    if (!out.count(phase)) continue;
    const json& j = out[phase];
    std::printf("%-8s | %7zu | %8.2f %8.2f %8.2f | %10.2f %8.2f | %9.1f | %8d %10.3f %9.1f\n",
                phase.c_str(), j["samples"].get<size_t>(), j["itl_ms"]["p50"].get<double>(),
                j["itl_ms"]["p99"].get<double>(), j["itl_ms"]["max"].get<double>(),
                j["client_itl_ms"]["p50"].get<double>(), j["client_itl_ms"]["p99"].get<double>(),
                j["tokens_per_s"].get<double>(), j["landed_requests"].get<int>(),
                j["landing_gbps"].get<double>(), j["landing_ttft_ms_p50"].get<double>());
    if (j.contains("decode_step_ms")) {
      const json& d = j["decode_step_ms"];
      std::printf("%-8s   decode step: %.3f ms = forward %.3f + first steps %.3f + host %.3f (%llu steps, "
                  "%llu joins put off by itl_target_ms)\n",
                  "", d["loop"].get<double>(), d["forward"].get<double>(),
                  d["first_steps"].get<double>(), d["host"].get<double>(),
                  static_cast<unsigned long long>(d["steps"].get<uint64_t>()),
                  static_cast<unsigned long long>(d.value("joins_deferred", uint64_t{0})));
    }
    out.erase(phase);  // printed once even if listed twice
  }
  if (out.count("comparison"))
    std::printf("landing / idle: ITL p50 %.3f, p99 %.3f\n",
                out["comparison"]["p50_landing_over_idle"].get<double>(),
                out["comparison"]["p99_landing_over_idle"].get<double>());
  if (!ok) {
    std::fprintf(stderr, "kvstream bench itl: a phase has no ITL sample (longer --phase-s?)\n");
    return kExitFailed;
  }
  return kExitOk;
}

}  // namespace kvstream::cli
