#include "model/cuda/cuda_sampler.h"

#include <string>

#include "common/sampling_math.h"
#include "kernels/layer_ops.h"

namespace kvstream::model {

namespace {
Status Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return OkStatus();
  if (e == cudaErrorMemoryAllocation)
    return ResourceExhausted(std::string(what) + ": " + cudaGetErrorString(e));
  return Internal(std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
                  ")");
}
}  // namespace

CudaSampler::~CudaSampler() { Free(); }

void CudaSampler::Free() {
  if (h_params_) cudaFreeHost(h_params_);
  if (d_params_) cudaFree(d_params_);
  if (h_logprobs_) cudaFreeHost(h_logprobs_);
  if (d_logprobs_) cudaFree(d_logprobs_);
  h_params_ = nullptr;
  d_params_ = nullptr;
  h_logprobs_ = nullptr;
  d_logprobs_ = nullptr;
  cap_ = 0;
}

Status CudaSampler::Reserve(int rows) {
  if (rows <= cap_) return OkStatus();
  Free();
  const size_t np = size_t(rows) * sizeof(kernels::SampleParams);
  const size_t nl = size_t(rows) * sizeof(kernels::SampleLogprobs);
  KV_RETURN_IF_ERROR(Check(cudaMallocHost(reinterpret_cast<void**>(&h_params_), np), "sampler"));
  KV_RETURN_IF_ERROR(Check(cudaMalloc(reinterpret_cast<void**>(&d_params_), np), "sampler"));
  KV_RETURN_IF_ERROR(Check(cudaMallocHost(reinterpret_cast<void**>(&h_logprobs_), nl), "sampler"));
  KV_RETURN_IF_ERROR(Check(cudaMalloc(reinterpret_cast<void**>(&d_logprobs_), nl), "sampler"));
  cap_ = rows;
  return OkStatus();
}

Status CudaSampler::Enqueue(const float* logits, int rows, int vocab,
                            std::span<const SeqSampling> sampling, int32_t* d_tokens,
                            int32_t* h_tokens, cudaStream_t stream) {
  if (sampling.size() != size_t(rows)) return InvalidArgument("sampler: one entry per row");
  KV_RETURN_IF_ERROR(Reserve(rows));
  vocab_ = vocab;
  bool any_logprobs = false;
  for (int r = 0; r < rows; ++r) {
    const SamplingParams& p = sampling[r].params;
    kernels::SampleParams& k = h_params_[r];
    k = kernels::SampleParams{};
    if (!p.greedy()) {
      k.inv_temperature = InvTemperature(p.temperature);
      k.top_p = p.top_p;
      k.top_k = p.top_k;
      k.min_weight = p.min_p > 0 ? sampling::MinPWeight(p.min_p) : 0;
      k.seed = p.seed;
      k.token_index = sampling[r].token_index;
    }
    k.top_logprobs = p.wants_logprobs() ? p.top_logprobs : -1;
    any_logprobs = any_logprobs || p.wants_logprobs();
  }
  // Uploaded by the SMs, not the copy engine (kernels::CopyWords: not behind a tier's prefetch).
  static_assert(sizeof(kernels::SampleParams) % 4 == 0);
  void* h_mapped = nullptr;
  KV_RETURN_IF_ERROR(
      Check(cudaHostGetDevicePointer(&h_mapped, h_params_, 0), "sampler: parameters"));
  KV_RETURN_IF_ERROR(Check(kernels::CopyWords(reinterpret_cast<int32_t*>(d_params_),
                                              static_cast<const int32_t*>(h_mapped),
                                              size_t(rows) * sizeof(kernels::SampleParams) / 4,
                                              stream),
                           "sampler: parameters"));
  KV_RETURN_IF_ERROR(Check(kernels::SampleRows(d_tokens, any_logprobs ? d_logprobs_ : nullptr,
                                               logits, d_params_, rows, vocab, stream),
                           "kernels::SampleRows"));
  KV_RETURN_IF_ERROR(Check(cudaMemcpyAsync(h_tokens, d_tokens, size_t(rows) * sizeof(int32_t),
                                           cudaMemcpyDeviceToHost, stream),
                           "sampler: tokens"));
  if (any_logprobs) {
    KV_RETURN_IF_ERROR(Check(cudaMemcpyAsync(h_logprobs_, d_logprobs_,
                                             size_t(rows) * sizeof(kernels::SampleLogprobs),
                                             cudaMemcpyDeviceToHost, stream),
                             "sampler: log-probabilities"));
  }
  return OkStatus();
}

void CudaSampler::Collect(std::span<const SeqSampling> sampling,
                          std::vector<TokenLogprobs>* out) const {
  out->clear();
  bool any = false;
  for (const SeqSampling& s : sampling) any = any || s.params.wants_logprobs();
  if (!any) return;
  out->resize(sampling.size());
  for (size_t r = 0; r < sampling.size(); ++r) {
    const SamplingParams& p = sampling[r].params;
    if (!p.wants_logprobs()) continue;
    const kernels::SampleLogprobs& k = h_logprobs_[r];
    (*out)[r].logprob = k.logprob;
    for (int j = 0; j < p.top_logprobs && j < kernels::kSampleMaxTop && j < vocab_; ++j)
      (*out)[r].top.push_back({k.top_ids[j], k.top_logprobs[j]});
  }
}

}  // namespace kvstream::model
