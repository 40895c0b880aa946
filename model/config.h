// ModelConfig: the shape of a Llama-family decoder, from a preset or an HF config.json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace kvstream::model {

// Rotary embedding settings beyond rope_theta, as transformers resolves them from config.json
// (rope_parameters / rope_scaling; docs/models.md). The frequencies themselves come from
// RopeFrequencies() in model/rope.h, shared by every backend.
struct RopeScaling {
  std::string type = "default";  // default, linear, dynamic, llama3 or yarn
  double factor = 1.0;           // linear, dynamic, llama3, yarn
  // llama3 and yarn: original_max_position_embeddings; dynamic: max_position_embeddings (the
  // length past which NTK rescales the base).
  int original_max_position = 0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  double beta_fast = 32.0, beta_slow = 1.0;              // yarn
  bool truncate = true;                                  // yarn
  // yarn: multiplies cos and sin (resolved from attention_factor, or mscale / mscale_all_dim,
  // or 0.1 ln(factor) + 1). 1 for the other types.
  double attention_factor = 1.0;
};

struct ModelConfig {
  std::string name;            // preset name or checkpoint directory
  std::string family = "llama";// "llama", "qwen2" or "mistral"
  int num_layers = 0;
  int hidden_size = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int intermediate_size = 0;
  int vocab_size = 0;
  float rope_theta = 10000.f;
  RopeScaling rope;
  float rms_eps = 1e-5f;
  bool qkv_bias = false;          // Qwen2 has biases on q/k/v projections
  bool tie_word_embeddings = false;
  int max_position = 32768;     // longest sequence (prompt + generated) the backends accept
  // Mistral/Qwen2 sliding-window attention: 0 = none. Not implemented, so Validate() requires
  // max_position <= sliding_window (the window then never drops a token).
  int sliding_window = 0;
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
// Parses a Hugging Face config.json (LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM).
// Rotary settings follow transformers' precedence: a non-empty rope_scaling replaces
// rope_parameters; rope_theta inside that dict wins over the top-level rope_theta (default
// 10000). weight_dtype comes from dtype (or torch_dtype); kv_dtype, seed and weights_id keep
// their defaults. A key that changes the math and is not implemented (an unknown rope type or
// rope key, partial_rotary_factor != 1, attention/mlp bias on Llama, another activation,
// quantization, a sliding window the context could exceed, ...) is an error naming the key,
// never a silent default. max_position_override > 0 replaces max_position_embeddings before
// validation (so a window can be honoured by capping the context).
Result<ModelConfig> ConfigFromHfJson(const std::string& json_text, int max_position_override = 0);
// One line saying what a config means: architecture, shapes, rope type and parameters, tied
// embeddings, dtype, context limit.
std::string DescribeConfig(const ModelConfig& config);
// The inverse, for writing checkpoints: a config.json that ConfigFromHfJson reads back.
std::string ConfigToHfJson(const ModelConfig& config);

}  // namespace kvstream::model
