// The reference sampler (model/sampling.h) against its definition, computed here again in
// double from the textbook formulas: the distribution of many draws (chi-square), the filters,
// the checks of the parameters; Generate with sampling; generation_config.json's defaults.
#include "model/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>

#include "common/sampling_math.h"
#include "model/cpu_backend.h"
#include "model/generate.h"
#include "model/generation_config.h"
#include "model/weights.h"

namespace kvstream::model {
namespace {

namespace sm = kvstream::sampling;

SamplingParams Sampled(float t, int k = 0, float p = 1, float min_p = 0, uint64_t seed = 1) {
  SamplingParams s;
  s.temperature = t;
  s.top_k = k;
  s.top_p = p;
  s.min_p = min_p;
  s.seed = seed;
  return s;
}

// The probabilities the definition gives, in double (softmax at temperature t, then top-k,
// top-p over the top-k set, min-p relative to the max; ties at a threshold kept).
std::vector<double> Expected(const std::vector<float>& z, const SamplingParams& s) {
  const size_t V = z.size();
  const double m = *std::max_element(z.begin(), z.end());
  std::vector<double> e(V);
  for (size_t i = 0; i < V; ++i) e[i] = std::exp((double(z[i]) - m) / s.temperature);
  std::vector<size_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return z[a] > z[b]; });
  std::vector<bool> keep(V, true);
  if (s.top_k > 0 && size_t(s.top_k) < V) {
    const float kth = z[order[s.top_k - 1]];
    for (size_t i = 0; i < V; ++i) keep[i] = z[i] >= kth;
  }
  if (s.top_p < 1) {
    double total = 0;
    for (size_t i = 0; i < V; ++i) total += keep[i] ? e[i] : 0;
    double mass = 0;
    float cut = z[order[0]];
    for (size_t j = 0; j < V; ++j) {
      if (!keep[order[j]]) continue;
      mass += e[order[j]];
      cut = z[order[j]];
      const bool group_end = j + 1 == V || z[order[j + 1]] != z[order[j]];
      if (group_end && mass >= s.top_p * total) break;
    }
    for (size_t i = 0; i < V; ++i) keep[i] = keep[i] && z[i] >= cut;
  }
  for (size_t i = 0; i < V; ++i) keep[i] = keep[i] && e[i] >= s.min_p;
  std::vector<double> p(V, 0);
  double sum = 0;
  for (size_t i = 0; i < V; ++i) sum += keep[i] ? e[i] : 0;
  for (size_t i = 0; i < V; ++i) p[i] = keep[i] ? e[i] / sum : 0;
  return p;
}

// Pearson's chi-square of `draws` draws (token indices 0..draws-1) against Expected().
double ChiSquare(const std::vector<float>& z, const SamplingParams& s, int draws, int* df,
                 std::vector<int>* counts_out = nullptr) {
  std::vector<int> counts(z.size(), 0);
  for (int i = 0; i < draws; ++i) ++counts[SampleRow(z, s, uint64_t(i))];
  const auto p = Expected(z, s);
  double chi = 0;
  *df = -1;
  for (size_t i = 0; i < z.size(); ++i) {
    if (p[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " was filtered out but drawn";
      continue;
    }
    const double e = p[i] * draws;
    chi += (counts[i] - e) * (counts[i] - e) / e;
    ++*df;
  }
  if (counts_out) *counts_out = counts;
  return chi;
}

// chi-square quantiles at 1 - 1e-4 (the draws are fixed: these never flake, they only catch a
// wrong distribution).
double Critical(int df) {
  static const double q[] = {0, 15.14, 18.42, 21.11, 23.51, 25.74, 27.86, 29.88, 31.83, 33.72};
  return df < 10 ? q[df] : df + 6 * std::sqrt(2.0 * df);
}

const std::vector<float> kLogits = {1.0f, 2.5f, 0.3f, -1.0f, 2.5f, 0.9f, -3.0f, 1.7f};

TEST(SamplingMath, PhiloxKnownAnswerAndUniformity) {
  // Random123's known-answer vector for philox4x32-10, counter 0 and key 0.
  EXPECT_EQ(sm::PhiloxFirstOutput(0, 0), 0x6627e8d5u);
  std::vector<int> bins(16, 0);
  for (uint64_t i = 0; i < 32000; ++i) ++bins[sm::PhiloxUniform24(42, i) >> 20];
  for (int b : bins) EXPECT_NEAR(b, 2000, 250);
  EXPECT_NE(sm::PhiloxUniform24(1, 0), sm::PhiloxUniform24(2, 0));
  EXPECT_NE(sm::PhiloxUniform24(1, 0), sm::PhiloxUniform24(1, 1));
  EXPECT_NE(sm::PhiloxUniform24(1, 0), sm::PhiloxUniform24(1, uint64_t(1) << 32));
}

TEST(SamplingMath, ExpAndWeights) {
  for (float x = -29.9f; x <= 0; x += 0.0137f) {
    const double want = std::exp(double(x));
    EXPECT_NEAR(sm::SampleExp(x), want, want * 1e-6) << x;
  }
  EXPECT_EQ(sm::SampleExp(0), 1.0f);
  EXPECT_EQ(sm::SampleExp(-INFINITY), 0.0f);
  EXPECT_EQ(sm::SampleExp(NAN), 0.0f);
  EXPECT_EQ(sm::SampleWeight(3.0f, 3.0f, 1.0f), sm::kWeightOne);
  EXPECT_EQ(sm::SampleWeight(-INFINITY, 3.0f, 1.0f), 0u);
  EXPECT_EQ(sm::SampleWeight(NAN, 3.0f, 1.0f), 0u);
  EXPECT_LT(sm::SortKey(-2.0f), sm::SortKey(-1.0f));
  EXPECT_LT(sm::SortKey(-0.5f), sm::SortKey(0.5f));
  EXPECT_LT(sm::SortKey(NAN), sm::SortKey(-INFINITY) + 1);
  EXPECT_EQ(sm::MinPWeight(1.0f), sm::kWeightOne);
  EXPECT_EQ(sm::MinPWeight(0.0f), 0u);
  EXPECT_EQ(sm::DrawPoint(10, (1u << 24) - 1), 9u);
  EXPECT_EQ(sm::DrawPoint(10, 0), 0u);
}

TEST(Sampling, ParamsAreChecked) {
  EXPECT_TRUE(ValidateSamplingParams({}).ok());
  EXPECT_TRUE(ValidateSamplingParams(Sampled(0.7f, 50, 0.9f, 0.05f)).ok());
  auto bad = [](SamplingParams p) {
    const Status s = ValidateSamplingParams(p);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    return s.message();
  };
  EXPECT_NE(bad(Sampled(NAN)).find("temperature"), std::string::npos);
  bad(Sampled(-0.1f));
  bad(Sampled(INFINITY));
  bad(Sampled(kMaxTemperature * 2));
  EXPECT_NE(bad(Sampled(1, -1)).find("top_k"), std::string::npos);
  EXPECT_NE(bad(Sampled(1, 0, 0)).find("top_p"), std::string::npos);
  bad(Sampled(1, 0, 1.5f));
  bad(Sampled(1, 0, NAN));
  bad(Sampled(1, 0, -0.5f));
  EXPECT_NE(bad(Sampled(1, 0, 1, -0.1f)).find("min_p"), std::string::npos);
  bad(Sampled(1, 0, 1, 1.1f));
  bad(Sampled(1, 0, 1, NAN));
  SamplingParams lp;
  lp.top_logprobs = kMaxTopLogprobs + 1;
  EXPECT_NE(bad(lp).find("top_logprobs"), std::string::npos);
  lp.top_logprobs = -1;
  bad(lp);
}

TEST(Sampling, GreedyIsArgmaxAndNaNNeverWins) {
  EXPECT_EQ(SampleRow(kLogits, {}, 0), 1);  // ties: the lowest index
  const std::vector<float> nan_first = {NAN, 1.0f, 3.0f, NAN};
  EXPECT_EQ(SampleRow(nan_first, {}, 0), 2);
  for (uint64_t i = 0; i < 50; ++i) {
    const int32_t t = SampleRow(nan_first, Sampled(1.0f), i);
    EXPECT_TRUE(t == 1 || t == 2) << t;
  }
  const std::vector<float> all_nan = {NAN, NAN};
  EXPECT_EQ(SampleRow(all_nan, {}, 0), 0);
  EXPECT_EQ(SampleRow(all_nan, Sampled(1.0f), 0), 0);
  // A non-finite max falls back to greedy.
  const std::vector<float> inf = {1.0f, INFINITY, 2.0f};
  for (uint64_t i = 0; i < 20; ++i) EXPECT_EQ(SampleRow(inf, Sampled(1.0f), i), 1);
}

TEST(Sampling, SameSeedAndIndexSameTokenOtherwiseIndependent) {
  std::map<int32_t, int> seen;
  for (uint64_t i = 0; i < 200; ++i) {
    const int32_t t = SampleRow(kLogits, Sampled(1.0f, 0, 1, 0, 7), i);
    EXPECT_EQ(t, SampleRow(kLogits, Sampled(1.0f, 0, 1, 0, 7), i));
    ++seen[t];
  }
  EXPECT_GE(seen.size(), 6u);
  int differ = 0;
  for (uint64_t i = 0; i < 200; ++i)
    differ += SampleRow(kLogits, Sampled(1.0f, 0, 1, 0, 7), i) !=
              SampleRow(kLogits, Sampled(1.0f, 0, 1, 0, 8), i);
  EXPECT_GT(differ, 50);
}

TEST(Sampling, DistributionMatchesDefinition) {
  const int draws = 40000;
  struct Case { SamplingParams p; const char* what; };
  const Case cases[] = {
      {Sampled(1.0f), "temperature 1"},
      {Sampled(0.5f), "temperature 0.5"},
      {Sampled(3.0f), "temperature 3"},
      {Sampled(1.0f, 3), "top-k 3"},
      {Sampled(1.0f, 1), "top-k 1 (the tie at the max kept: 2 tokens)"},
      {Sampled(1.0f, 0, 0.8f), "top-p 0.8"},
      {Sampled(1.0f, 5, 0.9f), "top-k 5 then top-p 0.9"},
      {Sampled(1.0f, 0, 1, 0.2f), "min-p 0.2"},
      {Sampled(0.8f, 6, 0.95f, 0.05f, 99), "everything"},
  };
  for (const Case& c : cases) {
    int df = 0;
    const double chi = ChiSquare(kLogits, c.p, draws, &df);
    EXPECT_LT(chi, Critical(df)) << c.what << ": chi-square " << chi << " with " << df << " df";
  }
  // Filters that leave one token: always the max.
  for (uint64_t i = 0; i < 100; ++i) {
    const int32_t t = SampleRow(kLogits, Sampled(1.0f, 0, 1e-6f), i);
    EXPECT_TRUE(t == 1 || t == 4) << "top-p tiny keeps the tie at the max, got " << t;
    EXPECT_EQ(SampleRow(std::vector<float>{1.0f, 4.0f, 2.0f}, Sampled(5.0f, 1), i), 1);
    EXPECT_EQ(SampleRow(std::vector<float>{1.0f, 4.0f, 2.0f}, Sampled(5.0f, 0, 1, 1.0f), i), 1);
  }
}

TEST(Sampling, LargeVocabularyTopPFollowsDefinition) {
  std::vector<float> z(5000);
  for (size_t i = 0; i < z.size(); ++i) z[i] = float(std::sin(double(i) * 0.37) * 4.0);
  int df = 0;
  std::vector<int> counts;
  const SamplingParams p = Sampled(0.7f, 40, 0.9f, 0, 3);
  const double chi = ChiSquare(z, p, 30000, &df, &counts);
  EXPECT_LT(chi, Critical(df)) << df << " df";
}

TEST(Sampling, LogprobsAreTheModelsDistribution) {
  SamplingParams p = Sampled(0.9f, 4);
  p.top_logprobs = 3;
  const int32_t t = SampleRow(kLogits, p, 0);
  const TokenLogprobs lp = LogprobsRow(kLogits, t, p.top_logprobs);
  double z = 0;
  for (float v : kLogits) z += std::exp(double(v));
  EXPECT_NEAR(lp.logprob, double(kLogits[t]) - std::log(z), 1e-6);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].token, 1);  // the tie at 2.5: lowest index first
  EXPECT_EQ(lp.top[1].token, 4);
  EXPECT_EQ(lp.top[2].token, 7);
  EXPECT_NEAR(lp.top[0].logprob, 2.5 - std::log(z), 1e-6);
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> lps;
  const std::vector<SeqSampling> seqs = {{SamplingParams{}, 0}, {p, 0}};
  std::vector<float> rows = kLogits;
  rows.insert(rows.end(), kLogits.begin(), kLogits.end());
  SampleRows(rows.data(), 2, int(kLogits.size()), seqs, &tokens, &lps);
  EXPECT_EQ(tokens, (std::vector<int32_t>{1, t}));
  ASSERT_EQ(lps.size(), 2u);
  EXPECT_TRUE(lps[0].top.empty());
  EXPECT_EQ(lps[1].top.size(), 3u);
  SampleRows(rows.data(), 2, int(kLogits.size()), {}, &tokens, &lps);
  EXPECT_TRUE(lps.empty());
}

std::unique_ptr<ModelBackend> TinyBackend() {
  ModelConfig c = PresetConfig("tiny", 7).value();
  auto w = DummyWeightsFor(c).value();
  return std::move(CreateCpuBackend(*w, 2)).value();
}

std::vector<int32_t> Prompt(int n, int vocab, int salt) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = (i * 37 + salt * 101) % vocab;
  return p;
}

TEST(GenerateSampling, SeedDecidesTokensWhateverTheBatch) {
  auto backend = TinyBackend();
  const int vocab = backend->config().vocab_size;
  auto pool = backend->CreatePool(128, 16).value();
  GenerateOptions o;
  o.max_new_tokens = 12;
  o.sampling = Sampled(1.2f, 0, 1, 0, 1234);
  o.sampling.logprobs = true;
  o.sampling.top_logprobs = 2;
  const auto prompt = Prompt(9, vocab, 1);
  auto alone = Generate(*backend, *pool, prompt, o);
  ASSERT_TRUE(alone.ok()) << alone.status().ToString();
  auto again = Generate(*backend, *pool, prompt, o);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(alone->tokens, again->tokens);
  ASSERT_EQ(alone->logprobs.size(), alone->tokens.size());
  EXPECT_EQ(alone->logprobs[0].top.size(), 2u);
  // In a batch with other prompts, first or last: the same tokens.
  auto batch = GenerateBatch(*backend, *pool, {Prompt(30, vocab, 2), prompt, Prompt(3, vocab, 3)}, o);
  ASSERT_TRUE(batch.ok());
  EXPECT_EQ((*batch)[1].tokens, alone->tokens);
  // Sampling really happens: not the greedy sequence, and another seed gives another one.
  GenerateOptions greedy = o;
  greedy.sampling = {};
  auto g = Generate(*backend, *pool, prompt, greedy);
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(g->logprobs.empty());
  EXPECT_NE(g->tokens, alone->tokens);
  o.sampling.seed = 1235;
  auto other = Generate(*backend, *pool, prompt, o);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->tokens, alone->tokens);
  // Stop tokens from the list end generation (the token is returned).
  GenerateOptions stop = greedy;
  stop.stop_tokens = {g->tokens[3]};
  auto s = Generate(*backend, *pool, prompt, stop);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->stopped);
  EXPECT_EQ(s->tokens.back(), g->tokens[3]);
  EXPECT_LE(s->tokens.size(), 4u);
  // Bad parameters: refused before any work.
  o.sampling.top_p = 0;
  EXPECT_EQ(Generate(*backend, *pool, prompt, o).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->allocator().free_count(), 128);
}

TEST(GenerationConfig, EosIdsAreTheDefaultStopTokens) {
  auto one = GenerationDefaultsFromJson(R"({"eos_token_id": 2, "temperature": 0.6})", 100);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->eos_token_ids, (std::vector<int32_t>{2}));
  auto list = GenerationDefaultsFromJson(R"({"bos_token_id": 1, "eos_token_id": [5, 9, 5]})", 100);
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->eos_token_ids, (std::vector<int32_t>{5, 9}));
  EXPECT_TRUE(GenerationDefaultsFromJson("{}", 100)->eos_token_ids.empty());
  EXPECT_TRUE(GenerationDefaultsFromJson(R"({"eos_token_id": null})", 100)->eos_token_ids.empty());
}

TEST(GenerationConfig, BadInputIsAnErrorNamingTheKey) {
  const char* bad[] = {
      "", "not json", "[1, 2]", "3", R"({"eos_token_id": "2"})", R"({"eos_token_id": 2.5})",
      R"({"eos_token_id": -1})", R"({"eos_token_id": 100})", R"({"eos_token_id": [1, "x"]})",
      R"({"eos_token_id": [[1]]})", R"({"eos_token_id": {"a": 1}})", R"({"eos_token_id": true})",
      R"({"eos_token_id": 18446744073709551615})", R"({"eos_token_id": 9223372036854775807})",
  };
  for (const char* text : bad) {
    auto d = GenerationDefaultsFromJson(text, 100);
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument) << text;
  }
  std::string many = R"({"eos_token_id": [)";
  for (size_t i = 0; i <= kMaxEosTokens; ++i) many += (i ? "," : "") + std::to_string(i);
  EXPECT_FALSE(GenerationDefaultsFromJson(many + "]}", 100).ok());
  std::string deep(100000, '[');
  EXPECT_FALSE(GenerationDefaultsFromJson(R"({"eos_token_id": )" + deep, 100).ok());
  EXPECT_FALSE(GenerationDefaultsFromJson(std::string(kMaxGenerationConfigBytes + 1, ' '), 100).ok());

  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("kvstream_gc_" + std::to_string(getpid()));
  fs::create_directories(dir);
  EXPECT_TRUE(LoadGenerationDefaults(dir.string(), 100)->eos_token_ids.empty());  // no file
  EXPECT_TRUE(LoadGenerationDefaults("tiny", 100)->eos_token_ids.empty());        // a preset
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": [7, 8]})";
  EXPECT_EQ(LoadGenerationDefaults(dir.string(), 100)->eos_token_ids, (std::vector<int32_t>{7, 8}));
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": 700})";
  auto out_of_range = LoadGenerationDefaults(dir.string(), 100);
  EXPECT_EQ(out_of_range.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(out_of_range.status().message().find("generation_config.json"), std::string::npos);
  fs::remove(dir / "generation_config.json");
  fs::create_directory(dir / "generation_config.json");
  EXPECT_FALSE(LoadGenerationDefaults(dir.string(), 100).ok());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvstream::model
