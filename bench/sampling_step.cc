// sampling_step: what sampling adds to the CUDA backend's decode step. One Forward of one new
// token for each of --batch sequences at context --ctx (the llama-3-8b preset: a 128256-token
// vocabulary), greedy and with each sampling configuration, interleaved iteration by iteration
// (so clock and thermal drift hit both alike). Prints p50/p90 step time per case and the
// p50 ratio to greedy; the target of issue 17 is <= 1.03 for top-k + top-p at batch 32.
//
//   sampling_step [--model llama-3-8b] [--device 0] [--batch 32] [--ctx 1024] [--iters 40]
//                 [--layers 0] [--json FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "model/backend.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "model/sampling.h"
#include "step_setup.h"

namespace {

using namespace kvstream;

struct Args {
  std::string model = "llama-3-8b";
  int device = 0;
  int batch = 32;
  int ctx = 1024;
  int iters = 40;
  int layers = 0;
  std::string json;
};

bool ParseArgs(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto val = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (k == "--model") a->model = val();
    else if (k == "--device") a->device = std::atoi(val().c_str());
    else if (k == "--batch") a->batch = std::atoi(val().c_str());
    else if (k == "--ctx") a->ctx = std::atoi(val().c_str());
    else if (k == "--iters") a->iters = std::atoi(val().c_str());
    else if (k == "--layers") a->layers = std::atoi(val().c_str());
    else if (k == "--json") a->json = val();
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return false;
    }
  }
  return a->batch > 0 && a->ctx > 0 && a->iters > 0 && a->layers >= 0;
}

struct Case {
  std::string name;
  model::SamplingParams params;
  std::vector<double> ms;
};

model::SamplingParams Params(float t, int k, float p, float min_p, int top_logprobs) {
  model::SamplingParams s;
  s.temperature = t;
  s.top_k = k;
  s.top_p = p;
  s.min_p = min_p;
  s.seed = 1234;
  s.logprobs = top_logprobs >= 0;
  s.top_logprobs = std::max(top_logprobs, 0);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!ParseArgs(argc, argv, &a)) {
    std::fprintf(stderr, "usage: see the header of bench/sampling_step.cc\n");
    return 2;
  }
  model::ModelSpec spec;
  spec.model = a.model;
  spec.num_layers_override = a.layers;
  spec.max_position_override = a.ctx + 16;
  const int bs = 16;
  const int per_seq = model::BlocksForTokens(a.ctx + 1, bs);
  bench::StepSetup setup;
  if (const int rc = setup.Init(spec, a.device, long(per_seq) * a.batch + 8, bs)) return rc;
  auto& backend = *setup.backend;
  auto& pool = *setup.pool;
  const std::vector<int32_t>& order = setup.order;
  const model::ModelConfig& c = backend.config();
  std::vector<std::vector<int32_t>> tables;
  std::vector<int32_t> tokens(a.batch);
  std::vector<model::SeqInput> seqs;
  for (int i = 0; i < a.batch; ++i) {
    tables.emplace_back(order.begin() + i * per_seq, order.begin() + (i + 1) * per_seq);
    tokens[i] = (i * 7919 + 11) % c.vocab_size;
  }
  for (int i = 0; i < a.batch; ++i)
    seqs.push_back(model::SeqInput{std::span<const int32_t>(&tokens[i], 1), a.ctx, tables[i]});

  std::vector<Case> cases = {
      {"greedy", {}, {}},
      {"temperature", Params(0.8f, 0, 1, 0, -1), {}},
      {"top_k50_top_p0.95", Params(0.8f, 50, 0.95f, 0, -1), {}},
      {"top_p0.9", Params(1.0f, 0, 0.9f, 0, -1), {}},
      {"top_k50_top_p0.95_min_p", Params(0.8f, 50, 0.95f, 0.05f, -1), {}},
      {"top_k50_top_p0.95_logprobs5", Params(0.8f, 50, 0.95f, 0, 5), {}},
  };
  std::vector<model::SeqSampling> sampling(a.batch);
  model::ForwardOutput out;
  for (int it = -3; it < a.iters; ++it) {
    for (Case& k : cases) {
      model::ForwardOptions fo;
      if (k.name != "greedy") {
        for (int i = 0; i < a.batch; ++i) sampling[i] = {k.params, uint64_t(it + 3)};
        fo.sampling = sampling;
      }
      const auto t0 = std::chrono::steady_clock::now();
      Status s = backend.Forward(pool, seqs, nullptr, fo, &out);
      const double dt =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (!s.ok()) {
        std::fprintf(stderr, "%s: %s\n", k.name.c_str(), s.ToString().c_str());
        return 1;
      }
      if (it >= 0) k.ms.push_back(dt);
    }
  }
  std::FILE* json = a.json.empty() ? nullptr : std::fopen(a.json.c_str(), "w");
  std::printf("sampling_step: %s (%d layers, vocab %d) on cuda:%d, batch %d, ctx %d, %d iterations\n",
              c.name.c_str(), c.num_layers, c.vocab_size, a.device, a.batch, a.ctx, a.iters);
  std::printf("%-30s %10s %10s %12s\n", "case", "p50 ms", "p90 ms", "vs greedy");
  double greedy_p50 = 0;
  for (Case& k : cases) {
    std::sort(k.ms.begin(), k.ms.end());
    const double p50 = k.ms[k.ms.size() / 2], p90 = k.ms[k.ms.size() * 9 / 10];
    if (k.name == "greedy") greedy_p50 = p50;
    std::printf("%-30s %10.3f %10.3f %12.4f\n", k.name.c_str(), p50, p90, p50 / greedy_p50);
    if (json)
      std::fprintf(json,
                   "{\"bench\":\"sampling_step\",\"model\":\"%s\",\"case\":\"%s\",\"batch\":%d,"
                   "\"ctx\":%d,\"vocab\":%d,\"layers\":%d,\"p50_ms\":%.4f,\"p90_ms\":%.4f,"
                   "\"vs_greedy\":%.4f}\n",
                   c.name.c_str(), k.name.c_str(), a.batch, a.ctx, c.vocab_size, c.num_layers,
                   p50, p90, p50 / greedy_p50);
  }
  if (json) std::fclose(json);
  return 0;
}
