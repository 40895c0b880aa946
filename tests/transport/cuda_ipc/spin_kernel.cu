#include "tests/transport/cuda_ipc/spin_kernel.h"

namespace kvstream::testing {
namespace {

__global__ void SpinKernel(unsigned long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(100000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

}  // namespace

cudaError_t LaunchSpin(cudaStream_t stream, unsigned long long ns) {
  SpinKernel<<<1, 1, 0, stream>>>(ns);
  return cudaGetLastError();
}

}  // namespace kvstream::testing
