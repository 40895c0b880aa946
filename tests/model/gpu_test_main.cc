// main() for the GPU test binaries: exits 77 (CTest: skipped) with the reason printed when no
// usable GPU is present, else runs the GoogleTest suites.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>

int main(int argc, char** argv) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    std::printf("SKIPPED: no usable GPU (%s)\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "0 CUDA devices");
    return 77;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
    std::printf("GPU 0: %s, sm_%d%d\n", prop.name, prop.major, prop.minor);
    if (prop.major < 8) {
      std::printf("SKIPPED: kernels are built for sm_80 and later\n");
      return 77;
    }
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
