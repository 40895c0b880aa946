#include "model/config.h"

#include <bit>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>

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
  void F64(double f) { U64(std::bit_cast<uint64_t>(f)); }
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
  x.Str(rope.type);
  for (double v : {rope.factor, rope.low_freq_factor, rope.high_freq_factor, rope.beta_fast,
                   rope.beta_slow, rope.attention_factor})
    x.F64(v);
  x.U64(uint64_t(int64_t(rope.original_max_position)));
  x.U64(rope.truncate);
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
  if (family != "llama" && family != "qwen2" && family != "mistral")
    return bad("family must be llama, qwen2 or mistral, got '" + family + "'");
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
  if (rope.type != "default" && rope.type != "linear" && rope.type != "dynamic" &&
      rope.type != "llama3" && rope.type != "yarn")
    return bad("rope type '" + rope.type +
               "' is not supported (default, linear, dynamic, llama3, yarn)");
  if (!(rope.factor >= 1.0) || !std::isfinite(rope.factor)) return bad("rope factor must be >= 1");
  if (rope.type != "default" && rope.type != "linear" && rope.original_max_position <= 0)
    return bad("rope type '" + rope.type + "' needs original_max_position > 0");
  if (rope.type == "llama3" &&
      !(rope.low_freq_factor > 0 && rope.high_freq_factor > rope.low_freq_factor))
    return bad("llama3 rope needs 0 < low_freq_factor < high_freq_factor");
  if (rope.type == "yarn" && !(rope.beta_fast > 0 && rope.beta_slow > 0))
    return bad("yarn rope needs beta_fast > 0 and beta_slow > 0");
  if (!(rope.attention_factor > 0) || !std::isfinite(rope.attention_factor))
    return bad("rope attention factor must be > 0");
  if (sliding_window < 0) return bad("sliding_window must be >= 0");
  if (sliding_window > 0 && max_position > sliding_window)
    return bad("'sliding_window' " + std::to_string(sliding_window) +
               " is smaller than the context limit " + std::to_string(max_position) +
               " (max_position_embeddings): sliding-window attention is not implemented, so the "
               "context must stay within the window (--max-position " +
               std::to_string(sliding_window) + ")");
  // q_dim() and kv_dim() (at most q_dim) are ints.
  if (int64_t{num_heads} * head_dim > INT32_MAX)
    return bad("num_heads * head_dim = " + std::to_string(int64_t{num_heads} * head_dim) +
               " is too large");
  return OkStatus();
}

namespace {

using nlohmann::json;

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

// The rope dict transformers uses (see ConfigFromHfJson in config.h) into c->rope_theta and
// c->rope. `where` names the dict in messages ("rope_scaling" or "rope_parameters").
Status ParseRope(const json& j, ModelConfig* c) {
  auto err = [](const std::string& m) { return InvalidArgument("config.json: " + m); };
  json params = json::object();
  std::string where = "rope_parameters";
  const bool has_scaling = j.contains("rope_scaling") && !j["rope_scaling"].is_null();
  if (has_scaling && !j["rope_scaling"].is_object())
    return err("'rope_scaling' must be an object or null");
  if (j.contains("rope_parameters") && !j["rope_parameters"].is_null() &&
      !j["rope_parameters"].is_object())
    return err("'rope_parameters' must be an object or null");
  if (has_scaling && !j["rope_scaling"].empty()) {
    params = j["rope_scaling"];  // transformers: rope_scaling, when given, replaces rope_parameters
    where = "rope_scaling";
  } else if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    params = j["rope_parameters"];
  }
  // Per-layer-type form ({"full_attention": {...}, "sliding_attention": {...}}): one rope for
  // every layer is all the backends implement, so only identical entries are accepted.
  if (!params.empty()) {
    bool nested = true;
    for (const auto& [k, v] : params.items()) nested = nested && v.is_object();
    if (nested) {
      const json first = params.begin().value();
      for (const auto& [k, v] : params.items())
        if (v != first)
          return NotSupported("config.json: '" + where + "' gives layer type '" + k +
                              "' its own rotary settings; one rope for every layer is supported");
      params = first;
    }
  }
  auto num = [&](const char* key, double* out, bool required) -> Status {
    if (!params.contains(key) || params[key].is_null()) {
      if (required) return err("'" + where + "' of type '" + c->rope.type + "' needs '" + key + "'");
      return OkStatus();
    }
    if (!params[key].is_number() || !std::isfinite(params[key].get<double>()))
      return err("'" + where + "." + key + "' must be a number");
    *out = params[key].get<double>();
    return OkStatus();
  };
  // rope_type (or its legacy name "type").
  c->rope = RopeScaling();
  for (const char* key : {"rope_type", "type"}) {
    if (params.contains(key) && !params[key].is_null()) {
      if (!params[key].is_string()) return err("'" + where + "." + key + "' must be a string");
      c->rope.type = params[key].get<std::string>();
      break;
    }
  }
  const std::string& type = c->rope.type;
  std::set<std::string> allowed = {"rope_type", "type", "rope_theta", "partial_rotary_factor"};
  if (type == "linear" || type == "dynamic") {
    allowed.insert("factor");
  } else if (type == "llama3") {
    allowed.insert({"factor", "low_freq_factor", "high_freq_factor",
                    "original_max_position_embeddings"});
  } else if (type == "yarn") {
    allowed.insert({"factor", "original_max_position_embeddings", "attention_factor", "beta_fast",
                    "beta_slow", "mscale", "mscale_all_dim", "truncate"});
  } else if (type != "default") {
    return NotSupported("config.json: '" + where + "' rope type '" + type +
                        "' is not supported (default, linear, dynamic, llama3, yarn)");
  }
  for (const auto& [k, v] : params.items())
    if (!allowed.count(k))
      return NotSupported("config.json: '" + where + "." + k + "' is not supported for rope type '" +
                          type + "'");
  // theta: the dict's value, else the top-level rope_theta, else transformers' default 10000.
  double theta = 10000.0;
  if (j.contains("rope_theta") && !j["rope_theta"].is_null()) {
    if (!j["rope_theta"].is_number()) return err("'rope_theta' must be a number");
    theta = j["rope_theta"].get<double>();
  }
  KV_RETURN_IF_ERROR(num("rope_theta", &theta, false));
  if (!(theta > 0.0) || !std::isfinite(theta)) return err("rope_theta must be > 0, got " + Num(theta));
  c->rope_theta = static_cast<float>(theta);
  for (const json* src : std::initializer_list<const json*>{&j, &params}) {
    if (src->contains("partial_rotary_factor") && !(*src)["partial_rotary_factor"].is_null()) {
      const json& v = (*src)["partial_rotary_factor"];
      if (!v.is_number() || v.get<double>() != 1.0)
        return NotSupported("config.json: partial_rotary_factor " + v.dump() +
                            " is not supported (only 1: rotary over the whole head)");
    }
  }
  RopeScaling& r = c->rope;
  const int max_pos = c->max_position;
  if (type == "default") return OkStatus();
  KV_RETURN_IF_ERROR(num("factor", &r.factor, type != "yarn"));
  // llama3 and yarn read the pretraining length from the dict, else from a top-level
  // original_max_position_embeddings (which transformers lets win), else max_position_embeddings.
  if (type == "llama3" || type == "yarn") {
    double orig = max_pos;
    KV_RETURN_IF_ERROR(num("original_max_position_embeddings", &orig, false));
    if (j.contains("original_max_position_embeddings") &&
        !j["original_max_position_embeddings"].is_null()) {
      if (!j["original_max_position_embeddings"].is_number())
        return err("'original_max_position_embeddings' must be a number");
      orig = j["original_max_position_embeddings"].get<double>();
    }
    if (!(orig >= 1 && orig <= (1 << 30)) || orig != std::floor(orig))
      return err("original_max_position_embeddings must be a positive integer");
    r.original_max_position = static_cast<int>(orig);
  } else if (type == "dynamic") {
    r.original_max_position = max_pos;
  }
  if (type == "yarn" && !(params.contains("factor") && !params["factor"].is_null()))
    r.factor = double(max_pos) / r.original_max_position;  // transformers' fallback
  if (!(r.factor >= 1.0) || r.factor > 1e6)
    return err("'" + where + ".factor' must be >= 1, got " + Num(r.factor));
  if (type == "llama3") {
    KV_RETURN_IF_ERROR(num("low_freq_factor", &r.low_freq_factor, true));
    KV_RETURN_IF_ERROR(num("high_freq_factor", &r.high_freq_factor, true));
    if (!(r.low_freq_factor > 0) || !(r.high_freq_factor > r.low_freq_factor))
      return err("llama3 rope needs 0 < low_freq_factor < high_freq_factor");
  }
  if (type == "yarn") {
    // transformers: `beta_fast or 32`, `beta_slow or 1` (0 and null mean the default).
    KV_RETURN_IF_ERROR(num("beta_fast", &r.beta_fast, false));
    KV_RETURN_IF_ERROR(num("beta_slow", &r.beta_slow, false));
    if (r.beta_fast == 0) r.beta_fast = 32;
    if (r.beta_slow == 0) r.beta_slow = 1;
    if (!(r.beta_fast > 0) || !(r.beta_slow > 0))
      return err("yarn beta_fast and beta_slow must be > 0");
    if (params.contains("truncate") && !params["truncate"].is_null()) {
      if (!params["truncate"].is_boolean())
        return err("'" + where + ".truncate' must be true or false");
      r.truncate = params["truncate"].get<bool>();
    }
    double af = 0, mscale = 0, mscale_all = 0;
    KV_RETURN_IF_ERROR(num("attention_factor", &af, false));
    KV_RETURN_IF_ERROR(num("mscale", &mscale, false));
    KV_RETURN_IF_ERROR(num("mscale_all_dim", &mscale_all, false));
    auto get_mscale = [&](double m) {
      return r.factor <= 1 ? 1.0 : 0.1 * m * std::log(r.factor) + 1.0;
    };
    if (params.contains("attention_factor") && !params["attention_factor"].is_null()) {
      r.attention_factor = af;
    } else if (mscale != 0 && mscale_all != 0) {
      r.attention_factor = get_mscale(mscale) / get_mscale(mscale_all);
    } else {
      r.attention_factor = get_mscale(1.0);
    }
    if (!(r.attention_factor > 0) || !std::isfinite(r.attention_factor))
      return err("yarn attention factor must be > 0");
  }
  return OkStatus();
}

// Sliding-window attention is not implemented: accepted only where the window never drops a
// token (checked by Validate against max_position).
Status ParseSlidingWindow(const json& j, ModelConfig* c) {
  bool uses_window = c->family == "mistral";
  if (c->family == "qwen2" && j.contains("use_sliding_window") && !j["use_sliding_window"].is_null()) {
    if (!j["use_sliding_window"].is_boolean())
      return InvalidArgument("config.json: 'use_sliding_window' must be true or false");
    uses_window = j["use_sliding_window"].get<bool>();
  }
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    if (!j["layer_types"].is_array())
      return InvalidArgument("config.json: 'layer_types' must be a list");
    for (const auto& t : j["layer_types"]) {
      if (t == "sliding_attention") {
        uses_window = true;
      } else if (t != "full_attention") {
        return NotSupported("config.json: 'layer_types' entry " + t.dump() +
                            " is not supported (full_attention, sliding_attention)");
      }
    }
  }
  if (!uses_window || !j.contains("sliding_window") || j["sliding_window"].is_null()) return OkStatus();
  const json& w = j["sliding_window"];
  if (!w.is_number_integer() || w.get<int64_t>() <= 0 || w.get<int64_t>() > (int64_t(1) << 30))
    return InvalidArgument("config.json: 'sliding_window' must be a positive integer or null");
  c->sliding_window = static_cast<int>(w.get<int64_t>());
  return OkStatus();
}

}  // namespace

Result<ModelConfig> ConfigFromHfJson(const std::string& json_text, int max_position_override) {
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
  } else if (arch == "MistralForCausalLM" || (arch.empty() && model_type == "mistral")) {
    c.family = "mistral";
  } else {
    return NotSupported("config.json: architecture '" + (arch.empty() ? model_type : arch) +
                        "' is not supported (LlamaForCausalLM, Qwen2ForCausalLM, "
                        "MistralForCausalLM)");
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
  KV_RETURN_IF_ERROR(get_float("rms_norm_eps", &c.rms_eps));
  KV_RETURN_IF_ERROR(ParseRope(j, &c));
  // Dynamic NTK exists to run past max_position_embeddings: its context limit is that times
  // the factor (the length the rescaled base is meant for).
  if (c.rope.type == "dynamic")
    c.max_position =
        static_cast<int>(std::min(double(1 << 30), std::floor(c.max_position * c.rope.factor)));
  if (max_position_override > 0) c.max_position = max_position_override;
  if (j.contains("tie_word_embeddings") && !j["tie_word_embeddings"].is_null()) {
    if (!j["tie_word_embeddings"].is_boolean())
      return InvalidArgument("config.json: 'tie_word_embeddings' must be true or false");
    c.tie_word_embeddings = j["tie_word_embeddings"].get<bool>();
  }
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
  if (c.family != "qwen2") {
    if (attention_bias)
      return NotSupported("config.json: attention_bias=true (q/k/v/o biases) is not supported");
    if (mlp_bias) return NotSupported("config.json: mlp_bias=true is not supported");
  }
  if (j.contains("hidden_act") && !j["hidden_act"].is_null() && j["hidden_act"] != "silu")
    return NotSupported("config.json: hidden_act " + j["hidden_act"].dump() +
                        " is not supported (silu)");
  if (j.contains("quantization_config") && !j["quantization_config"].is_null())
    return NotSupported("config.json: quantization_config (quantized weights) is not supported");
  KV_RETURN_IF_ERROR(ParseSlidingWindow(j, &c));
  // transformers 5 writes "dtype"; 4.x wrote "torch_dtype" ("dtype" wins when both are there).
  for (const char* key : {"dtype", "torch_dtype"}) {
    if (!j.contains(key) || !j[key].is_string()) continue;
    DType d;
    if (!ParseDType(j[key].get<std::string>(), &d))
      return NotSupported("config.json: " + std::string(key) + " '" + j[key].get<std::string>() +
                          "' is not supported (float32, float16, bfloat16)");
    c.weight_dtype = d;
    break;
  }
  KV_RETURN_IF_ERROR(c.Validate());
  return c;
}

std::string ConfigToHfJson(const ModelConfig& c) {
  nlohmann::ordered_json j;
  const char* arch = c.family == "qwen2"     ? "Qwen2ForCausalLM"
                     : c.family == "mistral" ? "MistralForCausalLM"
                                             : "LlamaForCausalLM";
  j["architectures"] = {arch};
  j["model_type"] = c.family;
  j["hidden_act"] = "silu";
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  // Dynamic NTK's threshold is max_position_embeddings itself.
  j["max_position_embeddings"] =
      c.rope.type == "dynamic" ? c.rope.original_max_position : c.max_position;
  j["rope_theta"] = c.rope_theta;
  const RopeScaling& r = c.rope;
  if (r.type == "default") {
    j["rope_scaling"] = nullptr;
  } else {
    nlohmann::ordered_json s;
    s["rope_type"] = r.type;
    s["factor"] = r.factor;
    if (r.type == "llama3" || r.type == "yarn")
      s["original_max_position_embeddings"] = r.original_max_position;
    if (r.type == "llama3") {
      s["low_freq_factor"] = r.low_freq_factor;
      s["high_freq_factor"] = r.high_freq_factor;
    }
    if (r.type == "yarn") {
      s["beta_fast"] = r.beta_fast;
      s["beta_slow"] = r.beta_slow;
      s["truncate"] = r.truncate;
      s["attention_factor"] = r.attention_factor;
    }
    j["rope_scaling"] = s;
  }
  j["rms_norm_eps"] = c.rms_eps;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (c.sliding_window > 0) {
    if (c.family == "qwen2") j["use_sliding_window"] = true;
    j["sliding_window"] = c.sliding_window;
  }
  j["torch_dtype"] = c.weight_dtype == DType::kF32   ? "float32"
                     : c.weight_dtype == DType::kF16 ? "float16"
                                                     : "bfloat16";
  if (c.family == "llama") j["attention_bias"] = false;
  return j.dump(2) + "\n";
}

std::string DescribeConfig(const ModelConfig& c) {
  const RopeScaling& r = c.rope;
  std::string rope = r.type + " theta=" + Num(c.rope_theta);
  if (r.type != "default") rope += " factor=" + Num(r.factor);
  if (r.type == "llama3")
    rope += " low_freq_factor=" + Num(r.low_freq_factor) + " high_freq_factor=" +
            Num(r.high_freq_factor);
  if (r.type == "yarn")
    rope += " beta_fast=" + Num(r.beta_fast) + " beta_slow=" + Num(r.beta_slow) +
            " truncate=" + (r.truncate ? "true" : "false") + " attention_factor=" +
            Num(r.attention_factor);
  if (r.type == "llama3" || r.type == "yarn")
    rope += " original_max_position_embeddings=" + std::to_string(r.original_max_position);
  if (r.type == "dynamic") rope += " rescales past " + std::to_string(r.original_max_position);
  const char* arch = c.family == "qwen2"     ? "Qwen2ForCausalLM"
                     : c.family == "mistral" ? "MistralForCausalLM"
                                             : "LlamaForCausalLM";
  std::string s = std::string(arch) + ": " + std::to_string(c.num_layers) + " layers, hidden " +
                  std::to_string(c.hidden_size) + ", heads " + std::to_string(c.num_heads) + "/" +
                  std::to_string(c.num_kv_heads) + ", head_dim " + std::to_string(c.head_dim) +
                  ", mlp " + std::to_string(c.intermediate_size) + ", vocab " +
                  std::to_string(c.vocab_size) + "; rope " + rope + "; qkv bias " +
                  (c.qkv_bias ? "yes" : "no") + "; tied embeddings " +
                  (c.tie_word_embeddings ? "yes" : "no") + "; dtype " +
                  std::string(DTypeName(c.weight_dtype)) + "; context limit " +
                  std::to_string(c.max_position);
  if (c.sliding_window > 0) s += " (sliding_window " + std::to_string(c.sliding_window) + ")";
  return s;
}

}  // namespace kvstream::model
