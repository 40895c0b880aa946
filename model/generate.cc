#include "model/generate.h"

#include <algorithm>

#include "common/time.h"

namespace kvstream::model {

namespace {
bool IsStop(const GenerateOptions& o, int32_t token) {
  return (o.stop_token && token == *o.stop_token) ||
         std::find(o.stop_tokens.begin(), o.stop_tokens.end(), token) != o.stop_tokens.end();
}
void Record(GenerateResult& r, const ForwardOutput& out, size_t k) {
  r.tokens.push_back(out.next_tokens[k]);
  if (!out.logprobs.empty()) r.logprobs.push_back(out.logprobs[k]);
}
}  // namespace

Result<GenerateResult> Generate(ModelBackend& backend, KvPool& pool,
                                std::span<const int32_t> prompt, const GenerateOptions& options) {
  KV_ASSIGN_OR_RETURN(auto all, GenerateBatch(backend, pool,
                                              {std::vector<int32_t>(prompt.begin(), prompt.end())},
                                              options));
  return std::move(all[0]);
}

Result<std::vector<GenerateResult>> GenerateBatch(ModelBackend& backend, KvPool& pool,
                                                  const std::vector<std::vector<int32_t>>& prompts,
                                                  const GenerateOptions& options) {
  const auto start = Clock::now();
  if (prompts.empty()) return InvalidArgument("Generate: no prompts");
  if (options.max_new_tokens < 1) return InvalidArgument("Generate: max_new_tokens must be >= 1");
  KV_RETURN_IF_ERROR(ValidateSamplingParams(options.sampling));
  for (const auto& p : prompts)
    if (p.empty()) return InvalidArgument("Generate: empty prompt");
  const int bs = pool.layout().block_size;
  const size_t n = prompts.size();
  std::vector<BlockLease> leases;
  for (size_t i = 0; i < n; ++i) {
    leases.emplace_back(&pool.allocator(), std::vector<int32_t>{});
    KV_RETURN_IF_ERROR(leases[i].GrowToTokens(static_cast<int>(prompts[i].size()), bs));
  }
  std::vector<GenerateResult> results(n);
  ForwardOutput out;
  std::vector<SeqSampling> sampling;
  ForwardOptions fo;
  {
    std::vector<SeqInput> batch(n);
    for (size_t i = 0; i < n; ++i) batch[i] = SeqInput{prompts[i], 0, leases[i].ids()};
    sampling.assign(n, SeqSampling{options.sampling, 0});
    fo.sampling = sampling;
    const auto t0 = Clock::now();
    KV_RETURN_IF_ERROR(backend.Forward(pool, batch, options.hooks, fo, &out));
    const double prefill = SecondsSince(t0), ttft = SecondsSince(start);
    for (size_t i = 0; i < n; ++i) {
      results[i].prefill_seconds = prefill;
      results[i].ttft_seconds = ttft;
      Record(results[i], out, i);
      results[i].stopped = IsStop(options, out.next_tokens[i]);
    }
  }
  std::vector<int32_t> feed(n);
  for (;;) {
    std::vector<size_t> active;
    for (size_t i = 0; i < n; ++i)
      if (!results[i].stopped && int(results[i].tokens.size()) < options.max_new_tokens)
        active.push_back(i);
    if (active.empty()) break;
    std::vector<SeqInput> batch;
    sampling.clear();
    for (size_t i : active) {
      const int pos = static_cast<int>(prompts[i].size() + results[i].tokens.size()) - 1;
      KV_RETURN_IF_ERROR(leases[i].GrowToTokens(pos + 1, bs));
      feed[i] = results[i].tokens.back();
      batch.push_back(SeqInput{std::span<const int32_t>(&feed[i], 1), pos, leases[i].ids()});
      sampling.push_back(SeqSampling{options.sampling, results[i].tokens.size()});
    }
    fo.sampling = sampling;
    const auto t0 = Clock::now();
    KV_RETURN_IF_ERROR(backend.Forward(pool, batch, options.hooks, fo, &out));
    const double dt = SecondsSince(t0);
    for (size_t k = 0; k < active.size(); ++k) {
      GenerateResult& r = results[active[k]];
      Record(r, out, k);
      r.decode_seconds.push_back(dt);
      if (IsStop(options, out.next_tokens[k])) r.stopped = true;
    }
  }
  const double total = SecondsSince(start);
  for (auto& r : results) r.total_seconds = total;
  return results;
}

}  // namespace kvstream::model
