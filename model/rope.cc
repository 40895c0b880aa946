#include "model/rope.h"

#include <algorithm>
#include <numbers>

namespace kvstream::model {
namespace {

// theta^(-2i/d), i < d/2.
std::vector<double> DefaultInvFreq(double theta, int d) {
  std::vector<double> f(size_t(d / 2));
  for (int i = 0; i < d / 2; ++i) f[i] = std::pow(theta, -2.0 * i / d);
  return f;
}

}  // namespace

RopeFreqs RopeFrequencies(const ModelConfig& c, int64_t seq_len) {
  const RopeScaling& r = c.rope;
  const int d = c.head_dim;
  const double theta = c.rope_theta;
  RopeFreqs out;
  out.scale = 1.0;
  if (r.type == "linear") {
    out.inv_freq = DefaultInvFreq(theta, d);
    for (double& f : out.inv_freq) f /= r.factor;
  } else if (r.type == "dynamic") {
    // base * ((factor * L / max_pos) - (factor - 1))^(d / (d - 2)), L = max(seq_len, max_pos).
    const double mp = r.original_max_position;
    const double len = std::max<double>(double(seq_len), mp);
    double base = theta;
    if (len > mp) base = theta * std::pow(r.factor * len / mp - (r.factor - 1), double(d) / (d - 2));
    out.inv_freq = DefaultInvFreq(base, d);
  } else if (r.type == "llama3") {
    out.inv_freq = DefaultInvFreq(theta, d);
    const double old_len = r.original_max_position;
    const double low_wavelen = old_len / r.low_freq_factor;
    const double high_wavelen = old_len / r.high_freq_factor;
    for (double& f : out.inv_freq) {
      const double wavelen = 2 * std::numbers::pi / f;
      if (wavelen < high_wavelen) continue;           // high frequency: kept
      if (wavelen > low_wavelen) {                     // low frequency: divided by factor
        f /= r.factor;
        continue;
      }
      const double smooth =
          (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
      f = (1 - smooth) * f / r.factor + smooth * f;   // in between: interpolated
    }
  } else if (r.type == "yarn") {
    const double orig = r.original_max_position;
    auto correction_dim = [&](double rotations) {
      return d * std::log(orig / (rotations * 2 * std::numbers::pi)) / (2 * std::log(theta));
    };
    double low = correction_dim(r.beta_fast), high = correction_dim(r.beta_slow);
    if (r.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, double(d - 1));
    if (low == high) high += 0.001;  // transformers: prevents a division by zero
    out.inv_freq.resize(size_t(d / 2));
    for (int i = 0; i < d / 2; ++i) {
      const double pos_freq = std::pow(theta, 2.0 * i / d);
      const double extrapolation = 1.0 / pos_freq, interpolation = 1.0 / (r.factor * pos_freq);
      const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
      const double extrapolation_weight = 1 - ramp;
      out.inv_freq[i] =
          interpolation * (1 - extrapolation_weight) + extrapolation * extrapolation_weight;
    }
    out.scale = r.attention_factor;
  } else {  // default
    out.inv_freq = DefaultInvFreq(theta, d);
  }
  return out;
}

}  // namespace kvstream::model
