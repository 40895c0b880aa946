// The one description of the decoder's tensors, shared by every backend, and where their
// values come from (deterministic dummy weights or an HF safetensors checkpoint).
//
// Dummy weights: element i (row-major over `shape`) of tensor t is
//     DummyWeight(t, seed, i) = t.dummy_offset + DummyValue(seed, t.dummy_id, i, t.dummy_scale)
// computed in fp32 (common/dummy_init.h, identical on host and device), then rounded to the
// config's weight_dtype (RoundToDType): that rounded value is the weight every backend uses.
// So a CUDA backend generates the same weights on the GPU as the CPU backend on the host.
//
// Scales keep activations well-conditioned through many layers: projections that feed a
// nonlinearity or attention scores are variance-preserving (uniform in +-sqrt(3/fan_in)),
// the two projections that write into the residual stream (o_proj, down_proj) shrink by
// sqrt(3), norms are 1 +- 0.1, embeddings +-1, biases +-0.1.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/dummy_init.h"
#include "common/status.h"
#include "model/backend.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace kvstream::model {

enum class TensorRole : uint8_t {
  kEmbed,        // [vocab, hidden]
  kFinalNorm,    // [hidden]
  kLmHead,       // [vocab, hidden]; absent when tie_word_embeddings (the embedding is used)
  kInputNorm,    // [hidden]
  kQProj,        // [heads * head_dim, hidden]
  kKProj,        // [kv_heads * head_dim, hidden]
  kVProj,        // [kv_heads * head_dim, hidden]
  kQBias,        // [heads * head_dim]     (qkv_bias only)
  kKBias,        // [kv_heads * head_dim]  (qkv_bias only)
  kVBias,        // [kv_heads * head_dim]  (qkv_bias only)
  kOProj,        // [hidden, heads * head_dim]
  kPostAttnNorm, // [hidden]
  kGateProj,     // [intermediate, hidden]
  kUpProj,       // [intermediate, hidden]
  kDownProj,     // [hidden, intermediate]
};

struct TensorSpec {
  std::string name;            // HF name, e.g. model.layers.0.self_attn.q_proj.weight
  std::vector<int64_t> shape;  // row-major; linear weights are [out_features, in_features]
  uint64_t dummy_id = 0;
  float dummy_scale = 0.f;
  float dummy_offset = 0.f;
  TensorRole role = TensorRole::kEmbed;
  int layer = -1;              // -1 for embed, final norm, lm head
  int64_t numel() const;
};

// Every tensor of the model, in a fixed order: embed, then per layer (input norm, q, k, v,
// [q/k/v bias], o, post-attention norm, gate, up, down), then final norm, then lm head
// (unless tied).
std::vector<TensorSpec> ModelTensors(const ModelConfig& config);

inline float DummyWeight(const TensorSpec& t, uint64_t seed, uint64_t i) {
  return t.dummy_offset + DummyValue(seed, t.dummy_id, i, t.dummy_scale);
}
// The value a tensor stored in `dtype` holds for v (round to nearest even).
inline float RoundToDType(float v, DType dtype) {
  switch (dtype) {
    case DType::kF32: return v;
    case DType::kF16: return F16ToF32(F32ToF16(v));
    case DType::kBF16: return Bf16ToF32(F32ToBf16(v));
  }
  return v;
}

// Where the weights come from. Thread-safe for concurrent reads.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // The resolved config: layer override applied, weight/kv dtype from the ModelSpec,
  // weights_id set for checkpoints.
  const ModelConfig& config() const { return config_; }
  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  virtual bool is_dummy() const = 0;
  // Element type the tensor is stored in: config().weight_dtype for dummy weights, the file's
  // dtype for a checkpoint.
  virtual DType stored_dtype(const TensorSpec& t) const = 0;
  // Writes t.numel() elements of `dtype` to dst (caller-owned, numel * DTypeSize(dtype)
  // bytes), converted exactly through fp32 from the stored value. Reading a checkpoint in
  // its stored dtype or dummy weights in weight_dtype copies bits unchanged.
  virtual Status Read(const TensorSpec& t, DType dtype, void* dst) const = 0;
  // Conveniences over Read.
  Status ReadF32(const TensorSpec& t, std::vector<float>* out) const;
  Status ReadRaw(const TensorSpec& t, std::vector<std::byte>* out, DType* dtype) const;

 protected:
  ModelConfig config_;
  std::vector<TensorSpec> tensors_;
};

// spec.model is a preset name (dummy weights from spec.seed) or a checkpoint directory
// (config.json + *.safetensors; every tensor of ModelTensors() is checked to exist with the
// right shape at open, so a bad checkpoint fails here with the tensor named).
// spec.num_layers_override > the model's layers is kInvalidArgument.
Result<std::unique_ptr<WeightSource>> OpenWeights(const ModelSpec& spec);

// Dummy weights for an explicit config (tests, custom shapes); config.seed seeds them.
Result<std::unique_ptr<WeightSource>> DummyWeightsFor(const ModelConfig& config);

// Writes an HF-format checkpoint directory (config.json with torch_dtype = dtype, and one
// model.safetensors) holding src's tensors converted to dtype. Creates dir if needed.
Status WriteHfCheckpoint(const WeightSource& src, DType dtype, const std::string& dir);

}  // namespace kvstream::model
