// ModelConfig: the shape of a Llama-family decoder, from a preset or an HF config.json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace kvstream::model {

struct ModelConfig {
  std::string name;            // preset name or checkpoint directory
  std::string family = "llama";// "llama" or "qwen2"
  int num_layers = 0;
  int hidden_size = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int intermediate_size = 0;
  int vocab_size = 0;
  float rope_theta = 10000.f;
  float rms_eps = 1e-5f;
  bool qkv_bias = false;          // Qwen2 has biases on q/k/v projections
  bool tie_word_embeddings = false;
  int max_position = 32768;
  DType weight_dtype = DType::kF16;  // storage dtype of weights on the backend
  DType kv_dtype = DType::kF16;      // element type of the paged KV cache
  uint64_t seed = 0;                 // dummy-weight seed; meaningless for checkpoints
  // Identity of checkpoint weights (a hash of the safetensors headers); 0 for dummy weights.
  uint64_t weights_id = 0;

  int group_size() const { return num_heads / num_kv_heads; }
  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }
  // Bytes of K and V of one token over all layers, in kv_dtype.
  uint64_t kv_bytes_per_token() const {
    return 2ull * num_layers * num_kv_heads * head_dim * DTypeSize(kv_dtype);
  }
  uint64_t num_parameters() const;
  // Bytes of weights one decode step reads (weight_dtype): every parameter but the input
  // embedding, of which only the new tokens' rows are read (with tied embeddings the same
  // matrix is still read whole as the LM head).
  uint64_t decode_step_weight_bytes() const;
  // Stable 64-bit hash of every field that changes the numbers a forward pass produces
  // (shapes, rope, eps, dtypes, seed or checkpoint identity). Compared at handshake.
  uint64_t hash() const;
  Status Validate() const;
};

// Names: tiny, llama-2-7b, llama-3-8b, qwen2.5-7b.
std::vector<std::string> PresetNames();
Result<ModelConfig> PresetConfig(const std::string& name, uint64_t seed = 0);
// Parses a Hugging Face config.json (LlamaForCausalLM / Qwen2ForCausalLM).
// weight_dtype comes from torch_dtype; kv_dtype, seed and weights_id keep their defaults.
// Unsupported features (rope_scaling, attention/mlp bias on Llama, other activations) are
// refused with kNotSupported rather than silently ignored.
Result<ModelConfig> ConfigFromHfJson(const std::string& json_text);
// The inverse, for writing checkpoints: a config.json that ConfigFromHfJson reads back.
std::string ConfigToHfJson(const ModelConfig& config);

}  // namespace kvstream::model
