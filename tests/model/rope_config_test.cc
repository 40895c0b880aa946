// config.json forms (rope_theta / rope_parameters / rope_scaling with transformers' precedence,
// head_dim, tied embeddings, Mistral and sliding windows, keys that are refused) and the rope
// frequencies every backend uses (model/rope.h).
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>

#include "model/config.h"
#include "model/rope.h"

namespace kvstream::model {
namespace {

const std::string kShape = R"("architectures": ["LlamaForCausalLM"], "hidden_size": 256,
  "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 1, "vocab_size": 10,
  "max_position_embeddings": 4096)";

ModelConfig Parse(const std::string& extra, const std::string& shape = kShape) {
  auto c = ConfigFromHfJson("{" + shape + (extra.empty() ? "" : ", " + extra) + "}");
  EXPECT_TRUE(c.ok()) << extra << ": " << c.status().ToString();
  return c.ok() ? *c : ModelConfig();
}

// Refused with `code`, the message naming `words`.
void Refused(const std::string& extra, StatusCode code, const std::string& words,
             const std::string& shape = kShape) {
  auto c = ConfigFromHfJson("{" + shape + ", " + extra + "}");
  ASSERT_FALSE(c.ok()) << extra;
  EXPECT_EQ(c.status().code(), code) << c.status().ToString();
  EXPECT_NE(c.status().message().find(words), std::string::npos) << c.status().message();
}

TEST(RopeConfig, ThetaPrecedenceAsInTransformers) {
  EXPECT_EQ(Parse("").rope_theta, 10000.f);  // transformers' default
  EXPECT_EQ(Parse(R"("rope_theta": 500000.0)").rope_theta, 500000.f);
  // The issue's silent failure: transformers 5.x writes theta only inside rope_parameters.
  ModelConfig p = Parse(R"("rope_parameters": {"rope_type": "default", "rope_theta": 500000.0})");
  EXPECT_EQ(p.rope_theta, 500000.f);
  EXPECT_EQ(p.rope.type, "default");
  // The dict's theta wins over the top-level one; the top-level one fills a dict without it.
  EXPECT_EQ(Parse(R"("rope_theta": 1000000.0,
                    "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0})")
                .rope_theta,
            500000.f);
  EXPECT_EQ(Parse(R"("rope_theta": 1000000.0, "rope_parameters": {"rope_type": "default"})")
                .rope_theta,
            1000000.f);
  // A non-empty rope_scaling replaces rope_parameters whole (theta then from the top level).
  ModelConfig both = Parse(R"("rope_scaling": {"rope_type": "linear", "factor": 4.0},
      "rope_parameters": {"rope_type": "linear", "rope_theta": 500000.0, "factor": 2.0})");
  EXPECT_EQ(both.rope.type, "linear");
  EXPECT_EQ(both.rope.factor, 4.0);
  EXPECT_EQ(both.rope_theta, 10000.f);
  // null or {} rope_scaling leaves rope_parameters in charge.
  for (const char* scaling : {"null", "{}"}) {
    ModelConfig c = Parse(std::string(R"("rope_scaling": )") + scaling +
                          R"(, "rope_parameters": {"rope_type": "linear", "factor": 2.0,
                                                   "rope_theta": 250000.0})");
    EXPECT_EQ(c.rope.type, "linear") << scaling;
    EXPECT_EQ(c.rope.factor, 2.0) << scaling;
    EXPECT_EQ(c.rope_theta, 250000.f) << scaling;
  }
  // The legacy key "type".
  EXPECT_EQ(Parse(R"("rope_scaling": {"type": "linear", "factor": 3.0})").rope.factor, 3.0);
  // Nested per layer type with one rope for every layer: accepted.
  ModelConfig nested = Parse(R"("rope_parameters": {
      "full_attention": {"rope_type": "default", "rope_theta": 20000.0},
      "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0}})");
  EXPECT_EQ(nested.rope_theta, 20000.f);
}

TEST(RopeConfig, EveryRopeType) {
  // Llama 3.1 8B.
  ModelConfig l3 = Parse(R"("rope_theta": 500000.0, "rope_scaling": {"factor": 8.0,
      "high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 8192,
      "rope_type": "llama3"})", std::string(kShape) + R"(, "max_position_embeddings": 131072)");
  EXPECT_EQ(l3.rope.type, "llama3");
  EXPECT_EQ(l3.rope.factor, 8.0);
  EXPECT_EQ(l3.rope.low_freq_factor, 1.0);
  EXPECT_EQ(l3.rope.high_freq_factor, 4.0);
  EXPECT_EQ(l3.rope.original_max_position, 8192);
  EXPECT_EQ(l3.max_position, 131072);
  // Qwen2.5 with YaRN: attention factor 0.1 ln(factor) + 1 by default.
  ModelConfig yarn = Parse(R"("rope_theta": 1000000.0, "rope_scaling": {"type": "yarn",
      "factor": 4.0, "original_max_position_embeddings": 32768})");
  EXPECT_EQ(yarn.rope.type, "yarn");
  EXPECT_NEAR(yarn.rope.attention_factor, 0.1 * std::log(4.0) + 1.0, 1e-15);
  EXPECT_EQ(yarn.rope.beta_fast, 32.0);
  EXPECT_EQ(yarn.rope.beta_slow, 1.0);
  EXPECT_TRUE(yarn.rope.truncate);
  // mscale / mscale_all_dim, explicit attention_factor, truncate, betas.
  ModelConfig ms = Parse(R"("rope_scaling": {"rope_type": "yarn", "factor": 40.0,
      "original_max_position_embeddings": 1024, "mscale": 1.0, "mscale_all_dim": 0.5})");
  EXPECT_NEAR(ms.rope.attention_factor,
              (0.1 * std::log(40.0) + 1.0) / (0.05 * std::log(40.0) + 1.0), 1e-15);
  ModelConfig opt = Parse(R"("rope_parameters": {"rope_type": "yarn", "factor": 4.0,
      "original_max_position_embeddings": 1024, "beta_fast": 16, "beta_slow": 2,
      "attention_factor": 0.9, "truncate": false})");
  EXPECT_EQ(opt.rope.attention_factor, 0.9);
  EXPECT_EQ(opt.rope.beta_fast, 16.0);
  EXPECT_EQ(opt.rope.beta_slow, 2.0);
  EXPECT_FALSE(opt.rope.truncate);
  // yarn without original_max_position_embeddings: max_position_embeddings; a top-level
  // original_max_position_embeddings wins over the dict's (transformers' Phi-3 rule).
  EXPECT_EQ(Parse(R"("rope_scaling": {"rope_type": "yarn", "factor": 4.0})")
                .rope.original_max_position,
            4096);
  EXPECT_EQ(Parse(R"("original_max_position_embeddings": 512, "rope_scaling": {
                    "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024})")
                .rope.original_max_position,
            512);
  // Dynamic NTK rescales past max_position_embeddings; the context limit is that x factor.
  ModelConfig dyn = Parse(R"("rope_scaling": {"rope_type": "dynamic", "factor": 2.0})");
  EXPECT_EQ(dyn.rope.original_max_position, 4096);
  EXPECT_EQ(dyn.max_position, 8192);
  EXPECT_EQ(Parse(R"("rope_scaling": {"rope_type": "linear", "factor": 2.0})").max_position, 4096);
}

TEST(RopeConfig, UnimplementedKeysAreErrorsNamingTheKey) {
  Refused(R"("partial_rotary_factor": 0.5)", StatusCode::kNotSupported, "partial_rotary_factor");
  Refused(R"("rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.25})",
          StatusCode::kNotSupported, "partial_rotary_factor");
  EXPECT_EQ(Parse(R"("partial_rotary_factor": 1.0)").rope.type, "default");
  Refused(R"("rope_scaling": {"rope_type": "longrope", "short_factor": [1], "long_factor": [1]})",
          StatusCode::kNotSupported, "'longrope'");
  Refused(R"("rope_scaling": {"rope_type": "default", "mrope_section": [16, 24, 24]})",
          StatusCode::kNotSupported, "rope_scaling.mrope_section");
  Refused(R"("rope_scaling": {"rope_type": "linear", "factor": 2.0, "low_freq_factor": 1.0})",
          StatusCode::kNotSupported, "rope_scaling.low_freq_factor");
  Refused(R"("rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4},
      "sliding_attention": {"rope_type": "default", "rope_theta": 1e6}})",
          StatusCode::kNotSupported, "sliding_attention");
  Refused(R"("rope_scaling": {"rope_type": "linear", "factor": 0.5})",
          StatusCode::kInvalidArgument, "factor");
  Refused(R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0})",
          StatusCode::kInvalidArgument, "high_freq_factor");
  Refused(R"("rope_scaling": "linear")", StatusCode::kInvalidArgument, "rope_scaling");
  Refused(R"("rope_scaling": {"rope_type": 3})", StatusCode::kInvalidArgument, "rope_type");
  Refused(R"("attention_bias": true)", StatusCode::kNotSupported, "attention_bias");
  Refused(R"("mlp_bias": true)", StatusCode::kNotSupported, "mlp_bias");
  Refused(R"("hidden_act": "gelu")", StatusCode::kNotSupported, "hidden_act");
  Refused(R"("quantization_config": {"quant_method": "awq"})", StatusCode::kNotSupported,
          "quantization_config");
  Refused(R"("layer_types": ["full_attention", "chunked_attention"])", StatusCode::kNotSupported,
          "layer_types");
  Refused(R"("tie_word_embeddings": "yes")", StatusCode::kInvalidArgument, "tie_word_embeddings");
}

const std::string kMistral = R"("architectures": ["MistralForCausalLM"], "model_type": "mistral",
  "hidden_size": 256, "intermediate_size": 128, "num_attention_heads": 4,
  "num_key_value_heads": 2, "num_hidden_layers": 1, "vocab_size": 10, "head_dim": null,
  "max_position_embeddings": 32768, "rope_theta": 1000000.0)";

TEST(RopeConfig, MistralAndSlidingWindows) {
  ModelConfig m = Parse(R"("sliding_window": null)", kMistral);
  EXPECT_EQ(m.family, "mistral");
  EXPECT_FALSE(m.qkv_bias);
  EXPECT_EQ(m.head_dim, 64);
  EXPECT_EQ(m.sliding_window, 0);
  // Mistral 7B v0.1: a 4096 window under a 32768 context would drop tokens: refused, naming the
  // key and the way out; capping the context at the window is accepted.
  Refused(R"("sliding_window": 4096)", StatusCode::kInvalidArgument, "'sliding_window' 4096",
          kMistral);
  Refused(R"("sliding_window": 4096)", StatusCode::kInvalidArgument, "--max-position 4096",
          kMistral);
  auto capped = ConfigFromHfJson("{" + kMistral + R"(, "sliding_window": 4096})", 4096);
  ASSERT_TRUE(capped.ok()) << capped.status().ToString();
  EXPECT_EQ(capped->sliding_window, 4096);
  EXPECT_EQ(capped->max_position, 4096);
  ModelConfig wide = *capped;
  wide.max_position = 4097;  // an override applied later is checked again
  EXPECT_EQ(wide.Validate().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Parse(R"("sliding_window": 32768)", kMistral).sliding_window, 32768);
  Refused(R"("attention_bias": true)", StatusCode::kNotSupported, "attention_bias", kMistral);
  // Qwen2: the window applies only with use_sliding_window (or a sliding layer type).
  const std::string qwen = R"("architectures": ["Qwen2ForCausalLM"], "hidden_size": 256,
    "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 10,
    "max_position_embeddings": 32768, "sliding_window": 4096)";
  EXPECT_EQ(Parse(R"("use_sliding_window": false)", qwen).sliding_window, 0);
  EXPECT_EQ(Parse(R"("layer_types": ["full_attention", "full_attention"])", qwen).sliding_window, 0);
  Refused(R"("use_sliding_window": true)", StatusCode::kInvalidArgument, "sliding_window", qwen);
  Refused(R"("layer_types": ["full_attention", "sliding_attention"])",
          StatusCode::kInvalidArgument, "sliding_window", qwen);
}

TEST(RopeConfig, HeadDimTiedDtypeKeys) {
  ModelConfig c = Parse(R"("head_dim": 128, "tie_word_embeddings": true, "dtype": "bfloat16",
                          "torch_dtype": "float32")");
  EXPECT_EQ(c.head_dim, 128);  // explicit, != hidden / heads
  EXPECT_EQ(c.q_dim(), 512);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.weight_dtype, DType::kBF16);  // transformers 5's "dtype" wins
  EXPECT_EQ(Parse(R"("torch_dtype": "float32")").weight_dtype, DType::kF32);
}

TEST(RopeConfig, HashCoversEveryRopeFieldAndJsonRoundTrips) {
  ModelConfig a = Parse(R"("rope_scaling": {"rope_type": "yarn", "factor": 4.0,
      "original_max_position_embeddings": 1024})");
  const uint64_t h = a.hash();
  auto differs = [&](auto change) {
    ModelConfig b = a;
    change(b.rope);
    return b.hash() != h;
  };
  EXPECT_TRUE(differs([](RopeScaling& r) { r.type = "linear"; }));
  EXPECT_TRUE(differs([](RopeScaling& r) { r.factor = 4.5; }));
  EXPECT_TRUE(differs([](RopeScaling& r) { r.original_max_position = 2048; }));
  EXPECT_TRUE(differs([](RopeScaling& r) { r.low_freq_factor = 2; }));
  EXPECT_TRUE(differs([](RopeScaling& r) { r.high_freq_factor = 8; }));
  EXPECT_TRUE(differs([](RopeScaling& r) { r.beta_fast = 16; }));
  EXPECT_TRUE(differs([](RopeScaling& r) { r.beta_slow = 2; }));
  EXPECT_TRUE(differs([](RopeScaling& r) { r.truncate = false; }));
  EXPECT_TRUE(differs([](RopeScaling& r) { r.attention_factor = 1.5; }));
  for (const std::string& extra :
       {std::string(""), std::string(R"("rope_scaling": {"rope_type": "linear", "factor": 2.0})"),
        std::string(R"("rope_scaling": {"rope_type": "dynamic", "factor": 2.0})"),
        std::string(R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 512})"),
        std::string(R"("rope_scaling": {"rope_type": "yarn", "factor": 3.0, "beta_fast": 8,
            "truncate": false, "mscale": 1.0, "mscale_all_dim": 0.5})")}) {
    ModelConfig c = Parse(extra);
    auto back = ConfigFromHfJson(ConfigToHfJson(c));
    ASSERT_TRUE(back.ok()) << extra << ": " << back.status().ToString();
    EXPECT_EQ(back->hash(), c.hash()) << extra << "\n" << ConfigToHfJson(c);
    EXPECT_EQ(back->max_position, c.max_position) << extra;
  }
  ModelConfig m = Parse(R"("sliding_window": 32768)", kMistral);
  auto back = ConfigFromHfJson(ConfigToHfJson(m));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->family, "mistral");
  EXPECT_EQ(back->sliding_window, 32768);
  EXPECT_NE(DescribeConfig(m).find("MistralForCausalLM"), std::string::npos);
  const std::string d = DescribeConfig(Parse(R"("rope_scaling": {"rope_type": "llama3",
      "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 512}, "tie_word_embeddings": true)"));
  for (const char* words : {"LlamaForCausalLM", "rope llama3 theta=10000 factor=8",
                            "original_max_position_embeddings=512", "tied embeddings yes",
                            "head_dim 64"})
    EXPECT_NE(d.find(words), std::string::npos) << d;
}

// Frequencies, against values derived by hand from transformers' formulas.
TEST(RopeFrequencies, DefaultLinearDynamic) {
  ModelConfig c = Parse(R"("rope_theta": 10000.0)");
  RopeFreqs f = RopeFrequencies(c, 0);
  ASSERT_EQ(f.inv_freq.size(), 32u);
  EXPECT_EQ(f.scale, 1.0);
  for (int i = 0; i < 32; ++i) EXPECT_DOUBLE_EQ(f.inv_freq[i], std::pow(10000.0, -i / 32.0));
  ModelConfig lin = Parse(R"("rope_scaling": {"rope_type": "linear", "factor": 4.0})");
  RopeFreqs fl = RopeFrequencies(lin, 0);
  for (int i = 0; i < 32; ++i) EXPECT_DOUBLE_EQ(fl.inv_freq[i], f.inv_freq[i] / 4);
  ModelConfig dyn = Parse(R"("rope_scaling": {"rope_type": "dynamic", "factor": 2.0})");
  EXPECT_FALSE(RopeDependsOnLength(dyn, 4096));
  EXPECT_TRUE(RopeDependsOnLength(dyn, 4097));
  EXPECT_EQ(RopeFrequencies(dyn, 4096).inv_freq, f.inv_freq);
  // seq_len 8192 = 2 x 4096: base = 1e4 * (2 * 2 - 1)^(64 / 62).
  const double base = 10000.0 * std::pow(3.0, 64.0 / 62.0);
  RopeFreqs fd = RopeFrequencies(dyn, 8192);
  for (int i = 0; i < 32; ++i) EXPECT_NEAR(fd.inv_freq[i] / std::pow(base, -i / 32.0), 1.0, 1e-12);
}

TEST(RopeFrequencies, Llama3BandsOfLlama31_8B) {
  ModelConfig c = Parse(R"("head_dim": 128, "rope_theta": 500000.0, "rope_scaling": {
      "factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
      "original_max_position_embeddings": 8192, "rope_type": "llama3"})");
  RopeFreqs f = RopeFrequencies(c, 0);
  ASSERT_EQ(f.inv_freq.size(), 64u);
  // wavelength 2 pi 500000^(i/64) is below 8192/4 = 2048 for i <= 28 (kept), above 8192 for
  // i >= 35 (divided by 8), in between for i = 29..34 (smoothly interpolated).
  for (int i = 0; i < 64; ++i) {
    const double orig = std::pow(500000.0, -i / 64.0);
    const double wavelen = 2 * std::numbers::pi / orig;
    if (i <= 28) {
      EXPECT_DOUBLE_EQ(f.inv_freq[i], orig) << i;
    } else if (i >= 35) {
      EXPECT_DOUBLE_EQ(f.inv_freq[i], orig / 8) << i;
    } else {
      const double smooth = (8192 / wavelen - 1) / 3;
      EXPECT_NEAR(f.inv_freq[i], (1 - smooth) * orig / 8 + smooth * orig, 1e-15) << i;
      EXPECT_GT(f.inv_freq[i], orig / 8);
      EXPECT_LT(f.inv_freq[i], orig);
    }
  }
}

TEST(RopeFrequencies, YarnRampOfQwen25) {
  ModelConfig c = Parse(R"("head_dim": 128, "rope_theta": 1000000.0, "rope_scaling": {
      "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})");
  RopeFreqs f = RopeFrequencies(c, 0);
  EXPECT_NEAR(f.scale, 0.1 * std::log(4.0) + 1, 1e-15);
  // Correction range: floor(128 ln(32768 / (32 * 2pi)) / (2 ln 1e6)) = 23 and
  // ceil(128 ln(32768 / (2pi)) / (2 ln 1e6)) = 40: extrapolated below, interpolated above.
  for (int i = 0; i < 64; ++i) {
    const double orig = 1.0 / std::pow(1e6, 2.0 * i / 128);
    const double ramp = std::clamp((i - 23) / 17.0, 0.0, 1.0);
    EXPECT_NEAR(f.inv_freq[i] / (orig / 4 * ramp + orig * (1 - ramp)), 1.0, 1e-13) << i;
  }
  EXPECT_DOUBLE_EQ(f.inv_freq[23], 1.0 / std::pow(1e6, 46.0 / 128));
  EXPECT_NEAR(f.inv_freq[40], 1.0 / std::pow(1e6, 80.0 / 128) / 4, 1e-20);
  // truncate=false keeps the fractional bounds (23.597..., 39.65...).
  ModelConfig nt = c;
  nt.rope.truncate = false;
  RopeFreqs g = RopeFrequencies(nt, 0);
  EXPECT_DOUBLE_EQ(g.inv_freq[23], f.inv_freq[23]);  // below the low bound either way
  EXPECT_NE(g.inv_freq[24], f.inv_freq[24]);
}

}  // namespace
}  // namespace kvstream::model
