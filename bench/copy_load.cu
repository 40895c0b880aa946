// copy_load: a second process that keeps copying device memory on a GPU at a set rate, to
// measure what another process's copies cost a decode step on the same GPU (run beside
// bench/decode_step). Two ways to copy, as a KV transport would:
//   ce: cudaMemcpyAsync device to device (the copy engines),
//   sm: a copy kernel (as transport/cuda_ipc's scatter kernel does; it needs the SMs, so the
//       GPU time-slices it with the other process's kernels).
// Chunks of --chunk-mib rotate over 1 GiB buffers (the L2 cannot hold them); with --gbps > 0
// the next chunk is issued no earlier than its share of the rate allows. Runs --seconds, then
// prints the achieved rate (a JSON line).
//
//   copy_load --mode ce|sm [--gbps 0] [--seconds 10] [--chunk-mib 64] [--device 0]
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "bench/bench_util.cuh"

namespace {

__global__ void CopyKernel(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = "ce";
  double gbps = 0, seconds = 10;
  size_t chunk = 64ull << 20;
  int device = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--mode") mode = v;
    else if (k == "--gbps") gbps = std::atof(v.c_str());
    else if (k == "--seconds") seconds = std::atof(v.c_str());
    else if (k == "--chunk-mib") chunk = size_t(std::atoi(v.c_str())) << 20;
    else if (k == "--device") device = std::atoi(v.c_str());
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  if ((mode != "ce" && mode != "sm") || gbps < 0 || seconds <= 0 || chunk == 0 ||
      chunk > (1ull << 30)) {
    std::fprintf(stderr, "usage: copy_load --mode ce|sm [--gbps R] [--seconds S] [--chunk-mib M]\n");
    return 2;
  }
  if (cudaSetDevice(device) != cudaSuccess) {
    std::fprintf(stderr, "no usable GPU %d\n", device);
    return 77;
  }
  const size_t total = 1ull << 30;
  char *src = nullptr, *dst = nullptr;
  CK(cudaMalloc(&src, total));
  CK(cudaMalloc(&dst, total));
  CK(cudaMemset(src, 1, total));
  int lo = 0, hi = 0;
  CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  cudaStream_t st;
  CK(cudaStreamCreateWithPriority(&st, cudaStreamNonBlocking, lo));  // lowest, as transports do
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  using Clock = std::chrono::steady_clock;
  auto wall = [] {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  };
  const double wall_start = wall();
  const auto t0 = Clock::now();
  double issued = 0;
  size_t off = 0;
  while (true) {
    const double now = std::chrono::duration<double>(Clock::now() - t0).count();
    if (now >= seconds) break;
    if (gbps > 0) {
      const double due = issued / (gbps * 1e9);
      if (due > now) {
        std::this_thread::sleep_for(std::chrono::duration<double>(due - now));
        continue;
      }
    }
    if (off + chunk > total) off = 0;
    if (mode == "ce") {
      CK(cudaMemcpyAsync(dst + off, src + off, chunk, cudaMemcpyDeviceToDevice, st));
    } else {
      CopyKernel<<<sms * 4, 512, 0, st>>>(reinterpret_cast<const uint4*>(src + off),
                                          reinterpret_cast<uint4*>(dst + off), chunk / 16);
      CK(cudaGetLastError());
    }
    off += chunk;
    issued += double(chunk);
    // Keep at most a few chunks queued so the rate is the rate, not a backlog.
    CK(cudaStreamSynchronize(st));
  }
  CK(cudaStreamSynchronize(st));
  const double el = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("{\"bench\":\"copy_load\",\"mode\":\"%s\",\"target_gbps\":%.1f,\"achieved_gbps\":%.1f,"
              "\"seconds\":%.2f,\"chunk_bytes\":%zu,\"wall_start\":%.6f,\"wall_end\":%.6f}\n",
              mode.c_str(), gbps, issued / el / 1e9, el, chunk, wall_start, wall());
  cudaFree(src);
  cudaFree(dst);
  return 0;
}
