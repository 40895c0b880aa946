#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>

#include "model/config.h"
#include "model/weights.h"

namespace kvstream::model {
namespace {

TEST(Presets, ShapesAndParameterCounts) {
  struct Want {
    const char* name;
    int layers, hidden, heads, kv, hd, mlp, vocab;
    float theta;
    bool bias;
    double params;
  };
  for (const Want& w : {Want{"llama-2-7b", 32, 4096, 32, 32, 128, 11008, 32000, 1e4f, false, 6.74e9},
                        Want{"llama-3-8b", 32, 4096, 32, 8, 128, 14336, 128256, 5e5f, false, 8.03e9},
                        Want{"qwen2.5-7b", 28, 3584, 28, 4, 128, 18944, 152064, 1e6f, true, 7.62e9}}) {
    auto c = PresetConfig(w.name);
    ASSERT_TRUE(c.ok()) << w.name;
    EXPECT_TRUE(c->Validate().ok());
    EXPECT_EQ(c->num_layers, w.layers);
    EXPECT_EQ(c->hidden_size, w.hidden);
    EXPECT_EQ(c->num_heads, w.heads);
    EXPECT_EQ(c->num_kv_heads, w.kv);
    EXPECT_EQ(c->head_dim, w.hd);
    EXPECT_EQ(c->intermediate_size, w.mlp);
    EXPECT_EQ(c->vocab_size, w.vocab);
    EXPECT_EQ(c->rope_theta, w.theta);
    EXPECT_EQ(c->qkv_bias, w.bias);
    EXPECT_NEAR(double(c->num_parameters()) / w.params, 1.0, 0.005) << w.name;
    // The tensor list sums to the same parameter count.
    uint64_t sum = 0;
    std::set<std::string> names;
    for (const auto& t : ModelTensors(*c)) {
      sum += uint64_t(t.numel());
      EXPECT_TRUE(names.insert(t.name).second) << t.name;
    }
    EXPECT_EQ(sum, c->num_parameters()) << w.name;
  }
  auto tiny = PresetConfig("tiny");
  ASSERT_TRUE(tiny.ok());
  EXPECT_TRUE(tiny->Validate().ok());
  EXPECT_EQ(tiny->num_layers, 2);
  EXPECT_EQ(PresetConfig("nope").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(PresetNames().size(), 4u);
}

TEST(Config, HashCoversNumbers) {
  ModelConfig a = PresetConfig("tiny", 1).value();
  ModelConfig b = a;
  EXPECT_EQ(a.hash(), b.hash());
  b.seed = 2;
  EXPECT_NE(a.hash(), b.hash());
  b = a;
  b.kv_dtype = DType::kBF16;
  EXPECT_NE(a.hash(), b.hash());
  b = a;
  b.rope_theta = 20000.f;
  EXPECT_NE(a.hash(), b.hash());
  b = a;
  b.num_layers = 1;
  EXPECT_NE(a.hash(), b.hash());
}

TEST(Config, ValidateRejectsBadShapes) {
  ModelConfig c = PresetConfig("tiny").value();
  c.num_kv_heads = 3;
  EXPECT_EQ(c.Validate().code(), StatusCode::kInvalidArgument);
  c = PresetConfig("tiny").value();
  c.head_dim = 31;
  EXPECT_FALSE(c.Validate().ok());
  c = PresetConfig("tiny").value();
  c.vocab_size = 0;
  EXPECT_FALSE(c.Validate().ok());
}

TEST(Config, HfJsonLlamaAndQwen) {
  auto llama = ConfigFromHfJson(R"({
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "rope_scaling": null,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 128256,
    "max_position_embeddings": 8192, "hidden_act": "silu"})");
  ASSERT_TRUE(llama.ok()) << llama.status().ToString();
  EXPECT_EQ(llama->family, "llama");
  EXPECT_EQ(llama->head_dim, 128);  // default hidden / heads
  EXPECT_EQ(llama->num_kv_heads, 8);
  EXPECT_EQ(llama->rope_theta, 500000.f);
  EXPECT_EQ(llama->weight_dtype, DType::kBF16);
  EXPECT_FALSE(llama->qkv_bias);
  EXPECT_NEAR(double(llama->num_parameters()) / 8.03e9, 1.0, 0.005);
  // A decode step reads every weight but the input embedding (untied: 128256 x 4096 of them).
  EXPECT_EQ(llama->decode_step_weight_bytes(),
            (llama->num_parameters() - 128256ull * 4096) * DTypeSize(llama->weight_dtype));
  ModelConfig tied = *llama;
  tied.tie_word_embeddings = true;  // the embedding is the LM head: read whole
  EXPECT_EQ(tied.decode_step_weight_bytes(), tied.num_parameters() * DTypeSize(tied.weight_dtype));

  auto qwen = ConfigFromHfJson(R"({
    "architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584, "intermediate_size": 18944,
    "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "vocab_size": 152064})");
  ASSERT_TRUE(qwen.ok()) << qwen.status().ToString();
  EXPECT_TRUE(qwen->qkv_bias);
  EXPECT_EQ(qwen->family, "qwen2");
  EXPECT_EQ(qwen->rms_eps, 1e-6f);

  // Round trip through the writer's JSON.
  ModelConfig t = PresetConfig("tiny").value();
  t.tie_word_embeddings = true;
  auto back = ConfigFromHfJson(ConfigToHfJson(t));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->hash(), t.hash());

  EXPECT_EQ(ConfigFromHfJson("{not json").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ConfigFromHfJson(R"({"architectures": ["GPT2LMHeadModel"]})").status().code(),
            StatusCode::kNotSupported);
  auto missing = ConfigFromHfJson(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64})");
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("num_hidden_layers"), std::string::npos);
  EXPECT_EQ(ConfigFromHfJson(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 1,
    "vocab_size": 10, "rope_scaling": {"type": "longrope"}})").status().code(),
            StatusCode::kNotSupported);
  // llama3 is implemented, but not without its factor.
  auto no_factor = ConfigFromHfJson(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 1,
    "vocab_size": 10, "rope_scaling": {"type": "llama3"}})");
  EXPECT_EQ(no_factor.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(no_factor.status().message().find("'factor'"), std::string::npos)
      << no_factor.status().message();
}

// Found by tests/fuzz/fuzz_model_config (its corpus keeps each input): a field of the wrong JSON
// type threw out of ConfigFromHfJson (the daemon aborted), and shapes whose q_dim() overflows an
// int were accepted.
TEST(Config, HfJsonRefusesFieldsOfTheWrongTypeAndOverflowingShapes) {
  auto refused = [](const std::string& json, const std::string& words) {
    auto c = ConfigFromHfJson(json);
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << json;
    EXPECT_NE(c.status().message().find(words), std::string::npos) << c.status().message();
  };
  refused(R"({"model_type": 5})", "'model_type' must be a string");
  const std::string shape = R"("architectures": ["LlamaForCausalLM"], "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 1, "vocab_size": 10)";
  refused("{" + shape + R"(, "attention_bias": "no"})", "'attention_bias' must be true or false");
  refused("{" + shape + R"(, "mlp_bias": 0})", "'mlp_bias' must be true or false");
  EXPECT_TRUE(ConfigFromHfJson("{" + shape + R"(, "attention_bias": null})").ok());
  refused(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 1073741824, "num_key_value_heads": 1073741824,
    "head_dim": 1073741824, "num_hidden_layers": 1, "vocab_size": 10})",
          "num_heads * head_dim = 1152921504606846976 is too large");
}

TEST(Weights, BigPresetResolvesWithoutMaterialising) {
  ModelSpec spec;
  spec.model = "llama-3-8b";
  spec.num_layers_override = 1;
  spec.weight_dtype = DType::kBF16;
  spec.kv_dtype = DType::kBF16;
  auto w = OpenWeights(spec);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ((*w)->config().num_layers, 1);
  EXPECT_EQ((*w)->config().kv_bytes_per_token(), 2u * 1 * 8 * 128 * 2);
  EXPECT_EQ((*w)->tensors().size(), 1u + 9u + 2u);
  EXPECT_EQ((*w)->tensors().back().name, "lm_head.weight");
  EXPECT_EQ((*w)->tensors().back().shape, (std::vector<int64_t>{128256, 4096}));
  // One small tensor reads fine (the layer norm), with values in its documented range.
  std::vector<float> norm;
  ASSERT_TRUE((*w)->ReadF32((*w)->tensors()[1], &norm).ok());
  EXPECT_EQ(norm.size(), 4096u);
  for (float x : norm) ASSERT_TRUE(x >= 0.89f && x <= 1.11f) << x;  // 1 +- 0.1, bf16-rounded
}

TEST(Weights, MaxPositionOverride) {
  ModelSpec spec;
  spec.model = "llama-3-8b";
  spec.num_layers_override = 1;
  auto base = OpenWeights(spec);
  ASSERT_TRUE(base.ok()) << base.status().ToString();
  EXPECT_EQ((*base)->config().max_position, 8192);
  spec.max_position_override = 32768;
  auto longer = OpenWeights(spec);
  ASSERT_TRUE(longer.ok()) << longer.status().ToString();
  EXPECT_EQ((*longer)->config().max_position, 32768);
  // The limit does not change the numbers, so peers with different limits still agree.
  EXPECT_EQ((*longer)->config().hash(), (*base)->config().hash());
  spec.max_position_override = -1;
  EXPECT_EQ(OpenWeights(spec).status().code(), StatusCode::kInvalidArgument);
}

TEST(Weights, DummyValuesAreDeterministicAndScaled) {
  ModelSpec spec;
  spec.model = "tiny";
  spec.seed = 5;
  spec.weight_dtype = DType::kF32;
  auto w = OpenWeights(spec);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const auto& ts = (*w)->tensors();
  ASSERT_FALSE(ts.empty());
  std::vector<float> a, b;
  ASSERT_TRUE((*w)->ReadF32(ts[1], &a).ok());  // layer 0 input norm
  ASSERT_TRUE((*w)->ReadF32(ts[1], &b).ok());
  EXPECT_EQ(a, b);
  for (float x : a) {
    EXPECT_GE(x, 0.9f);
    EXPECT_LE(x, 1.1f);
  }
  EXPECT_EQ(a[3], DummyWeight(ts[1], 5, 3));
  // bf16 storage rounds the same values.
  spec.weight_dtype = DType::kBF16;
  auto wb = OpenWeights(spec);
  ASSERT_TRUE(wb.ok());
  std::vector<float> c;
  ASSERT_TRUE((*wb)->ReadF32(ts[2], &c).ok());
  for (size_t i = 0; i < c.size(); i += 101)
    EXPECT_EQ(c[i], RoundToDType(DummyWeight(ts[2], 5, i), DType::kBF16));
  std::vector<std::byte> raw;
  DType raw_dtype;
  ASSERT_TRUE((*wb)->ReadRaw(ts[2], &raw, &raw_dtype).ok());
  ASSERT_EQ(raw_dtype, DType::kBF16);
  for (size_t i = 0; i < c.size(); i += 97) {
    uint16_t bits;
    std::memcpy(&bits, raw.data() + 2 * i, 2);
    EXPECT_EQ(bits, F32ToBf16(DummyWeight(ts[2], 5, i)));
    EXPECT_EQ(Bf16ToF32(bits), c[i]);
  }
  spec.num_layers_override = 3;
  EXPECT_EQ(OpenWeights(spec).status().code(), StatusCode::kInvalidArgument);
  spec.model = "no-such-model";
  spec.num_layers_override = 0;
  EXPECT_EQ(OpenWeights(spec).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvstream::model
