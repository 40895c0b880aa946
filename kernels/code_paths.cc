#include "kernels/code_paths.h"

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>

namespace kvstream::kernels {

bool FallbackForced() {
  static const bool forced = [] {
    const char* e = std::getenv("KVSTREAM_KERNEL_FALLBACK");
    return e != nullptr && *e != '\0' && std::strcmp(e, "0") != 0;
  }();
  return forced;
}

bool DeviceRunsHopperCode(int dev, const void* kernel) {
  int major = 0;
  cudaFuncAttributes fa{};
  const bool yes = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                   cudaFuncGetAttributes(&fa, kernel) == cudaSuccess && major >= 9 &&
                   fa.ptxVersion >= 90;
  (void)cudaGetLastError();
  return yes;
}

}  // namespace kvstream::kernels
