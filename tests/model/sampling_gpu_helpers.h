// Device-side evaluations of common/sampling_math.h for sampling_gpu_test (compiled by nvcc).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvstream::testing_gpu {

// ours[i] = PhiloxFirstOutput(seed, index[i]); theirs[i] = curand()'s first output after
// curand_init(seed, index[i], 0) (Philox4_32_10).
cudaError_t PhiloxOnDevice(uint64_t seed, const uint64_t* index, int n, uint32_t* ours,
                           uint32_t* theirs);
// w[i] = SampleWeight(z[i], max_logit, inv_temperature).
cudaError_t WeightsOnDevice(const float* z, int n, float max_logit, float inv_temperature,
                            uint64_t* w);

}  // namespace kvstream::testing_gpu
