// What the transfer benches share besides the peer protocol (tests/transport_gpu/gpu_peer.h):
// "--key=value" flags ("--key" alone = "1"), comma-separated lists, and fatal errors that name
// the program.
#pragma once

#include <cuda_runtime_api.h>
#include <errno.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/time.h"

namespace kvstream::bench {

// Prints "<program>: <what>" on stderr and exits 1.
[[noreturn]] inline void Die(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", program_invocation_short_name, what.c_str());
  std::exit(1);
}

// A CUDA call that must succeed: otherwise Die() naming the call and the error.
#define KV_BENCH_CUDA(expr)                                                               \
  do {                                                                                    \
    const cudaError_t kv_bench_err_ = (expr);                                             \
    if (kv_bench_err_ != cudaSuccess)                                                     \
      ::kvstream::bench::Die(std::string(#expr) + ": " + cudaGetErrorString(kv_bench_err_)); \
  } while (0)

// Every "--key=value" of argv (later ones win); other arguments are ignored.
inline std::map<std::string, std::string> ParseArgs(int argc, char** argv) {
  std::map<std::string, std::string> out;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s.rfind("--", 0) != 0) continue;
    const size_t eq = s.find('=');
    if (eq == std::string::npos) out[s.substr(2)] = "1";
    else out[s.substr(2, eq - 2)] = s.substr(eq + 1);
  }
  return out;
}

// "a,b,,c" -> {"a", "b", "c"}.
inline std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) if (!item.empty()) out.push_back(item);
  return out;
}

// One JSON result line: on stdout (flushed) and, when open, appended to `json`.
inline void EmitJsonLine(const std::string& line, std::ofstream& json) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  if (json.is_open()) json << line << "\n" << std::flush;
}

// Median of `v` (0 when empty).
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Host-clocked median seconds of `iters` calls of `fn` (which must return only when its work is
// complete), after `warmups` calls that are not counted.
template <typename Fn>
double TimedMedian(int warmups, int iters, Fn fn) {
  for (int i = 0; i < warmups; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    const auto start = Clock::now();
    fn();
    t.push_back(SecondsSince(start));
  }
  return Median(t);
}

}  // namespace kvstream::bench
