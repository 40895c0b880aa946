// Token sampling on the GPU: one launch picks the token of every row of a logits batch, greedy
// or sampled, by the definition of model/sampling.h and with the arithmetic of
// common/sampling_math.h, so that from the same logits it gives exactly the CPU reference's
// token. A row is taken by one thread block, or on Hopper and later (large vocabularies) by a
// cluster of four that split it and combine their figures exactly; top-k, top-p and the top-N
// log-probabilities are thresholds found by radix select over the logits' 32-bit order keys
// (no sort of the vocabulary); the draw is an exact integer prefix sum. Launches only (no synchronisation, no allocation);
// cudaErrorInvalidValue for bad shapes, else the launch error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvstream::kernels {

inline constexpr int kSampleMaxTop = 20;

// Per row, in device memory.
struct SampleParams {
  float inv_temperature = 0;  // 0: greedy (argmax, lowest index on ties, NaN never wins)
  float top_p = 1;            // (0, 1]; 1: off
  int32_t top_k = 0;          // 0 or >= vocab: off
  int32_t top_logprobs = -1;  // -1: no log-probabilities; else [0, kSampleMaxTop]
  uint64_t min_weight = 0;    // sampling::MinPWeight(min_p); 0: off
  uint64_t seed = 0;
  uint64_t token_index = 0;
};

// Per row, written when params.top_logprobs >= 0: log_softmax (float) of the chosen token and
// of the top_logprobs largest logits (descending, lowest index first on ties).
struct SampleLogprobs {
  float logprob;
  int32_t top_ids[kSampleMaxTop];
  float top_logprobs[kSampleMaxTop];
};

// kAuto: the cluster where the device has clusters (unless KVSTREAM_KERNEL_FALLBACK is set);
// kOneBlock: one block per row everywhere (the path of GPUs before Hopper; tests run it on
// Hopper too).
enum class SamplePath { kAuto, kOneBlock };

//   tokens:   [rows] int32 out
//   logprobs: [rows] out, or null (then no row may ask for log-probabilities)
//   logits:   [rows][vocab] f32
//   params:   [rows]
cudaError_t SampleRows(int32_t* tokens, SampleLogprobs* logprobs, const float* logits,
                       const SampleParams* params, int rows, int vocab, cudaStream_t stream,
                       SamplePath path = SamplePath::kAuto);

}  // namespace kvstream::kernels
