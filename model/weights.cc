#include "model/weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace kvstream::model {
namespace {

// Chunked parallel loop for materialising large tensors; each element is a pure function
// of its index, so the split does not change any value.
template <typename F>
void ParallelChunks(int64_t n, F fn) {
  const int64_t kMin = 1 << 20;
  int threads = static_cast<int>(std::min<int64_t>(std::max(1u, std::thread::hardware_concurrency()),
                                                   (n + kMin - 1) / kMin));
  if (threads <= 1) {
    fn(0, n);
    return;
  }
  std::vector<std::thread> pool;
  int64_t chunk = (n + threads - 1) / threads;
  for (int t = 0; t < threads; ++t) {
    int64_t b = t * chunk, e = std::min(n, b + chunk);
    if (b < e) pool.emplace_back([=] { fn(b, e); });
  }
  for (auto& th : pool) th.join();
}

void Convert(const void* src, DType sd, void* dst, DType dd, int64_t n) {
  if (sd == dd) {
    std::memcpy(dst, src, size_t(n) * DTypeSize(sd));
    return;
  }
  ParallelChunks(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) StoreFromF32(dst, dd, i, LoadAsF32(src, sd, i));
  });
}

TensorSpec Spec(std::string name, std::vector<int64_t> shape, uint64_t id, float scale,
                float offset, TensorRole role, int layer) {
  TensorSpec t;
  t.name = std::move(name);
  t.shape = std::move(shape);
  t.dummy_id = id;
  t.dummy_scale = scale;
  t.dummy_offset = offset;
  t.role = role;
  t.layer = layer;
  return t;
}

class DummyWeights : public WeightSource {
 public:
  DummyWeights(ModelConfig c) {
    config_ = std::move(c);
    tensors_ = ModelTensors(config_);
  }
  bool is_dummy() const override { return true; }
  DType stored_dtype(const TensorSpec&) const override { return config_.weight_dtype; }
  Status Read(const TensorSpec& t, DType dtype, void* dst) const override {
    const uint64_t seed = config_.seed;
    const DType wd = config_.weight_dtype;
    ParallelChunks(t.numel(), [&](int64_t b, int64_t e) {
      if (dtype == wd) {  // one rounding gives the same bits as rounding twice
        for (int64_t i = b; i < e; ++i) StoreFromF32(dst, dtype, i, DummyWeight(t, seed, i));
      } else {
        for (int64_t i = b; i < e; ++i)
          StoreFromF32(dst, dtype, i, RoundToDType(DummyWeight(t, seed, i), wd));
      }
    });
    return OkStatus();
  }
};

class CheckpointWeights : public WeightSource {
 public:
  CheckpointWeights(ModelConfig c, std::unique_ptr<SafetensorsCheckpoint> ck) : ck_(std::move(ck)) {
    config_ = std::move(c);
    tensors_ = ModelTensors(config_);
  }
  Status Check() const {
    for (const auto& t : tensors_) KV_RETURN_IF_ERROR(ck_->GetChecked(t.name, t.shape).status());
    return OkStatus();
  }
  bool is_dummy() const override { return false; }
  DType stored_dtype(const TensorSpec& t) const override {
    auto v = ck_->Get(t.name);
    return v.ok() ? v->dtype : config_.weight_dtype;
  }
  Status Read(const TensorSpec& t, DType dtype, void* dst) const override {
    KV_ASSIGN_OR_RETURN(TensorView v, ck_->GetChecked(t.name, t.shape));
    Convert(v.bytes.data(), v.dtype, dst, dtype, v.numel());
    return OkStatus();
  }

 private:
  std::unique_ptr<SafetensorsCheckpoint> ck_;
};

}  // namespace

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<TensorSpec> ModelTensors(const ModelConfig& c) {
  const int64_t h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), m = c.intermediate_size,
                v = c.vocab_size;
  auto pres = [](int64_t fan_in) { return float(std::sqrt(3.0 / double(fan_in))); };
  auto resid = [](int64_t fan_in) { return float(std::sqrt(1.0 / double(fan_in))); };
  std::vector<TensorSpec> out;
  out.push_back(Spec("model.embed_tokens.weight", {v, h}, 1, 1.0f, 0.f, TensorRole::kEmbed, -1));
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const uint64_t id = 1000 + 100 * uint64_t(l);
    out.push_back(Spec(p + "input_layernorm.weight", {h}, id + 0, 0.1f, 1.f, TensorRole::kInputNorm, l));
    out.push_back(Spec(p + "self_attn.q_proj.weight", {q, h}, id + 1, pres(h), 0.f, TensorRole::kQProj, l));
    out.push_back(Spec(p + "self_attn.k_proj.weight", {kv, h}, id + 2, pres(h), 0.f, TensorRole::kKProj, l));
    out.push_back(Spec(p + "self_attn.v_proj.weight", {kv, h}, id + 3, pres(h), 0.f, TensorRole::kVProj, l));
    if (c.qkv_bias) {
      out.push_back(Spec(p + "self_attn.q_proj.bias", {q}, id + 4, 0.1f, 0.f, TensorRole::kQBias, l));
      out.push_back(Spec(p + "self_attn.k_proj.bias", {kv}, id + 5, 0.1f, 0.f, TensorRole::kKBias, l));
      out.push_back(Spec(p + "self_attn.v_proj.bias", {kv}, id + 6, 0.1f, 0.f, TensorRole::kVBias, l));
    }
    out.push_back(Spec(p + "self_attn.o_proj.weight", {h, q}, id + 7, resid(q), 0.f, TensorRole::kOProj, l));
    out.push_back(Spec(p + "post_attention_layernorm.weight", {h}, id + 8, 0.1f, 1.f, TensorRole::kPostAttnNorm, l));
    out.push_back(Spec(p + "mlp.gate_proj.weight", {m, h}, id + 9, pres(h), 0.f, TensorRole::kGateProj, l));
    out.push_back(Spec(p + "mlp.up_proj.weight", {m, h}, id + 10, pres(h), 0.f, TensorRole::kUpProj, l));
    out.push_back(Spec(p + "mlp.down_proj.weight", {h, m}, id + 11, resid(m), 0.f, TensorRole::kDownProj, l));
  }
  out.push_back(Spec("model.norm.weight", {h}, 2, 0.1f, 1.f, TensorRole::kFinalNorm, -1));
  if (!c.tie_word_embeddings)
    out.push_back(Spec("lm_head.weight", {v, h}, 3, pres(h), 0.f, TensorRole::kLmHead, -1));
  return out;
}

Status WeightSource::ReadF32(const TensorSpec& t, std::vector<float>* out) const {
  out->resize(size_t(t.numel()));
  return Read(t, DType::kF32, out->data());
}

Status WeightSource::ReadRaw(const TensorSpec& t, std::vector<std::byte>* out, DType* dtype) const {
  *dtype = stored_dtype(t);
  out->resize(size_t(t.numel()) * DTypeSize(*dtype));
  return Read(t, *dtype, out->data());
}

Result<std::unique_ptr<WeightSource>> OpenWeights(const ModelSpec& spec) {
  namespace fs = std::filesystem;
  ModelConfig c;
  std::unique_ptr<SafetensorsCheckpoint> ck;
  std::error_code ec;
  const bool is_dir = fs::is_directory(spec.model, ec);
  if (!is_dir) {
    auto preset = PresetConfig(spec.model, spec.seed);
    if (!preset.ok()) {
      if (spec.model.find('/') != std::string::npos)
        return NotFound("model '" + spec.model + "' is neither a preset nor a directory");
      return preset.status();
    }
    c = std::move(preset).value();
  } else {
    const std::string cfg_path = (fs::path(spec.model) / "config.json").string();
    std::ifstream f(cfg_path);
    if (!f) return NotFound("checkpoint " + spec.model + " has no config.json");
    std::stringstream ss;
    ss << f.rdbuf();
    auto parsed = ConfigFromHfJson(ss.str(), spec.max_position_override);
    if (!parsed.ok()) return parsed.status().WithContext(cfg_path);
    c = std::move(parsed).value();
    c.name = spec.model;
    c.seed = 0;
    KV_ASSIGN_OR_RETURN(ck, SafetensorsCheckpoint::Open(spec.model));
    c.weights_id = ck->identity();
  }
  if (spec.num_layers_override > 0) {
    if (spec.num_layers_override > c.num_layers)
      return InvalidArgument("layer override " + std::to_string(spec.num_layers_override) +
                             " exceeds the model's " + std::to_string(c.num_layers) + " layers");
    c.num_layers = spec.num_layers_override;
  } else if (spec.num_layers_override < 0) {
    return InvalidArgument("negative layer override");
  }
  if (spec.max_position_override < 0) return InvalidArgument("negative max_position override");
  if (spec.max_position_override > 0) c.max_position = spec.max_position_override;
  c.weight_dtype = spec.weight_dtype;
  c.kv_dtype = spec.kv_dtype;
  KV_RETURN_IF_ERROR(c.Validate());
  if (!ck) return std::unique_ptr<WeightSource>(new DummyWeights(std::move(c)));
  auto w = std::make_unique<CheckpointWeights>(std::move(c), std::move(ck));
  KV_RETURN_IF_ERROR(w->Check().WithContext("checkpoint " + spec.model));
  return std::unique_ptr<WeightSource>(std::move(w));
}

Result<std::unique_ptr<WeightSource>> DummyWeightsFor(const ModelConfig& config) {
  KV_RETURN_IF_ERROR(config.Validate());
  return std::unique_ptr<WeightSource>(new DummyWeights(config));
}

Status WriteHfCheckpoint(const WeightSource& src, DType dtype, const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Unavailable("creating " + dir + ": " + ec.message());
  ModelConfig c = src.config();
  c.weight_dtype = dtype;
  {
    const std::string path = (fs::path(dir) / "config.json").string();
    std::ofstream f(path);
    f << ConfigToHfJson(c);
    if (!f) return Unavailable("writing " + path);
  }
  std::vector<TensorToWrite> tensors;
  for (const TensorSpec& t : src.tensors()) {
    TensorToWrite w;
    w.name = t.name;
    w.dtype = dtype;
    w.shape = t.shape;
    w.fill = [&src, t, dtype](std::span<std::byte> dst) { return src.Read(t, dtype, dst.data()); };
    tensors.push_back(std::move(w));
  }
  std::map<std::string, std::string> meta{{"format", "pt"}, {"producer", "kvstream"}};
  return WriteSafetensors((fs::path(dir) / "model.safetensors").string(), tensors, meta);
}

}  // namespace kvstream::model
