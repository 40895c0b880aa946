// decode_step: the CUDA backend's decode step (one Forward of one new token per sequence) for
// batch compositions that a decode daemon sees while prompts land: S steady streams at context
// C, then the same plus J landed prompts of context L taking their first step in the same
// Forward (the decode daemon folds them in, decode/decode_server.h). Two controls separate
// why a step with joiners is slower:
//   equal_kv: S+J sequences with the same total KV spread evenly (same bytes, no long one),
//   same_kv_more_rows: S+J sequences with the base's total KV (more GEMM rows, same bytes).
// And a batch sweep at a short context shows the GEMMs' cost per extra row.
// Each case: median and p90 step time over --iters Forward calls (host clock; Forward returns
// once the tokens are on the host), the bytes a step must read (weights + KV) and the ratio of
// the time to the base's next to the ratio of the bytes ("bytes" = what a bandwidth-bound step
// would cost).
//
//   decode_step [--model llama-3-8b] [--device 0] [--streams 32] [--ctx 4096] [--joiners 1,2,4]
//               [--joiner-ctx 16384] [--sweep 32:40|none] [--sweep-ctx 1024] [--iters 30]
//               [--json FILE] [--trace FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "model/backend.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "step_setup.h"

namespace {

using namespace kvstream;

struct Args {
  std::string model = "llama-3-8b";
  int device = 0;
  int streams = 32;
  int ctx = 4096;
  std::vector<int> joiners = {1, 2, 4};
  int joiner_ctx = 16384;
  int sweep_lo = 32, sweep_hi = 40;
  int sweep_ctx = 1024;
  int iters = 30;
  std::string json;
  std::string trace;  // every step: case, wall-clock seconds, ms (to line up with other processes)
};

std::vector<int> ParseInts(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::atoi(item.c_str()));
  return v;
}

bool ParseArgs(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (k == "--model") a->model = val();
    else if (k == "--device") a->device = std::atoi(val().c_str());
    else if (k == "--streams") a->streams = std::atoi(val().c_str());
    else if (k == "--ctx") a->ctx = std::atoi(val().c_str());
    else if (k == "--joiners") a->joiners = ParseInts(val());
    else if (k == "--joiner-ctx") a->joiner_ctx = std::atoi(val().c_str());
    else if (k == "--sweep") {
      std::string s = val();
      if (s == "none") {
        a->sweep_lo = 1, a->sweep_hi = 0;
        continue;
      }
      auto c = s.find(':');
      if (c == std::string::npos) return false;
      a->sweep_lo = std::atoi(s.substr(0, c).c_str());
      a->sweep_hi = std::atoi(s.substr(c + 1).c_str());
    } else if (k == "--sweep-ctx") a->sweep_ctx = std::atoi(val().c_str());
    else if (k == "--iters") a->iters = std::atoi(val().c_str());
    else if (k == "--json") a->json = val();
    else if (k == "--trace") a->trace = val();
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return false;
    }
  }
  const bool no_sweep = a->sweep_lo == 1 && a->sweep_hi == 0;
  return a->streams > 0 && a->ctx > 0 && a->joiner_ctx > 0 && a->iters > 0 &&
         (no_sweep || (a->sweep_lo > 0 && a->sweep_hi >= a->sweep_lo)) && a->sweep_ctx > 0;
}

struct Case {
  std::string name;
  std::vector<int> ctx;  // context (tokens already cached) of each sequence
};

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!ParseArgs(argc, argv, &a)) {
    std::fprintf(stderr, "usage: see the header of bench/decode_step.cc\n");
    return 2;
  }
  model::ModelSpec spec;
  spec.model = a.model;
  spec.max_position_override = std::max({a.ctx, a.joiner_ctx, a.sweep_ctx}) + 16;
  const int bs = 16;

  std::vector<Case> cases;
  const int S = a.streams, C = a.ctx, L = a.joiner_ctx;
  cases.push_back({"base", std::vector<int>(S, C)});
  for (int j : a.joiners) {
    if (j <= 0) continue;
    Case land{"landing_j" + std::to_string(j), std::vector<int>(S, C)};
    for (int i = 0; i < j; ++i) land.ctx.push_back(L);
    cases.push_back(land);
    const long total = long(S) * C + long(j) * L;
    cases.push_back({"equal_kv_j" + std::to_string(j),
                     std::vector<int>(S + j, int(total / (S + j)))});
    cases.push_back({"same_kv_more_rows_j" + std::to_string(j),
                     std::vector<int>(S + j, int(long(S) * C / (S + j)))});
  }
  for (int b = a.sweep_lo; b <= a.sweep_hi; ++b)
    cases.push_back({"sweep_b" + std::to_string(b), std::vector<int>(b, a.sweep_ctx)});

  // One pool for the largest case; every case's sequences get shuffled blocks from it.
  long max_blocks = 0;
  for (auto& k : cases) {
    long n = 0;
    for (int x : k.ctx) n += model::BlocksForTokens(x + 1, bs);
    max_blocks = std::max(max_blocks, n);
  }
  bench::StepSetup setup;
  if (const int rc = setup.Init(spec, a.device, max_blocks + 8, bs)) return rc;
  auto& backend = *setup.backend;
  auto& pool = *setup.pool;
  const std::vector<int32_t>& order = setup.order;
  const model::ModelConfig& c = backend.config();

  const double wbytes = double(c.decode_step_weight_bytes());
  const double kv_tok = double(c.kv_bytes_per_token());
  std::FILE* json = a.json.empty() ? nullptr : std::fopen(a.json.c_str(), "w");
  std::FILE* trace = a.trace.empty() ? nullptr : std::fopen(a.trace.c_str(), "w");
  std::printf("decode_step: %s on cuda:%d, block %d, %d iterations per case, weights %.2f GB\n",
              c.name.c_str(), a.device, bs, a.iters, wbytes / 1e9);
  std::printf("%-24s %5s %12s %10s %10s %9s %9s %9s\n", "case", "seqs", "KV GB/step", "p50 ms",
              "p90 ms", "time/base", "bytes/base", "eff GB/s");
  double base_ms = 0, base_bytes = 0;
  for (auto& k : cases) {
    std::vector<std::vector<int32_t>> tables;
    std::vector<int32_t> tokens(k.ctx.size(), 1);
    size_t next = 0;
    double kv = 0;
    for (int x : k.ctx) {
      const int nb = model::BlocksForTokens(x + 1, bs);
      tables.emplace_back(order.begin() + next, order.begin() + next + nb);
      next += nb;
      kv += double(x + 1) * kv_tok;
    }
    std::vector<model::SeqInput> seqs;
    for (size_t i = 0; i < k.ctx.size(); ++i)
      seqs.push_back(model::SeqInput{std::span<const int32_t>(&tokens[i], 1), k.ctx[i], tables[i]});
    model::ForwardOptions fo;
    model::ForwardOutput out;
    std::vector<double> ms;
    for (int it = -3; it < a.iters; ++it) {
      auto t0 = std::chrono::steady_clock::now();
      Status s = backend.Forward(pool, seqs, nullptr, fo, &out);
      const double dt =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (!s.ok()) {
        std::fprintf(stderr, "%s: %s\n", k.name.c_str(), s.ToString().c_str());
        return 1;
      }
      if (it >= 0) ms.push_back(dt);
      if (trace && it >= 0)
        std::fprintf(trace, "%s %.6f %.4f\n", k.name.c_str(),
                     std::chrono::duration<double>(
                         std::chrono::system_clock::now().time_since_epoch()).count(), dt);
    }
    std::sort(ms.begin(), ms.end());
    const double p50 = ms[ms.size() / 2], p90 = ms[ms.size() * 9 / 10];
    const double bytes = wbytes + kv;
    if (k.name == "base") base_ms = p50, base_bytes = bytes;
    std::printf("%-24s %5zu %12.2f %10.3f %10.3f %9.3f %9.3f %9.0f\n", k.name.c_str(),
                k.ctx.size(), kv / 1e9, p50, p90, p50 / base_ms, bytes / base_bytes,
                bytes / (p50 * 1e-3) / 1e9);
    if (json)
      std::fprintf(json,
                   "{\"bench\":\"decode_step\",\"model\":\"%s\",\"case\":\"%s\",\"seqs\":%zu,"
                   "\"kv_bytes\":%.0f,\"weight_bytes\":%.0f,\"p50_ms\":%.4f,\"p90_ms\":%.4f,"
                   "\"time_vs_base\":%.4f,\"bytes_vs_base\":%.4f}\n",
                   c.name.c_str(), k.name.c_str(), k.ctx.size(), kv, wbytes, p50, p90,
                   p50 / base_ms, bytes / base_bytes);
  }
  if (json) std::fclose(json);
  if (trace) std::fclose(trace);
  return 0;
}
