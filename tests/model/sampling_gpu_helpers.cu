#include "tests/model/sampling_gpu_helpers.h"

#include <curand_kernel.h>

#include "common/sampling_math.h"

namespace kvstream::testing_gpu {
namespace {

__global__ void PhiloxKernel(uint64_t seed, const uint64_t* index, int n, uint32_t* ours,
                             uint32_t* theirs) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  ours[i] = sampling::PhiloxFirstOutput(seed, index[i]);
  curandStatePhilox4_32_10_t st;
  curand_init(seed, index[i], 0, &st);
  theirs[i] = curand(&st);
}

__global__ void WeightsKernel(const float* z, int n, float m, float inv_t, uint64_t* w) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) w[i] = sampling::SampleWeight(z[i], m, inv_t);
}

}  // namespace

cudaError_t PhiloxOnDevice(uint64_t seed, const uint64_t* index, int n, uint32_t* ours,
                           uint32_t* theirs) {
  PhiloxKernel<<<(n + 255) / 256, 256>>>(seed, index, n, ours, theirs);
  return cudaGetLastError();
}

cudaError_t WeightsOnDevice(const float* z, int n, float max_logit, float inv_temperature,
                            uint64_t* w) {
  WeightsKernel<<<(n + 255) / 256, 256>>>(z, n, max_logit, inv_temperature, w);
  return cudaGetLastError();
}

}  // namespace kvstream::testing_gpu
