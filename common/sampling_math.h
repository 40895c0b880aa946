// The arithmetic of token sampling that the CPU reference (model/sampling.h) and the CUDA
// sampler (kernels/sampling.h) share, written so both compute bit-identical results from the
// same logits: integer operations, and float/double operations that are correctly rounded
// on both (no contraction into FMAs: the _rn intrinsics on the device; host code including
// this header must be compiled with -ffp-contract=off). Usable from host and device code.
//
//  - PhiloxUniform24(seed, index): the draw of a request's index-th generated token, a pure
//    function of (seed, index) (counter-based Philox4x32-10 as curand's: key = seed,
//    counter = {0, 0, index}; the first 32-bit output's high 24 bits).
//  - SortKey(logit): an unsigned key in the logits' order (NaN lowest).
//  - SampleWeight(logit, max_logit, inv_temperature): the unnormalised probability as a
//    fixed-point integer, floor(exp((logit - max) * inv_temperature) * 2^31) in [0, 2^31];
//    exp is SampleExp (a fixed polynomial), not libm's. Sums of weights are exact integers,
//    so they do not depend on summation order.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KV_SAMPLE_HD __host__ __device__
#else
#define KV_SAMPLE_HD
#endif

namespace kvstream::sampling {

inline constexpr uint64_t kWeightOne = uint64_t(1) << 31;  // the weight of the max logit

KV_SAMPLE_HD inline float FMul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
KV_SAMPLE_HD inline float FAdd(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
KV_SAMPLE_HD inline float FSub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
KV_SAMPLE_HD inline double DMul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

KV_SAMPLE_HD inline uint32_t MulHiLo(uint32_t a, uint32_t b, uint32_t* hi) {
  const uint64_t p = uint64_t(a) * uint64_t(b);
  *hi = uint32_t(p >> 32);
  return uint32_t(p);
}

// Philox4x32-10 (Salmon et al. 2011; the constants and round structure of curand's).
KV_SAMPLE_HD inline uint32_t PhiloxFirstOutput(uint64_t seed, uint64_t index) {
  uint32_t c0 = 0, c1 = 0, c2 = uint32_t(index), c3 = uint32_t(index >> 32);
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, hi1;
    const uint32_t lo0 = MulHiLo(0xD2511F53u, c0, &hi0);
    const uint32_t lo1 = MulHiLo(0xCD9E8D57u, c2, &hi1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c0;
}

// In [0, 2^24).
KV_SAMPLE_HD inline uint32_t PhiloxUniform24(uint64_t seed, uint64_t index) {
  return PhiloxFirstOutput(seed, index) >> 8;
}

KV_SAMPLE_HD inline uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
#endif
}

KV_SAMPLE_HD inline bool IsNan(float f) { return (FloatBits(f) & 0x7FFFFFFFu) > 0x7F800000u; }
KV_SAMPLE_HD inline bool IsFinite(float f) { return (FloatBits(f) & 0x7F800000u) != 0x7F800000u; }

KV_SAMPLE_HD inline uint32_t SortKey(float f) {
  if (IsNan(f)) return 0;
  const uint32_t b = FloatBits(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// exp(x) for x <= 0 (0 below -30 and for -inf / NaN): 2^n * p(r), x = n ln2 + r, |r| <= ln2/2,
// p of degree 7 (relative error ~1e-7). Deterministic, not correctly rounded.
KV_SAMPLE_HD inline float SampleExp(float x) {
  if (!(x >= -30.0f)) return 0.0f;
  if (x > 0.0f) x = 0.0f;
  const float t = FMul(x, 1.44269504088896341f);
  // Round to nearest (ties away): exact on both sides for |t| < 2^22.
  const int n = int(t < 0 ? FSub(t, 0.5f) : FAdd(t, 0.5f));
  const float fn = float(n);
  // ln2 split so that fn * kLn2Hi is exact (kLn2Hi has 16 significant bits, |n| <= 44).
  const float r = FSub(FSub(x, FMul(fn, 0.693145751953125f)), FMul(fn, 1.42860682030941723e-06f));
  float p = 1.98412698e-4f;  // 1/5040
  p = FAdd(FMul(p, r), 1.38888889e-3f);
  p = FAdd(FMul(p, r), 8.33333333e-3f);
  p = FAdd(FMul(p, r), 4.16666667e-2f);
  p = FAdd(FMul(p, r), 1.66666667e-1f);
  p = FAdd(FMul(p, r), 0.5f);
  p = FAdd(FMul(p, r), 1.0f);
  p = FAdd(FMul(p, r), 1.0f);
  // 2^n for n in [-44, 0]: a normal float, built from its exponent bits.
  const uint32_t bits = uint32_t(n + 127) << 23;
  float scale;
#if defined(__CUDA_ARCH__)
  scale = __uint_as_float(bits);
#else
  std::memcpy(&scale, &bits, 4);
#endif
  return FMul(p, scale);
}

// floor(SampleExp((logit - max_logit) * inv_temperature) * 2^31); 0 for NaN or -inf logits.
// max_logit finite, logit <= max_logit, inv_temperature finite and > 0.
KV_SAMPLE_HD inline uint64_t SampleWeight(float logit, float max_logit, float inv_temperature) {
  if (IsNan(logit)) return 0;
  const float e = SampleExp(FMul(FSub(logit, max_logit), inv_temperature));
  const uint64_t w = uint64_t(FMul(e, 2147483648.0f));  // exact scaling, then truncation
  return w > kWeightOne ? kWeightOne : w;
}

// The smallest weight min-p keeps: ceil(min_p * 2^31), min_p in [0, 1].
KV_SAMPLE_HD inline uint64_t MinPWeight(float min_p) {
  const double x = DMul(double(min_p), 2147483648.0);
  const uint64_t f = uint64_t(x);
  return double(f) < x ? f + 1 : f;
}

// The point of [0, total) the draw selects: floor(total * u24 / 2^24) (total < 2^53).
KV_SAMPLE_HD inline uint64_t DrawPoint(uint64_t total, uint32_t u24) {
  const uint64_t r = uint64_t(DMul(double(total), double(u24) * (1.0 / 16777216.0)));
  return r >= total ? total - 1 : r;
}

// True when mass >= top_p * total: the top-p set is large enough.
KV_SAMPLE_HD inline bool TopPReached(uint64_t mass, uint64_t total, float top_p) {
  return double(mass) >= DMul(double(total), double(top_p));
}

}  // namespace kvstream::sampling
