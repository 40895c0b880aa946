// What bench/tier_prefetch's two modes share (tier_prefetch.cc: TTFT with a prefix from the
// pinned host tier; tier_interference.cc, --interference: what the tier's prefetches cost the
// forwards that run meanwhile): the flags, the clock, medians and percentiles, exit-on-error checks.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "common/status.h"

namespace kvstream::bench::tier {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string model = "llama-3-8b";
  int prefix = 8192, suffix = 256, reps = 5, layers = 0;
  std::vector<int> ctas = {0, 16, 32, 64};  // 0: the copy engines
  std::string json;
  // --interference: the forwards below, each without and with the tier fetching meanwhile.
  bool interference = false;
  int prompt = 2048, prompts = 16;  // prefill: this many prompts of this length, back to back
  int streams = 32, ctx = 4096, steps = 200;  // decode: a batch stepping this many times
  int bg_prefixes = 2, bg_depth = 2;  // distinct --prefix-token prefixes fetched; fetches in flight
};

// The copy paths --ctas names: 0 the copy engines, N the gather kernel on N thread blocks,
// "staged" (kStaged) the copy engines through the tier's device staging buffer and a device-memory
// scatter (the path of scattered pool blocks by default; kvcache/cuda/pinned_tier.cc CopyLayers).
constexpr int kStaged = 1 << 20;
inline std::string CopyName(int ctas) {
  return ctas == 0 ? "engine" : ctas == kStaged ? "staged" : "kernel/" + std::to_string(ctas);
}
inline int ParseCopyPath(const std::string& t) { return t == "staged" ? kStaged : std::atoi(t.c_str()); }
// Sets `tier` (a PinnedHostTier) to copy by that path.
template <typename Tier>
void UseCopyPath(Tier& tier, int ctas) {
  if (ctas != kStaged) tier.set_copy_ctas(ctas);
  tier.set_engine_max_runs(ctas == 0 ? 4 : 0);
  tier.set_staging(ctas == 0 || ctas == kStaged);
}


inline bool ParseArgs(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto val = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    auto num = [&]() { return std::atoi(val().c_str()); };
    if (k == "--model") a->model = val();
    else if (k == "--prefix") a->prefix = num();
    else if (k == "--suffix") a->suffix = num();
    else if (k == "--reps") a->reps = num();
    else if (k == "--layers") a->layers = num();
    else if (k == "--json") a->json = val();
    else if (k == "--interference") a->interference = true;
    else if (k == "--prompt") a->prompt = num();
    else if (k == "--prompts") a->prompts = num();
    else if (k == "--streams") a->streams = num();
    else if (k == "--ctx") a->ctx = num();
    else if (k == "--steps") a->steps = num();
    else if (k == "--bg-prefixes") a->bg_prefixes = num();
    else if (k == "--bg-depth") a->bg_depth = num();
    else if (k == "--ctas") {
      a->ctas.clear();
      std::stringstream ss(val());
      for (std::string t; std::getline(ss, t, ',');) a->ctas.push_back(ParseCopyPath(t));
    } else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return false;
    }
  }
  const bool load_ok = a->prompt > 0 && a->prompts > 0 && a->streams > 0 && a->ctx > 0 &&
                       a->steps > 0 && a->bg_depth > 0 && a->bg_prefixes >= a->bg_depth;
  return a->prefix > 0 && a->prefix % 16 == 0 && a->suffix > 0 && a->reps > 0 && !a->ctas.empty() &&
         (!a->interference || load_ok);
}

inline double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The smallest sample at or above fraction q of them (nearest rank): p99 of 1000 samples is the
// 990th smallest.
inline double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = size_t(std::ceil(q * double(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

}  // namespace kvstream::bench::tier

#define CHECK_OK(expr)                                                   \
  do {                                                                   \
    const ::kvstream::Status st_ = (expr);                               \
    if (!st_.ok()) {                                                     \
      std::fprintf(stderr, "%s: %s\n", #expr, st_.ToString().c_str());   \
      std::exit(1);                                                      \
    }                                                                    \
  } while (0)
#define CHECK_CUDA(expr)                                                               \
  do {                                                                                 \
    const cudaError_t e_ = (expr);                                                     \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s: %s\n", #expr, cudaGetErrorString(e_));                 \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)
