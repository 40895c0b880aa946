// The model goldens of tests/data/model_goldens (scripts/goldens/make_model_goldens.py): small
// random checkpoints in every config form kvstream reads, with the reference implementation's
// greedy tokens and first-step logits. Shared by the CPU and the GPU golden tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "model/backend.h"
#include "model/config.h"
#include "model/kv_cache.h"

namespace kvstream::model::golden {

struct Golden {
  std::string name, dir, dtype, reference;
  std::vector<int32_t> prompt, tokens;
  std::vector<float> logits_first, logits_first_f32, margins_f32;
  double max_abs_logit = 0;
};

// The source tree's copy, or $KVSTREAM_MODEL_GOLDENS (a test binary run on another machine).
inline std::string GoldenRoot() {
  const char* env = std::getenv("KVSTREAM_MODEL_GOLDENS");
  return env && *env ? env : KVSTREAM_MODEL_GOLDENS;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Every case directory (sorted), each holding golden.json.
inline std::vector<std::string> GoldenCases() {
  std::vector<std::string> out;
  for (const auto& de : std::filesystem::directory_iterator(GoldenRoot()))
    if (std::filesystem::exists(de.path() / "golden.json")) out.push_back(de.path().filename());
  std::sort(out.begin(), out.end());
  return out;
}

inline Golden LoadGolden(const std::string& name) {
  Golden g;
  g.name = name;
  g.dir = GoldenRoot() + "/" + name;
  auto j = nlohmann::json::parse(ReadFile(g.dir + "/golden.json"));
  g.dtype = j["dtype"].get<std::string>();
  g.reference = j.value("reference", std::string("transformers"));
  g.prompt = j["prompt"].get<std::vector<int32_t>>();
  g.tokens = j["tokens"].get<std::vector<int32_t>>();
  g.logits_first = j["logits_first"].get<std::vector<float>>();
  g.logits_first_f32 = j["logits_first_f32"].get<std::vector<float>>();
  g.margins_f32 = j["margins_f32"].get<std::vector<float>>();
  g.max_abs_logit = j["max_abs_logit_f32"].get<double>();
  return g;
}

// Prompt in one forward, then one forward per golden token (teacher forcing): the logits of
// every generated position (step i predicts tokens[i]).
inline Status TeacherForced(ModelBackend& b, const Golden& g, std::vector<std::vector<float>>* out) {
  const int bs = 16;
  const int total = int(g.prompt.size() + g.tokens.size());
  KV_ASSIGN_OR_RETURN(auto pool, b.CreatePool(BlocksForTokens(total, bs), bs));
  std::vector<int32_t> table(size_t(BlocksForTokens(total, bs)));
  for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t(i);
  ForwardOptions opt;
  opt.want_logits = true;
  out->clear();
  int32_t start = 0;
  std::vector<int32_t> input = g.prompt;
  for (size_t step = 0; step < g.tokens.size(); ++step) {
    SeqInput in;
    in.tokens = input;
    in.start_pos = start;
    in.block_table = table;
    ForwardOutput fo;
    KV_RETURN_IF_ERROR(b.Forward(*pool, std::span<const SeqInput>(&in, 1), nullptr, opt, &fo));
    out->push_back(std::move(fo.logits));
    start += int32_t(input.size());
    input = {g.tokens[step]};
  }
  return OkStatus();
}

inline int32_t Argmax(const std::vector<float>& v) {
  return int32_t(std::max_element(v.begin(), v.end()) - v.begin());  // lowest index on ties
}

inline double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return a.size() == b.size() ? m : 1e30;
}

}  // namespace kvstream::model::golden
