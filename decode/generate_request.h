// The checks a Generate request passes before it takes any resource: pure (no I/O, no server
// state), so they are unit-tested and fuzzed on their own (tests/decode, tests/fuzz).
#pragma once

#include "common/status.h"
#include "model/sampling.h"
#include "proto/kvstream.pb.h"

namespace kvstream::decode {

struct GenerateLimits {
  int vocab_size = 0;
  int max_position = 0;  // prompt + generated tokens, at most
  int block_size = 1;    // tokens per KV block
  int pool_blocks = 0;   // KV blocks of the whole pool
};

// OK when the request can be served within `limits`, with *blocks_needed (when given) the KV
// blocks its prompt and max_tokens take. Else kInvalidArgument whose message names what is wrong:
// an empty prompt, max_tokens < 1, a token outside [0, vocab_size), prompt + max_tokens over
// max_position, more blocks than the pool has, sampling parameters that
// model::ValidateSamplingParams refuses, or a cache_salt over kMaxCacheSaltBytes.
inline constexpr size_t kMaxCacheSaltBytes = 256;
Status CheckGenerateRequest(const kvstream::v1::GenerateRequest& req, const GenerateLimits& limits,
                            int* blocks_needed = nullptr);

// The request's sampling as the model takes it (no `sampling`: greedy); `seed_if_unset` is the
// seed when the request gives none.
model::SamplingParams SamplingFromRequest(const kvstream::v1::GenerateRequest& req,
                                          uint64_t seed_if_unset);

}  // namespace kvstream::decode
