#include "model/config.h"

#include <bit>
#include <climits>
#include <cmath>
#include <cstring>

#include <nlohmann/json.hpp>

namespace kvstream::model {
namespace {

ModelConfig Make(const char* name, const char* family, int layers, int hidden, int heads,
                 int kv_heads, int head_dim, int inter, int vocab, float theta, float eps,
                 bool qkv_bias, int max_pos) {
  ModelConfig c;
  c.name = name;
  c.family = family;
  c.num_layers = layers;
  c.hidden_size = hidden;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.intermediate_size = inter;
  c.vocab_size = vocab;
  c.rope_theta = theta;
  c.rms_eps = eps;
  c.qkv_bias = qkv_bias;
  c.max_position = max_pos;
  return c;
}

// FNV-1a over explicit little-endian encodings, so the hash is stable across builds.
struct Hasher {
  uint64_t h = 0xcbf29ce484222325ULL;
  void Bytes(const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) {
      h ^= b[i];
      h *= 0x100000001b3ULL;
    }
  }
  void U64(uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
    Bytes(b, 8);
  }
  void F32(float f) { U64(std::bit_cast<uint32_t>(f)); }
  void Str(const std::string& s) {
    U64(s.size());
    Bytes(s.data(), s.size());
  }
};

}  // namespace

std::vector<std::string> PresetNames() { return {"tiny", "llama-2-7b", "llama-3-8b", "qwen2.5-7b"}; }

Result<ModelConfig> PresetConfig(const std::string& name, uint64_t seed) {
  ModelConfig c;
  if (name == "tiny") {
    c = Make("tiny", "llama", 2, 256, 8, 4, 32, 512, 512, 10000.f, 1e-5f, false, 4096);
  } else if (name == "llama-2-7b") {
    c = Make("llama-2-7b", "llama", 32, 4096, 32, 32, 128, 11008, 32000, 10000.f, 1e-5f, false,
             4096);
  } else if (name == "llama-3-8b") {
    c = Make("llama-3-8b", "llama", 32, 4096, 32, 8, 128, 14336, 128256, 500000.f, 1e-5f, false,
             8192);
  } else if (name == "qwen2.5-7b") {
    c = Make("qwen2.5-7b", "qwen2", 28, 3584, 28, 4, 128, 18944, 152064, 1000000.f, 1e-6f, true,
             32768);
  } else {
    std::string names;
    for (const auto& n : PresetNames()) names += (names.empty() ? "" : ", ") + n;
    return NotFound("unknown model preset '" + name + "' (presets: " + names + ")");
  }
  c.seed = seed;
  return c;
}

uint64_t ModelConfig::num_parameters() const {
  const uint64_t h = hidden_size, q = uint64_t(num_heads) * head_dim,
                 kv = uint64_t(num_kv_heads) * head_dim;
  uint64_t per_layer = h * q + 2 * h * kv + q * h  // q, k, v, o
                       + 3 * h * uint64_t(intermediate_size)  // gate, up, down
                       + 2 * h;                               // two norms
  if (qkv_bias) per_layer += q + 2 * kv;
  uint64_t total = uint64_t(vocab_size) * h + per_layer * uint64_t(num_layers) + h;
  if (!tie_word_embeddings) total += uint64_t(vocab_size) * h;
  return total;
}

uint64_t ModelConfig::decode_step_weight_bytes() const {
  uint64_t params = num_parameters();
  if (!tie_word_embeddings) params -= uint64_t(vocab_size) * uint64_t(hidden_size);
  return params * DTypeSize(weight_dtype);
}

uint64_t ModelConfig::hash() const {
  Hasher x;
  x.Str("kvstream.model.v1");
  x.Str(family);
  for (int v : {num_layers, hidden_size, num_heads, num_kv_heads, head_dim, intermediate_size,
                vocab_size})
    x.U64(uint64_t(int64_t(v)));
  x.F32(rope_theta);
  x.F32(rms_eps);
  x.U64(qkv_bias);
  x.U64(tie_word_embeddings);
  x.U64(uint64_t(weight_dtype));
  x.U64(uint64_t(kv_dtype));
  x.U64(seed);
  x.U64(weights_id);
  return x.h;
}

Status ModelConfig::Validate() const {
  auto bad = [&](const std::string& what) {
    return InvalidArgument("model config '" + name + "': " + what);
  };
  if (family != "llama" && family != "qwen2") return bad("family must be llama or qwen2, got '" + family + "'");
  if (num_layers <= 0) return bad("num_layers must be > 0");
  if (hidden_size <= 0) return bad("hidden_size must be > 0");
  if (num_heads <= 0 || num_kv_heads <= 0) return bad("num_heads and num_kv_heads must be > 0");
  if (num_heads % num_kv_heads != 0)
    return bad("num_heads (" + std::to_string(num_heads) + ") is not a multiple of num_kv_heads (" +
               std::to_string(num_kv_heads) + ")");
  if (head_dim <= 0 || head_dim % 2 != 0) return bad("head_dim must be even and > 0");
  if (intermediate_size <= 0) return bad("intermediate_size must be > 0");
  if (vocab_size <= 0) return bad("vocab_size must be > 0");
  if (!(rope_theta > 0.f) || !std::isfinite(rope_theta)) return bad("rope_theta must be > 0");
  if (!(rms_eps > 0.f) || !std::isfinite(rms_eps)) return bad("rms_eps must be > 0");
  if (max_position <= 0) return bad("max_position must be > 0");
  // q_dim() and kv_dim() (at most q_dim) are ints.
  if (int64_t{num_heads} * head_dim > INT32_MAX)
    return bad("num_heads * head_dim = " + std::to_string(int64_t{num_heads} * head_dim) +
               " is too large");
  return OkStatus();
}

Result<ModelConfig> ConfigFromHfJson(const std::string& json_text) {
  using nlohmann::json;
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument("config.json: not a JSON object");
  ModelConfig c;
  std::string arch;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string())
    arch = j["architectures"][0].get<std::string>();
  if (j.contains("model_type") && !j["model_type"].is_string())
    return InvalidArgument("config.json: 'model_type' must be a string");
  std::string model_type = j.value("model_type", std::string());
  if (arch == "LlamaForCausalLM" || (arch.empty() && model_type == "llama")) {
    c.family = "llama";
  } else if (arch == "Qwen2ForCausalLM" || (arch.empty() && model_type == "qwen2")) {
    c.family = "qwen2";
  } else {
    return NotSupported("config.json: architecture '" + (arch.empty() ? model_type : arch) +
                        "' is not supported (LlamaForCausalLM, Qwen2ForCausalLM)");
  }
  auto get_int = [&](const char* key, int* out, bool required) -> Status {
    if (!j.contains(key) || j[key].is_null()) {
      if (required) return InvalidArgument(std::string("config.json: missing '") + key + "'");
      return OkStatus();
    }
    if (!j[key].is_number_integer() || j[key].get<int64_t>() <= 0 ||
        j[key].get<int64_t>() > (int64_t(1) << 30))
      return InvalidArgument(std::string("config.json: '") + key + "' must be a positive integer");
    *out = static_cast<int>(j[key].get<int64_t>());
    return OkStatus();
  };
  auto get_float = [&](const char* key, float* out) -> Status {
    if (!j.contains(key) || j[key].is_null()) return OkStatus();
    if (!j[key].is_number())
      return InvalidArgument(std::string("config.json: '") + key + "' must be a number");
    *out = j[key].get<float>();
    return OkStatus();
  };
  KV_RETURN_IF_ERROR(get_int("num_hidden_layers", &c.num_layers, true));
  KV_RETURN_IF_ERROR(get_int("hidden_size", &c.hidden_size, true));
  KV_RETURN_IF_ERROR(get_int("num_attention_heads", &c.num_heads, true));
  c.num_kv_heads = c.num_heads;
  KV_RETURN_IF_ERROR(get_int("num_key_value_heads", &c.num_kv_heads, false));
  c.head_dim = c.hidden_size / c.num_heads;
  KV_RETURN_IF_ERROR(get_int("head_dim", &c.head_dim, false));
  KV_RETURN_IF_ERROR(get_int("intermediate_size", &c.intermediate_size, true));
  KV_RETURN_IF_ERROR(get_int("vocab_size", &c.vocab_size, true));
  KV_RETURN_IF_ERROR(get_int("max_position_embeddings", &c.max_position, false));
  KV_RETURN_IF_ERROR(get_float("rope_theta", &c.rope_theta));
  KV_RETURN_IF_ERROR(get_float("rms_norm_eps", &c.rms_eps));
  if (j.contains("tie_word_embeddings") && j["tie_word_embeddings"].is_boolean())
    c.tie_word_embeddings = j["tie_word_embeddings"].get<bool>();
  c.qkv_bias = c.family == "qwen2";
  auto flag = [&](const char* key, bool* out) -> Status {
    *out = false;
    if (!j.contains(key) || j[key].is_null()) return OkStatus();
    if (!j[key].is_boolean())
      return InvalidArgument(std::string("config.json: '") + key + "' must be true or false");
    *out = j[key].get<bool>();
    return OkStatus();
  };
  bool attention_bias = false, mlp_bias = false;
  KV_RETURN_IF_ERROR(flag("attention_bias", &attention_bias));
  KV_RETURN_IF_ERROR(flag("mlp_bias", &mlp_bias));
  if (c.family == "llama") {
    if (attention_bias)
      return NotSupported("config.json: attention_bias=true (o_proj bias) is not supported");
    if (mlp_bias) return NotSupported("config.json: mlp_bias=true is not supported");
  }
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    return NotSupported("config.json: rope_scaling is not supported");
  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    return NotSupported("config.json: hidden_act must be silu");
  if (j.contains("torch_dtype") && j["torch_dtype"].is_string()) {
    DType d;
    if (!ParseDType(j["torch_dtype"].get<std::string>(), &d))
      return NotSupported("config.json: torch_dtype '" + j["torch_dtype"].get<std::string>() +
                          "' is not supported (float32, float16, bfloat16)");
    c.weight_dtype = d;
  }
  KV_RETURN_IF_ERROR(c.Validate());
  return c;
}

std::string ConfigToHfJson(const ModelConfig& c) {
  nlohmann::ordered_json j;
  const bool qwen = c.family == "qwen2";
  j["architectures"] = {qwen ? "Qwen2ForCausalLM" : "LlamaForCausalLM"};
  j["model_type"] = qwen ? "qwen2" : "llama";
  j["hidden_act"] = "silu";
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_position;
  j["rope_theta"] = c.rope_theta;
  j["rms_norm_eps"] = c.rms_eps;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["torch_dtype"] = c.weight_dtype == DType::kF32   ? "float32"
                     : c.weight_dtype == DType::kF16 ? "float16"
                                                     : "bfloat16";
  if (!qwen) j["attention_bias"] = false;
  return j.dump(2) + "\n";
}

}  // namespace kvstream::model
