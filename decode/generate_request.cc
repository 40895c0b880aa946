#include "decode/generate_request.h"

#include <string>

#include "model/kv_cache.h"

namespace kvstream::decode {

Status CheckGenerateRequest(const kvstream::v1::GenerateRequest& req, const GenerateLimits& limits,
                            int* blocks_needed) {
  const int n = req.prompt_tokens_size();
  const int vocab = limits.vocab_size;
  if (n == 0) return InvalidArgument("prompt_tokens is empty");
  if (req.max_tokens() < 1) return InvalidArgument("max_tokens must be >= 1");
  for (int32_t t : req.prompt_tokens())
    if (t < 0 || t >= vocab)
      return InvalidArgument("token id " + std::to_string(t) + " outside the vocabulary [0, " +
                             std::to_string(vocab) + ")");
  // In 64 bits: max_tokens near 2^31 must not wrap into a small (or negative) total.
  const int64_t total_tokens = int64_t(n) + int64_t(req.max_tokens());
  if (total_tokens > limits.max_position)
    return InvalidArgument("prompt + max_tokens = " + std::to_string(total_tokens) +
                           " exceeds the model's max_position " +
                           std::to_string(limits.max_position));
  const int need = model::BlocksForTokens(static_cast<int>(total_tokens), limits.block_size);
  if (need > limits.pool_blocks)
    return InvalidArgument("request needs " + std::to_string(need) + " KV blocks, the pool has " +
                           std::to_string(limits.pool_blocks));
  KV_RETURN_IF_ERROR(model::ValidateSamplingParams(SamplingFromRequest(req, 0)));
  if (req.cache_salt().size() > kMaxCacheSaltBytes)
    return InvalidArgument("cache_salt holds " + std::to_string(req.cache_salt().size()) +
                           " bytes, at most " + std::to_string(kMaxCacheSaltBytes));
  if (blocks_needed) *blocks_needed = need;
  return OkStatus();
}

model::SamplingParams SamplingFromRequest(const kvstream::v1::GenerateRequest& req,
                                          uint64_t seed_if_unset) {
  model::SamplingParams p;
  if (!req.has_sampling()) return p;
  const kvstream::v1::SamplingParams& s = req.sampling();
  p.temperature = s.temperature();
  p.top_k = s.top_k();
  p.top_p = s.has_top_p() ? s.top_p() : 1.0f;
  p.min_p = s.min_p();
  p.seed = s.has_seed() ? s.seed() : seed_if_unset;
  p.logprobs = s.logprobs();
  p.top_logprobs = s.top_logprobs();
  return p;
}

}  // namespace kvstream::decode
