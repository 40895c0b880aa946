#include "cli/sampling_flags.h"

#include <cmath>

namespace kvstream::cli {

std::vector<FlagSpec> SamplingFlagSpecs() {
  return {
      {"temperature", true, "sampling temperature; 0 = greedy", "0"},
      {"top-k", true, "keep the k most likely tokens; 0 = off", "0"},
      {"top-p", true, "keep the smallest most likely set of this probability mass; 1 = off", "1"},
      {"min-p", true, "keep tokens at least this fraction as likely as the most likely; 0 = off",
       "0"},
      {"sample-seed", true, "seed of the draws (same seed, same tokens); default: 0 locally, "
                            "chosen by the daemon remotely", ""},
      {"logprobs", true, "report each token's log-probability and the N most likely (0..20)", ""},
      {"ignore-eos", false, "do not stop at the checkpoint's end-of-sequence ids", ""},
  };
}

namespace {
Result<float> GetFloat(const Flags& f, const std::string& name) {
  const std::string v = f.Get(name);
  try {
    size_t used = 0;
    const float x = std::stof(v, &used);
    if (used != v.size() || !std::isfinite(x)) throw std::invalid_argument(v);
    return x;
  } catch (const std::exception&) {
    return InvalidArgument("--" + name + " must be a number, got '" + v + "'");
  }
}
}  // namespace

Result<SamplingFlags> SamplingFromFlags(const Flags& flags) {
  SamplingFlags s;
  KV_ASSIGN_OR_RETURN(s.params.temperature, GetFloat(flags, "temperature"));
  KV_ASSIGN_OR_RETURN(const int64_t k, flags.GetInt("top-k", 0, INT32_MAX));
  s.params.top_k = int(k);
  KV_ASSIGN_OR_RETURN(s.params.top_p, GetFloat(flags, "top-p"));
  KV_ASSIGN_OR_RETURN(s.params.min_p, GetFloat(flags, "min-p"));
  if (flags.Has("sample-seed")) {
    KV_ASSIGN_OR_RETURN(const int64_t seed, flags.GetInt("sample-seed", 0, INT64_MAX));
    s.params.seed = uint64_t(seed);
    s.seed_given = true;
  }
  if (flags.Has("logprobs")) {
    KV_ASSIGN_OR_RETURN(const int64_t n, flags.GetInt("logprobs", 0, model::kMaxTopLogprobs));
    s.params.logprobs = true;
    s.params.top_logprobs = int(n);
  }
  s.ignore_eos = flags.Has("ignore-eos");
  KV_RETURN_IF_ERROR(model::ValidateSamplingParams(s.params));
  return s;
}

nlohmann::ordered_json LogprobsJson(int32_t token, const model::TokenLogprobs& lp) {
  nlohmann::ordered_json j;
  j["token"] = token;
  j["logprob"] = lp.logprob;
  nlohmann::ordered_json top = nlohmann::ordered_json::array();
  for (const auto& t : lp.top) top.push_back({t.token, t.logprob});
  j["top"] = top;
  return j;
}

#if KVSTREAM_CLI_HAVE_DAEMONS
void SetRequestSampling(const SamplingFlags& s, kvstream::v1::GenerateRequest* req) {
  req->set_ignore_eos(s.ignore_eos);
  const model::SamplingParams& p = s.params;
  if (p.greedy() && !p.wants_logprobs() && !s.seed_given) return;
  kvstream::v1::SamplingParams* out = req->mutable_sampling();
  out->set_temperature(p.temperature);
  out->set_top_k(p.top_k);
  if (p.top_p != 1) out->set_top_p(p.top_p);
  out->set_min_p(p.min_p);
  if (s.seed_given) out->set_seed(p.seed);
  out->set_logprobs(p.logprobs);
  out->set_top_logprobs(p.top_logprobs);
}

model::TokenLogprobs ResponseLogprobs(const kvstream::v1::GenerateResponse& msg) {
  model::TokenLogprobs lp;
  lp.logprob = msg.logprob();
  for (const auto& t : msg.top_logprobs()) lp.top.push_back({t.token_id(), t.logprob()});
  return lp;
}
#endif

}  // namespace kvstream::cli
