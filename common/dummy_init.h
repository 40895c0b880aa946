// Deterministic dummy values: value(seed, tensor_id, index) is a pure function, so the CPU
// reference and the CUDA backend materialise bit-identical dummy weights without copying them.
// Usable from host and device code.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define KV_HOST_DEVICE __host__ __device__
#else
#define KV_HOST_DEVICE
#endif

namespace kvstream {

KV_HOST_DEVICE inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform in [-scale, scale), exactly representable steps of 2^-23 * scale.
KV_HOST_DEVICE inline float DummyValue(uint64_t seed, uint64_t tensor_id, uint64_t index,
                                       float scale) {
  uint64_t h = SplitMix64(seed ^ SplitMix64(tensor_id * 0x100000001b3ULL + index));
  int32_t r = static_cast<int32_t>(h >> 40) - (1 << 23);  // [-2^23, 2^23)
  return static_cast<float>(r) * (scale / 8388608.0f);
}

}  // namespace kvstream
