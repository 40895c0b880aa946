// Rotary position embedding, Hugging Face "rotate_half" convention, shared by every backend:
// for i in [0, head_dim/2):
//   inv_freq[i] = theta^(-2i / head_dim),  angle = pos * inv_freq[i]
//   x'[i]          = x[i] * cos(angle) - x[i + head_dim/2] * sin(angle)
//   x'[i + d/2]    = x[i + head_dim/2] * cos(angle) + x[i] * sin(angle)
// cos/sin are computed in double and rounded to float once (RopeCosSin), so a GPU backend
// that uploads this table uses the same rotation factors as the CPU reference.
#pragma once

#include <cmath>

namespace kvstream::model {

// cos_out/sin_out: head_dim / 2 floats each.
inline void RopeCosSin(double theta, int head_dim, long pos, float* cos_out, float* sin_out) {
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    double inv_freq = std::pow(theta, -2.0 * i / head_dim);
    double a = double(pos) * inv_freq;
    cos_out[i] = static_cast<float>(std::cos(a));
    sin_out[i] = static_cast<float>(std::sin(a));
  }
}

// Rotates one head vector x[head_dim] in place.
inline void RopeApply(float* x, int head_dim, const float* cos_v, const float* sin_v) {
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    float a = x[i], b = x[i + half];
    x[i] = a * cos_v[i] - b * sin_v[i];
    x[i + half] = b * cos_v[i] + a * sin_v[i];
  }
}

}  // namespace kvstream::model
