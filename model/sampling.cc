#include "model/sampling.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/sampling_math.h"

namespace kvstream::model {

namespace sm = kvstream::sampling;

Status ValidateSamplingParams(const SamplingParams& p) {
  auto bad = [](const std::string& name, float v, const std::string& want) {
    return InvalidArgument("sampling: " + name + " = " + std::to_string(v) + ": must be " + want);
  };
  if (!std::isfinite(p.temperature) || p.temperature < 0 || p.temperature > kMaxTemperature)
    return bad("temperature", p.temperature,
               "0 (greedy) or in (0, " + std::to_string(int(kMaxTemperature)) + "]");
  if (p.top_k < 0)
    return InvalidArgument("sampling: top_k = " + std::to_string(p.top_k) + ": must be >= 0 (0: off)");
  if (!std::isfinite(p.top_p) || !(p.top_p > 0) || p.top_p > 1)
    return bad("top_p", p.top_p, "in (0, 1]");
  if (!std::isfinite(p.min_p) || p.min_p < 0 || p.min_p > 1) return bad("min_p", p.min_p, "in [0, 1]");
  if (p.top_logprobs < 0 || p.top_logprobs > kMaxTopLogprobs)
    return InvalidArgument("sampling: top_logprobs = " + std::to_string(p.top_logprobs) +
                           ": must be in [0, " + std::to_string(kMaxTopLogprobs) + "]");
  return OkStatus();
}

float InvTemperature(float temperature) {
  return 1.0f / std::max(temperature, kMinTemperature);
}

namespace {

int32_t Argmax(std::span<const float> z) {
  int32_t best = -1;
  for (size_t i = 0; i < z.size(); ++i) {
    if (sm::IsNan(z[i])) continue;
    if (best < 0 || z[i] > z[best]) best = int32_t(i);
  }
  return best < 0 ? 0 : best;
}

}  // namespace

int32_t SampleRow(std::span<const float> z, const SamplingParams& p, uint64_t token_index) {
  const int32_t best = Argmax(z);
  if (p.greedy()) return best;
  const float m = z[best];
  if (sm::IsNan(m) || !sm::IsFinite(m)) return best;
  const size_t V = z.size();
  const float inv_t = InvTemperature(p.temperature);
  std::vector<uint32_t> key(V);
  std::vector<uint64_t> w(V);
  for (size_t i = 0; i < V; ++i) {
    key[i] = sm::SortKey(z[i]);
    w[i] = sm::SampleWeight(z[i], m, inv_t);
  }
  uint32_t tk = 0;
  if (p.top_k > 0 && size_t(p.top_k) < V) {
    std::vector<uint32_t> sorted = key;
    std::nth_element(sorted.begin(), sorted.begin() + (p.top_k - 1), sorted.end(),
                     std::greater<uint32_t>());
    tk = sorted[p.top_k - 1];
  }
  uint32_t tp = 0;
  if (p.top_p < 1) {
    std::vector<std::pair<uint32_t, uint64_t>> kept;
    uint64_t total = 0;
    for (size_t i = 0; i < V; ++i)
      if (key[i] >= tk) {
        kept.emplace_back(key[i], w[i]);
        total += w[i];
      }
    std::sort(kept.begin(), kept.end(),
              [](const auto& a, const auto& b) { return a.first > b.first; });
    uint64_t mass = 0;
    for (size_t j = 0; j < kept.size(); ++j) {
      mass += kept[j].second;
      const bool group_end = j + 1 == kept.size() || kept[j + 1].first != kept[j].first;
      if (group_end && sm::TopPReached(mass, total, p.top_p)) {
        tp = kept[j].first;
        break;
      }
    }
  }
  const uint32_t t = std::max(tk, tp);
  const uint64_t minw = p.min_p > 0 ? sm::MinPWeight(p.min_p) : 0;
  uint64_t total = 0;
  for (size_t i = 0; i < V; ++i)
    if (key[i] >= t && w[i] >= minw) total += w[i];
  const uint64_t r = sm::DrawPoint(total, sm::PhiloxUniform24(p.seed, token_index));
  uint64_t cum = 0;
  for (size_t i = 0; i < V; ++i) {
    if (key[i] < t || w[i] < minw) continue;
    cum += w[i];
    if (cum > r) return int32_t(i);
  }
  return best;  // unreachable: the max is always kept and its weight is > 0
}

TokenLogprobs LogprobsRow(std::span<const float> z, int32_t chosen, int top_n) {
  const int32_t best = Argmax(z);
  const double m = z[best];
  double sum = 0;
  for (float v : z)
    if (!sm::IsNan(v)) sum += std::exp(double(v) - m);
  const double log_z = m + std::log(sum);
  TokenLogprobs out;
  out.logprob = float(double(z[chosen]) - log_z);
  if (top_n > 0) {
    std::vector<int32_t> idx(z.size());
    for (size_t i = 0; i < z.size(); ++i) idx[i] = int32_t(i);
    const size_t n = std::min<size_t>(size_t(top_n), z.size());
    auto before = [&](int32_t a, int32_t b) {
      const uint32_t ka = sm::SortKey(z[a]), kb = sm::SortKey(z[b]);
      return ka != kb ? ka > kb : a < b;
    };
    std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), before);
    for (size_t j = 0; j < n; ++j)
      out.top.push_back({idx[j], float(double(z[idx[j]]) - log_z)});
  }
  return out;
}

bool NeedsSampling(std::span<const SeqSampling> sampling) {
  for (const SeqSampling& s : sampling)
    if (!s.params.greedy() || s.params.wants_logprobs()) return true;
  return false;
}

void SampleRows(const float* logits, int rows, int vocab, std::span<const SeqSampling> sampling,
                std::vector<int32_t>* tokens, std::vector<TokenLogprobs>* logprobs) {
  tokens->assign(size_t(rows), 0);
  logprobs->clear();
  bool any_logprobs = false;
  for (const SeqSampling& s : sampling) any_logprobs = any_logprobs || s.params.wants_logprobs();
  if (any_logprobs) logprobs->resize(size_t(rows));
  const SamplingParams greedy;
  for (int r = 0; r < rows; ++r) {
    std::span<const float> z(logits + size_t(r) * vocab, size_t(vocab));
    const SeqSampling* s = sampling.empty() ? nullptr : &sampling[size_t(r)];
    (*tokens)[r] = SampleRow(z, s ? s->params : greedy, s ? s->token_index : 0);
    if (s && s->params.wants_logprobs())
      (*logprobs)[r] = LogprobsRow(z, (*tokens)[r], s->params.top_logprobs);
  }
}

}  // namespace kvstream::model
