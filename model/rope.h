// Rotary position embedding, Hugging Face "rotate_half" convention, shared by every backend.
//
// RopeFrequencies() computes, once on the host, the inverse frequencies and the cos/sin scale of
// a config's rope type (default, linear, dynamic NTK, llama3, yarn) with transformers' formulas
// (modeling_rope_utils.py; docs/models.md). Every backend rotates with these numbers (the CUDA
// backend uploads them), so the backends agree by construction:
//   angle = pos * inv_freq[i],  c = cos(angle) * scale,  s = sin(angle) * scale  (i < head_dim/2)
//   x'[i]        = x[i] * c - x[i + head_dim/2] * s
//   x'[i + d/2]  = x[i + head_dim/2] * c + x[i] * s
// The angle and its cos/sin are computed in double and rounded to float once (RopeCosSin).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "model/config.h"

namespace kvstream::model {

struct RopeFreqs {
  std::vector<double> inv_freq;  // head_dim / 2
  double scale = 1.0;            // multiplies cos and sin (yarn's attention factor)
};

// The frequencies for tokens of a forward pass whose sequence ends at `seq_len` tokens (its last
// new position + 1). Only dynamic NTK depends on seq_len: past original_max_position it rescales
// the base for seq_len, as transformers does for every forward pass (keys already in the cache
// keep the rotation they were written with). Other types ignore seq_len.
RopeFreqs RopeFrequencies(const ModelConfig& config, int64_t seq_len);
// True when RopeFrequencies(config, seq_len) differs from RopeFrequencies(config, 0).
inline bool RopeDependsOnLength(const ModelConfig& c, int64_t seq_len) {
  return c.rope.type == "dynamic" && seq_len > c.rope.original_max_position;
}

// cos_out/sin_out: inv_freq.size() floats each.
inline void RopeCosSin(const RopeFreqs& f, int64_t pos, float* cos_out, float* sin_out) {
  for (size_t i = 0; i < f.inv_freq.size(); ++i) {
    double a = double(pos) * f.inv_freq[i];
    cos_out[i] = static_cast<float>(std::cos(a) * f.scale);
    sin_out[i] = static_cast<float>(std::sin(a) * f.scale);
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
