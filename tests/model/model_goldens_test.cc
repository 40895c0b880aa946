// The CPU backend against the reference implementation's goldens (tests/data/model_goldens,
// made by scripts/goldens/make_model_goldens.py): every config form (rope_parameters and
// legacy rope_theta / rope_scaling; default, linear, dynamic, llama3, yarn rope; explicit
// head_dim; tied embeddings; Qwen2 QKV bias; Mistral; sharded; f32/f16/bf16 weights).
//
// Tolerances (max |logit difference| over the vocabulary, relative to the largest |logit|):
//   against the float32-compute reference: 1e-4 (the CPU path computes in float32 too; what
//   remains is summation order and float32 vs double rotation frequencies);
//   against the checkpoint-dtype reference: 1e-4 (f32), 1e-2 (f16), 5e-2 (bf16).
// Tokens: all 16 greedy tokens equal, free-running.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "model/cpu_backend.h"
#include "model/generate.h"
#include "model/rope.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "tests/model/golden_util.h"

namespace kvstream::model {
namespace {

using golden::Golden;

ModelSpec SpecFor(const std::string& dir, DType kv = DType::kF32) {
  ModelSpec spec;
  spec.model = dir;
  auto c = ConfigFromHfJson(golden::ReadFile(dir + "/config.json"));
  EXPECT_TRUE(c.ok()) << dir << ": " << c.status().ToString();
  spec.weight_dtype = c.ok() ? c->weight_dtype : DType::kF32;
  spec.kv_dtype = kv;
  return spec;
}

Result<std::vector<int32_t>> GenerateTokens(const ModelSpec& spec, const std::vector<int32_t>& prompt,
                                            int n) {
  KV_ASSIGN_OR_RETURN(auto b, CreateCpuBackend(spec, BackendOptions{}));
  const int bs = 16;
  KV_ASSIGN_OR_RETURN(auto pool, b->CreatePool(BlocksForTokens(int(prompt.size()) + n, bs), bs));
  GenerateOptions opt;
  opt.max_new_tokens = n;
  KV_ASSIGN_OR_RETURN(auto r, Generate(*b, *pool, prompt, opt));
  return r.tokens;
}

double DtypeTol(const std::string& dtype) {
  return dtype == "bfloat16" ? 5e-2 : dtype == "float16" ? 1e-2 : 1e-4;
}

TEST(ModelGoldens, EveryFormIsPresent) {
  const auto cases = golden::GoldenCases();
  for (const char* want :
       {"llama3_gqa_rope_parameters_bf16", "llama_legacy_rope_theta_f32",
        "llama31_llama3_tied_bf16", "llama3_rope_parameters_head_dim_f16", "qwen2_yarn_bf16",
        "llama_yarn_options_f16", "llama_yarn_mscale_bf16", "llama_linear_f16",
        "llama_dynamic_bf16", "llama_dynamic_prompt_past_f16", "qwen2_bias_tied_f16",
        "qwen2_rope_parameters_bf16", "mistral_bf16", "mistral_window_f16", "llama_sharded_bf16"})
    EXPECT_NE(std::find(cases.begin(), cases.end(), want), cases.end()) << want;
}

TEST(ModelGoldens, CpuTokensEqualAndLogitsWithinTolerance) {
  for (const std::string& name : golden::GoldenCases()) {
    SCOPED_TRACE(name);
    const Golden g = golden::LoadGolden(name);
    const ModelSpec spec = SpecFor(g.dir);
    auto tokens = GenerateTokens(spec, g.prompt, int(g.tokens.size()));
    ASSERT_TRUE(tokens.ok()) << tokens.status().ToString();
    EXPECT_EQ(*tokens, g.tokens);
    auto b = CreateCpuBackend(spec, BackendOptions{});
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    std::vector<std::vector<float>> steps;
    ASSERT_TRUE(golden::TeacherForced(**b, g, &steps).ok());
    for (size_t i = 0; i < steps.size(); ++i)
      EXPECT_EQ(golden::Argmax(steps[i]), g.tokens[i]) << "step " << i;
    const double d32 = golden::MaxAbsDiff(steps[0], g.logits_first_f32) / g.max_abs_logit;
    const double dn = golden::MaxAbsDiff(steps[0], g.logits_first) / g.max_abs_logit;
    EXPECT_LE(d32, 1e-4);
    EXPECT_LE(dn, DtypeTol(g.dtype));
    std::printf("%-38s %s: %zu/%zu tokens equal; first-step logits within %.2g (float32 ref) "
                "and %.2g (%s ref) of max |logit| %.3g\n",
                name.c_str(), (*b)->config().rope.type.c_str(),
                size_t(std::mismatch(tokens->begin(), tokens->end(), g.tokens.begin()).first -
                       tokens->begin()),
                g.tokens.size(), d32, dn, g.dtype.c_str(), g.max_abs_logit);
  }
}

// The silent failure: the parser ignored rope_parameters (theta 500000 there) and used
// 10000. Dropping rope_parameters from the golden's config.json reproduces that reading: the
// tokens then differ from the reference's.
TEST(ModelGoldens, RopeParametersThetaChangesTheTokens) {
  namespace fs = std::filesystem;
  const Golden g = golden::LoadGolden("llama3_gqa_rope_parameters_bf16");
  const fs::path tmp = fs::temp_directory_path() / ("kvstream_golden_" + std::to_string(getpid()));
  fs::remove_all(tmp);
  fs::copy(g.dir, tmp);
  auto j = nlohmann::json::parse(golden::ReadFile(g.dir + "/config.json"));
  ASSERT_EQ(j["rope_parameters"]["rope_theta"], 500000.0);
  j.erase("rope_parameters");
  std::ofstream(tmp / "config.json") << j.dump();
  auto old_reading = GenerateTokens(SpecFor(tmp.string()), g.prompt, int(g.tokens.size()));
  ASSERT_TRUE(old_reading.ok()) << old_reading.status().ToString();
  EXPECT_NE(*old_reading, g.tokens);
  fs::remove_all(tmp);
}

// Mistral with a sliding window: accepted because the context limit (max_position) is the
// window, and the backend refuses any position past it.
TEST(ModelGoldens, SlidingWindowIsTheContextLimit) {
  const Golden g = golden::LoadGolden("mistral_window_f16");
  const std::string json = golden::ReadFile(g.dir + "/config.json");
  auto c = ConfigFromHfJson(json);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->sliding_window, 64);
  EXPECT_EQ(c->max_position, 64);
  auto wider = ConfigFromHfJson(json, 65);
  EXPECT_EQ(wider.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wider.status().message().find("sliding_window"), std::string::npos);
  std::vector<int32_t> prompt(60, 5);
  auto past = GenerateTokens(SpecFor(g.dir), prompt, 8);  // positions up to 67
  ASSERT_FALSE(past.ok());
  EXPECT_NE(past.status().message().find("max_position"), std::string::npos)
      << past.status().ToString();
  EXPECT_TRUE(GenerateTokens(SpecFor(g.dir), prompt, 4).ok());  // up to position 63
}

// The sharded golden through model.safetensors.index.json, then broken: hostile file names in
// the index, a missing shard, a truncated shard, a tensor in two shards.
TEST(ModelGoldens, ShardedCheckpointBadInput) {
  namespace fs = std::filesystem;
  const Golden g = golden::LoadGolden("llama_sharded_bf16");
  const fs::path tmp = fs::temp_directory_path() / ("kvstream_shards_" + std::to_string(getpid()));
  auto fresh = [&] {
    fs::remove_all(tmp);
    fs::copy(g.dir, tmp);
  };
  auto open = [&] { return OpenWeights(SpecFor(tmp.string())).status(); };
  auto index = [&] {
    return nlohmann::json::parse(golden::ReadFile((tmp / "model.safetensors.index.json").string()));
  };
  auto write_index = [&](const nlohmann::json& j) {
    std::ofstream(tmp / "model.safetensors.index.json") << j.dump();
  };
  fresh();
  ASSERT_TRUE(open().ok()) << open().ToString();
  for (const std::string bad : {"../model-00001-of-00003.safetensors", "/etc/passwd",
                                "sub/model.safetensors", "..", ".", "", "a\\b"}) {
    fresh();
    auto j = index();
    j["weight_map"]["model.norm.weight"] = bad;
    write_index(j);
    const Status st = open();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad << ": " << st.ToString();
    EXPECT_NE(st.message().find("bad file name"), std::string::npos) << st.ToString();
  }
  fresh();
  fs::remove(tmp / "model-00002-of-00003.safetensors");
  Status st = open();
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.ToString();
  EXPECT_NE(st.message().find("model-00002-of-00003.safetensors"), std::string::npos);
  fresh();
  const fs::path shard = tmp / "model-00003-of-00003.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 100);
  st = open();
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
  EXPECT_NE(st.message().find("truncated"), std::string::npos) << st.ToString();
  fresh();
  {
    std::vector<float> norm(64, 1.f);
    ASSERT_TRUE(WriteSafetensors((tmp / "extra.safetensors").string(),
                                 {TensorFromBytes("model.norm.weight", DType::kF32, {64},
                                                  std::as_bytes(std::span(norm))),
                                  TensorFromBytes("extra", DType::kF32, {64},
                                                  std::as_bytes(std::span(norm)))})
                    .ok());
    auto j = index();
    j["weight_map"]["extra"] = "extra.safetensors";
    write_index(j);
  }
  st = open();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("'model.norm.weight' is in both"), std::string::npos) << st.ToString();
  fs::remove_all(tmp);
}

// rope_cases.json: the reference's inverse frequencies and attention scaling for configs of
// every rope type and precedence case, against RopeFrequencies (reference in float32).
TEST(ModelGoldens, RopeFrequenciesMatchTheReference) {
  auto j = nlohmann::json::parse(golden::ReadFile(golden::GoldenRoot() + "/rope_cases.json"));
  int compared = 0;
  for (const auto& rc : j["cases"]) {
    const std::string name = rc["name"];
    SCOPED_TRACE(name);
    if (rc.contains("error")) continue;
    auto c = ConfigFromHfJson(rc["config"].dump());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    auto check = [&](const RopeFreqs& f, const nlohmann::json& want, const std::string& what) {
      ASSERT_EQ(f.inv_freq.size(), want.size()) << what;
      for (size_t i = 0; i < f.inv_freq.size(); ++i) {
        const double w = want[i].get<double>();
        EXPECT_NEAR(f.inv_freq[i], w, 2e-6 * std::fabs(w)) << what << " i=" << i;
      }
    };
    const RopeFreqs f = RopeFrequencies(*c, 0);
    check(f, rc["inv_freq"], "inv_freq");
    EXPECT_NEAR(f.scale, rc["attention_scaling"].get<double>(), 1e-6);
    if (rc.contains("dynamic"))
      for (const auto& d : rc["dynamic"])
        check(RopeFrequencies(*c, d["seq_len"].get<int64_t>()), d["inv_freq"],
              "seq_len " + std::to_string(d["seq_len"].get<int64_t>()));
    ++compared;
  }
  EXPECT_GE(compared, 15);
}

}  // namespace
}  // namespace kvstream::model
