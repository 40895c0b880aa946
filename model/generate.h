// Colocated generation: prefill then decode in one process, on any ModelBackend (greedy by
// default, or sampled: model/sampling.h). The reference every disaggregated path is compared
// against: the token of index i is drawn with (options.sampling.seed, i), whatever the batch.
//
// Blocks come from pool.allocator() through a BlockLease, grown before each step; they are
// released when the call returns, however it ends (done, error, pool exhausted, hook error).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "common/status.h"
#include "model/backend.h"

namespace kvstream::model {

struct GenerateOptions {
  int max_new_tokens = 16;              // >= 1
  std::optional<int32_t> stop_token;    // generation ends after producing it (it is returned)
  std::vector<int32_t> stop_tokens = {};  // more such tokens (e.g. generation_config.json's eos)
  SamplingParams sampling = {};         // checked with ValidateSamplingParams; greedy by default
  LayerHooks* hooks = nullptr;          // passed to every Forward
};

struct GenerateResult {
  std::vector<int32_t> tokens;          // generated tokens, prompt excluded
  double prefill_seconds = 0;           // the prompt's Forward (which yields the first token)
  double ttft_seconds = 0;              // call start to first token: allocation + prefill
  std::vector<double> decode_seconds;   // one per token after the first
  double total_seconds = 0;
  bool stopped = false;                 // ended on a stop token
  std::vector<TokenLogprobs> logprobs;  // one per token when sampling asks for them
};

Result<GenerateResult> Generate(ModelBackend& backend, KvPool& pool,
                                std::span<const int32_t> prompt, const GenerateOptions& options);

// Several requests together: one Forward prefills every prompt, then each decode step runs one
// Forward over the requests still generating. Results are identical to Generate() per request
// on backends whose results do not depend on batch composition (the CPU backend). Timings are
// the shared step times.
Result<std::vector<GenerateResult>> GenerateBatch(ModelBackend& backend, KvPool& pool,
                                                  const std::vector<std::vector<int32_t>>& prompts,
                                                  const GenerateOptions& options);

}  // namespace kvstream::model
