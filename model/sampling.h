// Token sampling: the parameters of a request, their checks, and the CPU reference of the
// math every backend implements (the CUDA backend bit for bit: common/sampling_math.h).
//
// The token of one logits row z (vocab V), given SamplingParams p and the token's index in
// its request (0 for the first generated token):
//  - p.temperature == 0 (the default): greedy, argmax z (lowest index on ties, NaN never wins).
//  - Otherwise, with max m = max z (a non-finite m falls back to greedy):
//      weight w_i = SampleWeight(z_i, m, 1 / max(T, kMinTemperature)) (fixed-point exp);
//      top-k (0 < k < V): keep z_i >= the k-th largest logit (ties at the threshold kept);
//      top-p (< 1): of what top-k kept, keep z_i >= the largest threshold whose kept weight
//        reaches top_p times the kept total (ties kept);
//      min-p (> 0): keep w_i >= ceil(min_p * w_max) (w_max = 2^31, the max's weight);
//      draw: u = PhiloxUniform24(seed, index); the first kept i (in index order) whose running
//        weight exceeds DrawPoint(total kept weight, u).
//    So the token is a pure function of (logits, params, index): never of the batch, the
//    timing or the process.
//  - Log-probabilities (when asked) are those of the model's distribution, log_softmax(z) at
//    temperature 1 before any filtering: of the chosen token, and of the top_logprobs most
//    likely tokens (descending, lowest index first on ties).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"

namespace kvstream::model {

inline constexpr int kMaxTopLogprobs = 20;
inline constexpr float kMaxTemperature = 1000.0f;
inline constexpr float kMinTemperature = 1e-6f;  // smaller positive temperatures act as this

struct SamplingParams {
  float temperature = 0;  // 0: greedy; else (0, kMaxTemperature]
  int top_k = 0;          // 0: off
  float top_p = 1;        // (0, 1]; 1: off
  float min_p = 0;        // [0, 1]; 0: off
  uint64_t seed = 0;
  bool logprobs = false;  // the chosen token's log-probability
  int top_logprobs = 0;   // also the N most likely tokens' [0, kMaxTopLogprobs]; implies logprobs
  bool greedy() const { return temperature == 0; }
  bool wants_logprobs() const { return logprobs || top_logprobs > 0; }
};

// kInvalidArgument naming the parameter: NaN or infinite values, temperature < 0 or above
// kMaxTemperature, top_k < 0, top_p outside (0, 1], min_p outside [0, 1], top_logprobs outside
// [0, kMaxTopLogprobs].
Status ValidateSamplingParams(const SamplingParams& p);

// 1 / max(temperature, kMinTemperature), rounded once (the value every backend uses).
float InvTemperature(float temperature);

// The sampling of one sequence of a batch.
struct SeqSampling {
  SamplingParams params;
  uint64_t token_index = 0;  // the token's index in its request (the draw's counter)
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
};
struct TokenLogprobs {
  float logprob = 0;               // of the chosen token
  std::vector<TokenLogprob> top;   // top_logprobs entries
};

// The reference sampler of one row (logits.size() = vocab >= 1).
int32_t SampleRow(std::span<const float> logits, const SamplingParams& p, uint64_t token_index);
// log_softmax of the chosen token and the top `top_n` (computed in double).
TokenLogprobs LogprobsRow(std::span<const float> logits, int32_t chosen, int top_n);

// Tokens of a batch of rows [rows][vocab]: tokens[r] = SampleRow(row r, sampling[r]) (greedy for
// every row when `sampling` is empty, else sampling.size() == rows). *logprobs is resized to
// `rows` (filled where asked) when any row asks for log-probabilities, else cleared.
void SampleRows(const float* logits, int rows, int vocab, std::span<const SeqSampling> sampling,
                std::vector<int32_t>* tokens, std::vector<TokenLogprobs>* logprobs);

// True when some entry needs more than the greedy token (a draw or log-probabilities).
bool NeedsSampling(std::span<const SeqSampling> sampling);

}  // namespace kvstream::model
