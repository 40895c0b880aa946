// Device helpers shared by the layer kernels: run-time-dtype element access (f32/f16/bf16,
// round to nearest even on store, as common/dtype.h does on the host) and warp reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>

#include "common/dtype.h"

namespace kvstream::kernels {

__device__ __forceinline__ float LoadF(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::kF16: return __half2float(static_cast<const __half*>(p)[i]);
    case DType::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void StoreF(void* p, DType t, size_t i, float v) {
  switch (t) {
    case DType::kF16: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
    case DType::kBF16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
    default: static_cast<float*>(p)[i] = v; break;
  }
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Compile-time element types for the templated kernels.
template <typename T> __device__ __forceinline__ float ToF(T v);
template <> __device__ __forceinline__ float ToF<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float ToF<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <typename T> __device__ __forceinline__ T FromF(float v);
template <> __device__ __forceinline__ __half FromF<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 FromF<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

}  // namespace kvstream::kernels
