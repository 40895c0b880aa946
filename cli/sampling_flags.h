// The sampling flags every generating subcommand reads alike (local and remote generate,
// bench ttft, bench itl): --temperature --top-k --top-p --min-p --sample-seed --logprobs
// --ignore-eos. Defaults are greedy, as without them.
#pragma once

#include <nlohmann/json.hpp>

#include "cli/flags.h"
#include "model/sampling.h"

#if KVSTREAM_CLI_HAVE_DAEMONS
#include "proto/kvstream.pb.h"
#endif

namespace kvstream::cli {

std::vector<FlagSpec> SamplingFlagSpecs();

struct SamplingFlags {
  model::SamplingParams params;  // checked with model::ValidateSamplingParams
  bool seed_given = false;       // --sample-seed given (else params.seed = 0 locally; a daemon picks)
  bool ignore_eos = false;
};
Result<SamplingFlags> SamplingFromFlags(const Flags& flags);

// {"token": t, "logprob": x, "top": [[id, logprob], ...]}
nlohmann::ordered_json LogprobsJson(int32_t token, const model::TokenLogprobs& lp);

#if KVSTREAM_CLI_HAVE_DAEMONS
// Sets req's sampling (when not greedy or logprobs are asked) and ignore_eos.
void SetRequestSampling(const SamplingFlags& s, kvstream::v1::GenerateRequest* req);
// The logprobs a response carries (empty top when none).
model::TokenLogprobs ResponseLogprobs(const kvstream::v1::GenerateResponse& msg);
#endif

}  // namespace kvstream::cli
