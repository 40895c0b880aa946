#include "cli/flags.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/dummy_init.h"
#include "model/config.h"

namespace kvstream::cli {

Result<Flags> Flags::Parse(std::span<const std::string> args, const std::vector<FlagSpec>& specs) {
  Flags f;
  std::map<std::string, const FlagSpec*> by_name;
  for (const auto& s : specs) {
    by_name[s.name] = &s;
    if (!s.default_value.empty()) f.defaults_[s.name] = s.default_value;
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      f.help_ = true;
      continue;
    }
    if (a.rfind("--", 0) != 0 || a.size() == 2)
      return InvalidArgument("unexpected argument '" + a + "'");
    std::string name = a.substr(2), value;
    bool inline_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    for (char& c : name)
      if (c == '_') c = '-';  // --tls_ca == --tls-ca, as the daemons read their flags
    auto it = by_name.find(name);
    if (it == by_name.end()) return InvalidArgument("unknown flag --" + name);
    if (f.values_.count(name)) return InvalidArgument("flag --" + name + " given twice");
    if (!it->second->takes_value) {
      if (inline_value) return InvalidArgument("flag --" + name + " takes no value");
      f.values_[name] = "true";
      continue;
    }
    if (!inline_value) {
      if (i + 1 >= args.size()) return InvalidArgument("flag --" + name + " needs a value");
      value = args[++i];
    }
    f.values_[name] = value;
  }
  return f;
}

std::string Flags::Get(const std::string& name) const {
  if (auto it = values_.find(name); it != values_.end()) return it->second;
  if (auto it = defaults_.find(name); it != defaults_.end()) return it->second;
  return "";
}

Result<int64_t> Flags::GetInt(const std::string& name, int64_t min, int64_t max) const {
  const std::string v = Get(name);
  try {
    size_t used = 0;
    long long x = std::stoll(v, &used);
    if (used != v.size()) throw std::invalid_argument(v);
    if (x < min || x > max)
      return InvalidArgument("--" + name + " must be in [" + std::to_string(min) + ", " +
                             std::to_string(max) + "], got " + v);
    return static_cast<int64_t>(x);
  } catch (const std::exception&) {
    return InvalidArgument("--" + name + " must be an integer, got '" + v + "'");
  }
}

Result<DType> Flags::GetDType(const std::string& name) const {
  DType d;
  if (!ParseDType(Get(name), &d))
    return InvalidArgument("--" + name + " must be f32, f16 or bf16, got '" + Get(name) + "'");
  return d;
}

std::string FlagsHelp(const std::vector<FlagSpec>& specs) {
  std::ostringstream os;
  for (const auto& s : specs) {
    std::string left = "  --" + s.name + (s.takes_value ? " V" : "");
    os << left << std::string(left.size() < 24 ? 24 - left.size() : 1, ' ') << s.help;
    if (!s.default_value.empty()) os << " (default " << s.default_value << ")";
    os << "\n";
  }
  return os.str();
}

std::vector<FlagSpec> ModelFlagSpecs() {
  return {
      {"model", true, "preset (tiny, llama-2-7b, llama-3-8b, qwen2.5-7b) or HF checkpoint dir", "tiny"},
      {"layers", true, "keep only the first N layers (0 = all)", "0"},
      {"max-position", true, "longest sequence accepted (0 = the model's own limit)", "0"},
      {"seed", true, "dummy-weight seed (presets)", "0"},
      {"weight-dtype", true, "f32, f16 or bf16 (default f16; a checkpoint's torch_dtype)", ""},
      {"kv-dtype", true, "KV cache dtype (default: the weight dtype if 16-bit, else f16)", ""},
  };
}

Result<model::ModelSpec> ModelSpecFromFlags(const Flags& flags) {
  model::ModelSpec spec;
  spec.model = flags.Get("model");
  KV_ASSIGN_OR_RETURN(int64_t layers, flags.GetInt("layers", 0, 1 << 16));
  spec.num_layers_override = static_cast<int>(layers);
  KV_ASSIGN_OR_RETURN(int64_t max_pos, flags.GetInt("max-position", 0, 1 << 24));
  spec.max_position_override = static_cast<int>(max_pos);
  KV_ASSIGN_OR_RETURN(int64_t seed, flags.GetInt("seed", 0, INT64_MAX));
  spec.seed = static_cast<uint64_t>(seed);
  spec.weight_dtype = DType::kF16;
  if (flags.Has("weight-dtype")) {
    KV_ASSIGN_OR_RETURN(spec.weight_dtype, flags.GetDType("weight-dtype"));
  } else {
    std::error_code ec;
    if (std::filesystem::is_directory(spec.model, ec)) {
      std::ifstream f(std::filesystem::path(spec.model) / "config.json");
      std::stringstream ss;
      ss << f.rdbuf();
      auto cfg = model::ConfigFromHfJson(ss.str(), spec.max_position_override);
      if (cfg.ok()) spec.weight_dtype = cfg->weight_dtype;  // a bad config fails at load
    }
  }
  if (flags.Has("kv-dtype")) {
    KV_ASSIGN_OR_RETURN(spec.kv_dtype, flags.GetDType("kv-dtype"));
  } else {
    spec.kv_dtype = spec.weight_dtype == DType::kF32 ? DType::kF16 : spec.weight_dtype;
  }
  return spec;
}

std::vector<FlagSpec> BackendFlagSpecs() {
  return {
      {"backend", true, "cpu or cuda", "cpu"},
      {"device", true, "CUDA device ordinal", "0"},
      {"threads", true, "CPU backend threads (0 = all cores)", "0"},
  };
}

Result<model::BackendOptions> BackendOptionsFromFlags(const Flags& flags) {
  model::BackendOptions o;
  o.kind = flags.Get("backend");
  if (o.kind != "cpu" && o.kind != "cuda")
    return InvalidArgument("--backend must be cpu or cuda, got '" + o.kind + "'");
  KV_ASSIGN_OR_RETURN(int64_t dev, flags.GetInt("device", 0, 1024));
  o.device = static_cast<int>(dev);
  KV_ASSIGN_OR_RETURN(int64_t th, flags.GetInt("threads", 0, 4096));
  o.num_threads = static_cast<int>(th);
  return o;
}

Result<std::vector<int32_t>> ParseTokenList(const std::string& text) {
  std::vector<int32_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      long long v = std::stoll(item, &used);
      if (used != item.size() || v < 0 || v > INT32_MAX) throw std::invalid_argument(item);
      out.push_back(static_cast<int32_t>(v));
    } catch (const std::exception&) {
      return InvalidArgument("bad token id '" + item + "' in '" + text + "'");
    }
  }
  if (out.empty()) return InvalidArgument("empty token list");
  return out;
}

std::vector<FlagSpec> PromptFlagSpecs() {
  return {
      {"prompt-tokens", true, "comma-separated prompt token ids, e.g. 1,2,3", ""},
      {"prompt-len", true, "or: a deterministic prompt of N token ids", ""},
  };
}

Result<std::vector<int32_t>> PromptFromFlags(const Flags& flags, int vocab_size, uint64_t seed) {
  if (flags.Has("prompt-tokens") == flags.Has("prompt-len"))
    return InvalidArgument("give exactly one of --prompt-tokens or --prompt-len");
  std::vector<int32_t> prompt;
  if (flags.Has("prompt-tokens")) {
    KV_ASSIGN_OR_RETURN(prompt, ParseTokenList(flags.Get("prompt-tokens")));
  } else {
    KV_ASSIGN_OR_RETURN(int64_t n, flags.GetInt("prompt-len", 1, 1 << 20));
    for (int64_t i = 0; i < n; ++i)
      prompt.push_back(static_cast<int32_t>(SplitMix64(seed * 1000003 + uint64_t(i)) % uint64_t(vocab_size)));
  }
  for (int32_t t : prompt)
    if (t >= vocab_size)
      return InvalidArgument("prompt token " + std::to_string(t) + " is out of the vocabulary [0, " +
                             std::to_string(vocab_size) + ")");
  return prompt;
}

}  // namespace kvstream::cli
