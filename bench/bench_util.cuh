// What the GPU benchmarks share (each bench is one translation unit that includes this once):
// a fatal CUDA check, a random fp16 fill, the plain streaming-read kernel that gives the
// device's read ceiling in the same run, and its timing; event timing of stream work, CUDA
// graph capture, flag values, and the JSON result lines.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#define CK(expr)                                                                          \
  do {                                                                                    \
    cudaError_t e_ = (expr);                                                              \
    if (e_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr,                   \
                   cudaGetErrorString(e_));                                               \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

namespace kvstream::bench {

// Values in [-1, 1), fixed by (index, seed).
static __global__ void FillRandomHalf(__half* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    p[i] = __float2half(float(int32_t(x >> 40) & 0xffff) / 32768.f - 1.f);
  }
}

// Plain streaming read: 16-byte loads, 4 independent per thread per iteration, folded into one
// word per thread that is stored only if it matches an impossible value (no dead code).
static __global__ void StreamRead(const uint4* __restrict__ p, size_t n, uint32_t* sink) {
  uint32_t acc = 0;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = __ldg(p + i), b = __ldg(p + i + stride), c = __ldg(p + i + 2 * stride),
                d = __ldg(p + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^
           d.z ^ d.w;
  }
  for (; i < n; i += stride) {
    const uint4 a = __ldg(p + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Two CUDA events around a span of stream work.
struct EventPair {
  cudaEvent_t a, b;
  EventPair() {
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
  }
  ~EventPair() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
  double Ms() const {
    float m = 0;
    CK(cudaEventElapsedTime(&m, a, b));
    return m;
  }
};

// Milliseconds (CUDA events `t` on `st`) of what `work()` queues on `st`; returns once it ran.
template <class Work>
double TimeOnStream(cudaStream_t st, const EventPair& t, Work&& work) {
  CK(cudaEventRecord(t.a, st));
  work();
  CK(cudaEventRecord(t.b, st));
  CK(cudaEventSynchronize(t.b));
  return t.Ms();
}

// Captures launch(0) .. launch(launches - 1) on `st` (each returns the error of what it queued)
// into a graph and instantiates it into *exec. Returns the first error of the begin capture,
// the launches (the rest are not made), the end capture and the instantiation; a capture once
// begun is ended, and the graph itself is destroyed in every case.
template <class Launch>
cudaError_t CaptureGraph(cudaStream_t st, int launches, Launch&& launch, cudaGraphExec_t* exec) {
  cudaError_t err = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
  if (err != cudaSuccess) return err;
  for (int l = 0; l < launches && err == cudaSuccess; ++l) err = launch(l);
  cudaGraph_t g = nullptr;
  const cudaError_t end = cudaStreamEndCapture(st, &g);
  if (err == cudaSuccess) err = end;
  if (err == cudaSuccess) err = cudaGraphInstantiate(exec, g, 0);
  if (g) cudaGraphDestroy(g);
  return err;
}

// The value of flag argv[*i]: argv[*i + 1], *i advanced to it. Without one, "<flag> needs a
// value" on stderr and exit 2.
inline std::string FlagValue(int argc, char** argv, int* i) {
  if (*i + 1 >= argc) {
    std::fprintf(stderr, "%s needs a value\n", argv[*i]);
    std::exit(2);
  }
  return argv[++*i];
}

// JSON result lines: each printed on stdout (flushed) and, with a path, written to that file
// (truncated on opening; nothing is written there when it cannot be opened). Closed on
// destruction.
class JsonLines {
 public:
  explicit JsonLines(const std::string& path)
      : file_(path.empty() ? nullptr : std::fopen(path.c_str(), "w")) {}
  ~JsonLines() {
    if (file_) std::fclose(file_);
  }
  JsonLines(const JsonLines&) = delete;
  JsonLines& operator=(const JsonLines&) = delete;
  void Emit(const std::string& line) {
    std::printf("%s\n", line.c_str());
    if (file_) std::fprintf(file_, "%s\n", line.c_str());
    std::fflush(stdout);
  }

 private:
  FILE* file_;
};

// "1,8,32" -> {1, 8, 32} (atoi of each comma-separated item).
inline std::vector<int> ParseInts(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string t;
  while (std::getline(ss, t, ',')) v.push_back(std::atoi(t.c_str()));
  return v;
}

// The streaming-read ceiling over `n16` 16-byte words: GB/s of the median of 10 timed runs
// after 2 warm-ups (*us_out, if given, gets that median in microseconds).
inline double StreamReadGbps(cudaStream_t st, const uint4* buf, size_t n16, uint32_t* sink,
                             int sms, double* us_out = nullptr) {
  EventPair t;
  std::vector<double> ms;
  for (int r = 0; r < 12; ++r) {
    const double m = TimeOnStream(st, t, [&] {
      StreamRead<<<sms * 8, 512, 0, st>>>(buf, n16, sink);
      CK(cudaGetLastError());
    });
    if (r >= 2) ms.push_back(m);
  }
  const double med = Median(ms);
  if (us_out) *us_out = med * 1e3;
  return double(n16) * 16 / (med * 1e-3) / 1e9;
}

}  // namespace kvstream::bench
