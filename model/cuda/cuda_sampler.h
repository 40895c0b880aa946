// The CUDA backend's sampling step: kernels::SampleRows over the logits already on the GPU,
// with its staging (the rows' parameters uploaded; tokens and, when asked, log-probabilities
// copied back). Used under the backend's Forward lock (not thread-safe on its own).
#pragma once

#include <cuda_runtime_api.h>

#include <span>
#include <vector>

#include "common/status.h"
#include "kernels/sampling.h"
#include "model/sampling.h"

namespace kvstream::model {

class CudaSampler {
 public:
  CudaSampler() = default;
  CudaSampler(const CudaSampler&) = delete;
  CudaSampler& operator=(const CudaSampler&) = delete;
  ~CudaSampler();

  // Enqueues on `stream`: the parameters of sampling[r] for row r (sampling.size() == rows),
  // the sampling of logits [rows][vocab] into d_tokens [rows], the copy of the tokens into
  // h_tokens (pinned host memory, [rows]) and of the log-probabilities into this sampler's
  // staging. No other sampler work may be in flight (the backend synchronises every Forward).
  Status Enqueue(const float* logits, int rows, int vocab, std::span<const SeqSampling> sampling,
                 int32_t* d_tokens, int32_t* h_tokens, cudaStream_t stream);
  // Once `stream` has reached the end of Enqueue's work: *out as model::SampleRows gives it.
  void Collect(std::span<const SeqSampling> sampling, std::vector<TokenLogprobs>* out) const;

 private:
  Status Reserve(int rows);
  void Free();

  int cap_ = 0;
  int vocab_ = 0;  // of the last Enqueue
  kernels::SampleParams* h_params_ = nullptr;  // pinned
  kernels::SampleParams* d_params_ = nullptr;
  kernels::SampleLogprobs* h_logprobs_ = nullptr;  // pinned
  kernels::SampleLogprobs* d_logprobs_ = nullptr;
};

}  // namespace kvstream::model
