// ModelBackend: runs the decoder's forward pass over a batch of sequences whose KV lives in a
// paged KvPool. Implementations: the CPU reference (model/cpu_backend.h) and the CUDA backend
// (model/cuda/cuda_backend.h).
//
// Contract of Forward():
//  - For each sequence, its new tokens occupy positions [start_pos, start_pos + n) and their K/V
//    are written into the pool through its block table (which must cover start_pos + n tokens)
//    before any attention reads them; attention for every position reads K/V from the pool
//    only. So computing a prompt in one call or in two (n-1 tokens, then 1) gives identical
//    KV and identical logits on the CPU backend. The one exception is dynamic NTK rope past its
//    threshold: as in transformers, a forward's tokens are rotated with the frequencies of the
//    sequence's extent in that forward (model/rope.h), so splitting a prompt there changes them.
//  - hooks->BeforeAttention(l) is called before layer l's attention reads the pool (decode's
//    wait_for_layer); hooks->AfterLayer(l) once layer l's KV of every sequence is written
//    (prefill's save_layer). On the CUDA backend `stream` is the cudaStream_t the work was
//    enqueued on: the KV is complete once that stream reaches this point.
//    The CPU backend calls BeforeAttention(l) before writing layer l's new K/V (blocks landing
//    from a peer may cover the new tokens' slots and must not overwrite them) and
//    AfterLayer(l) right after writing them (model/cpu_backend.h).
//  - A hook's error aborts the forward and is returned as is.
//  - out->next_tokens gets each sequence's token for its last position: greedy (argmax) when
//    options.sampling is empty, else drawn by options.sampling[s] exactly as
//    model/sampling.h's SampleRows defines (a pure function of the logits, the parameters and
//    the token index); out->logprobs as SampleRows gives them; out->logits (if want_logits)
//    gets batch * vocab floats.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "model/sampling.h"

namespace kvstream::model {

struct SeqInput {
  std::span<const int32_t> tokens;      // new tokens, at least one
  int32_t start_pos = 0;                // tokens already in the cache
  std::span<const int32_t> block_table; // covers start_pos + tokens.size() tokens
};

class LayerHooks {
 public:
  virtual ~LayerHooks() = default;
  virtual Status BeforeAttention(int layer, void* stream) { return OkStatus(); }
  virtual Status AfterLayer(int layer, void* stream) { return OkStatus(); }
};

struct ForwardOutput {
  std::vector<int32_t> next_tokens;  // one per sequence
  std::vector<float> logits;         // batch * vocab, if requested
  std::vector<TokenLogprobs> logprobs;  // one per sequence when any asked (sampling.h), else empty
};

struct ForwardOptions {
  bool want_logits = false;
  // Skip the LM head (prefill-only work: no logits are needed).
  bool skip_lm_head = false;
  // Empty: greedy for every sequence. Else one per sequence of the batch.
  std::span<const SeqSampling> sampling = {};
};

class ModelBackend {
 public:
  virtual ~ModelBackend() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda:0"
  virtual const ModelConfig& config() const = 0;
  KvLayout kv_layout(int block_size) const {
    const ModelConfig& c = config();
    return KvLayout{c.num_layers, c.num_kv_heads, c.head_dim, block_size, c.kv_dtype};
  }
  // A pool in this backend's memory (host for CPU, device for CUDA).
  virtual Result<std::unique_ptr<KvPool>> CreatePool(int num_blocks, int block_size) = 0;
  virtual Status Forward(KvPool& pool, std::span<const SeqInput> batch, LayerHooks* hooks,
                         const ForwardOptions& options, ForwardOutput* out) = 0;
};

struct BackendOptions {
  std::string kind = "cpu";   // "cpu" or "cuda"
  int device = 0;             // CUDA device ordinal
  int num_threads = 0;        // CPU: 0 = hardware concurrency
};

// Model source: a preset name ("tiny", "llama-3-8b", ...) or a path to an HF checkpoint dir.
struct ModelSpec {
  std::string model = "tiny";
  uint64_t seed = 0;
  int num_layers_override = 0;  // >0: keep only the first N layers (tests, small machines)
  // >0: the longest sequence (prompt + generated) the backend accepts, replacing the
  // preset's or config.json's max_position_embeddings (RoPE itself has no limit; a real
  // checkpoint may degrade past the length it was trained for).
  int max_position_override = 0;
  DType weight_dtype = DType::kF16;
  DType kv_dtype = DType::kF16;
};

// Loads the config and weights (preset dummy weights or checkpoint) onto the backend.
Result<std::unique_ptr<ModelBackend>> CreateBackend(const ModelSpec& spec,
                                                    const BackendOptions& options);

}  // namespace kvstream::model
