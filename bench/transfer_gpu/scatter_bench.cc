// scatter_bench: the scatter-copy kernels alone (one process, one GPU), against cudaMemcpyAsync
// device-to-device of the same bytes measured in the same run, plus the host cost of the CUDA
// calls a cuda_ipc Write() makes.
//
//   scatter_bench [--iters=15] [--configs=t256u8,t512u4p32,...] [--json=FILE] [--device=0]
//
// Shapes (4096 tokens, block 16 tokens, fp16, 32 layers): llama-3-8b (64 KiB blocks, 16 MiB
// layers) and llama-2-7b (256 KiB blocks, 64 MiB layers). Per shape, each of
//   d2d            cudaMemcpyAsync of the layer, contiguous (the baseline)
//   table_kernel   the memory-table kernel (run table in pinned host memory, 2-D grid)
//   param:<cfg>    the parameter-table kernel with launch config <cfg> (ParamKernelConfig text)
// copies one layer ("layer") and 32 layers back to back on one stream ("prompt"), scattered (the
// layer's blocks to random blocks of a pool twice its size) and contiguous. Time = device time
// (cudaEventElapsedTime around the launches), median; also host time (launch + stream sync).
// Every kernel configuration's result is checked byte-exact once per shape.
// Output: one JSON line per measurement (stdout and --json FILE), then a table.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "transport/cuda/copy_plan.h"
#include "transport/cuda/cuda_util.h"

namespace {

using kvstream::Status;
using kvstream::transport::cuda::CopyRun;
using kvstream::transport::cuda::PackedTable;
using kvstream::transport::cuda::ParamKernelConfig;
namespace cu = kvstream::transport::cuda;

#define CHECK_CUDA(expr)                                                              \
  do {                                                                                \
    cudaError_t e_ = (expr);                                                          \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "scatter_bench: %s: %s\n", #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

void CheckOk(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "scatter_bench: %s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::ofstream g_json;
struct Line {
  std::string shape, kind, variant;
  int layers = 1;
  uint64_t bytes = 0;
  double dev_us = 0, host_us = 0, base_dev_us = 0;
};
std::vector<Line> g_lines;

void Emit(const Line& l) {
  std::ostringstream j;
  j.setf(std::ios::fixed);
  j.precision(3);
  j << "{\"bench\":\"scatter_bench\",\"shape\":\"" << l.shape << "\",\"case\":\"" << l.kind
    << "\",\"variant\":\"" << l.variant << "\",\"layers\":" << l.layers << ",\"bytes\":" << l.bytes
    << ",\"device_us\":" << l.dev_us << ",\"host_us\":" << l.host_us
    << ",\"device_gbps\":" << l.bytes / l.dev_us / 1e3 << ",\"d2d_device_us\":" << l.base_dev_us
    << ",\"ratio_vs_d2d\":" << l.base_dev_us / l.dev_us << "}";
  std::printf("%s\n", j.str().c_str());
  std::fflush(stdout);
  if (g_json.is_open()) g_json << j.str() << "\n" << std::flush;
  g_lines.push_back(l);
}

// Device time (events) and host time (enqueue + sync) medians of `fn` enqueuing on `s`.
template <typename Fn>
std::pair<double, double> Time(int iters, cudaStream_t s, Fn fn) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  std::vector<double> dev, host;
  for (int i = 0; i < iters + 3; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    CHECK_CUDA(cudaEventRecord(a, s));
    fn();
    CHECK_CUDA(cudaEventRecord(b, s));
    CHECK_CUDA(cudaEventSynchronize(b));
    auto t1 = std::chrono::steady_clock::now();
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    if (i >= 3) {
      dev.push_back(ms * 1e3);
      host.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
  }
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  return {Median(dev), Median(host)};
}

// Host time of one call, median over n.
template <typename Fn>
double CallUs(int n, Fn fn) {
  std::vector<double> t;
  for (int i = 0; i < n; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  return Median(t);
}

void RunShape(const std::string& name, uint64_t block, uint64_t kBlocks, int iters,
              const std::vector<std::string>& configs, std::map<std::string, double>* host_costs) {
  constexpr int kLayers = 32;
  const uint64_t layer = block * kBlocks;
  const uint64_t pool_blocks = 2 * kBlocks;  // per layer region
  char* src = nullptr;
  char* dst = nullptr;
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&src), layer * kLayers));
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&dst), pool_blocks * block * kLayers));
  {
    std::vector<uint32_t> h(layer * kLayers / 4);
    for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint32_t>(i * 2654435761u + 7);
    CHECK_CUDA(cudaMemcpy(src, h.data(), layer * kLayers, cudaMemcpyHostToDevice));
  }
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::mt19937_64 rng(42);
  std::vector<uint64_t> ids(pool_blocks);
  for (uint64_t i = 0; i < pool_blocks; ++i) ids[i] = i;
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(kBlocks);
  // Runs per layer: scattered (coalesced like the transport does) and contiguous; and the same
  // layers as block-table entries (BlockPlanner, as the transport plans paged writes).
  std::vector<std::vector<CopyRun>> scat(kLayers), contig(kLayers);
  std::vector<std::vector<cu::BlockEntry>> bscat(kLayers), bcontig(kLayers);
  uint64_t unit_scat = 0, unit_contig = 0;
  for (int l = 0; l < kLayers; ++l) {
    char* lsrc = src + l * layer;
    char* ldst = dst + l * pool_blocks * block;
    cu::CopyPlanner planner;
    std::vector<kvstream::transport::CopyOp> ops;
    for (uint64_t i = 0; i < kBlocks; ++i) ops.push_back({i * block, ids[i] * block, block});
    CheckOk(planner.Build(ops, reinterpret_cast<uint64_t>(lsrc), layer,
                          reinterpret_cast<uint64_t>(ldst), pool_blocks * block),
            "plan");
    scat[l] = planner.runs();
    contig[l] = {CopyRun{reinterpret_cast<uint64_t>(lsrc), reinterpret_cast<uint64_t>(ldst), layer}};
    cu::BlockPlanner bp;
    CheckOk(bp.Build(ops, reinterpret_cast<uint64_t>(lsrc), layer, reinterpret_cast<uint64_t>(ldst),
                     pool_blocks * block, 1 << 16),
            "block plan");
    if (!bp.fits()) {
      std::fprintf(stderr, "scatter_bench: block planner refused the scattered layer\n");
      std::exit(1);
    }
    bscat[l] = bp.entries();
    unit_scat = bp.unit_bytes();
    // Contiguous: the same blocks in order (what a paged write of a fresh pool looks like).
    std::vector<kvstream::transport::CopyOp> cops;
    for (uint64_t i = 0; i < kBlocks; ++i) cops.push_back({i * block, i * block, block});
    CheckOk(bp.Build(cops, reinterpret_cast<uint64_t>(lsrc), layer, reinterpret_cast<uint64_t>(ldst),
                     pool_blocks * block, 1 << 16),
            "block plan");
    bcontig[l] = bp.entries();
    unit_contig = bp.unit_bytes();
  }
  auto d2d = [&](int n) {
    for (int l = 0; l < n; ++l) {
      CHECK_CUDA(cudaMemcpyAsync(dst + l * pool_blocks * block, src + l * layer, layer,
                                 cudaMemcpyDeviceToDevice, s));
    }
  };
  auto base1 = Time(iters, s, [&] { d2d(1); });
  auto base32 = Time(std::max(3, iters / 2), s, [&] { d2d(kLayers); });
  for (auto [kind, n, base] : {std::tuple<const char*, int, std::pair<double, double>>{"layer", 1, base1},
                               {"prompt", kLayers, base32}}) {
    Line l{name, std::string(kind) + "_contig", "d2d_memcpy", n, layer * n, base.first, base.second,
           base.first};
    Emit(l);
  }

  // Memory-table kernel (pinned host table, 2-D grid), as the transport used it before.
  auto pinned = cu::PinnedBuffer::Allocate(kLayers * 2 * kBlocks * sizeof(CopyRun));
  CheckOk(pinned.status(), "pinned");
  auto table_kernel = [&](std::vector<std::vector<CopyRun>>& runs, int n) {
    CopyRun* t = static_cast<CopyRun*>(pinned.value()->data());
    for (int l = 0; l < n; ++l) {
      cu::ScatterShape shape = cu::PlanScatter(runs[l].data(), runs[l].size());
      std::memcpy(static_cast<void*>(t), runs[l].data(), runs[l].size() * sizeof(CopyRun));
      CheckOk(cu::LaunchScatterCopyPieces(t, runs[l].size(), shape.piece_bytes, shape.pieces_per_run, s),
              "table kernel");
      t += runs[l].size();
    }
  };
  // Pack every layer once (the transport packs per write; its cost is in host_costs).
  std::vector<PackedTable> pscat(kLayers), pcontig(kLayers);
  for (int l = 0; l < kLayers; ++l) {
    if (!cu::PackRuns(scat[l].data(), scat[l].size(), 0, &pscat[l]) ||
        !cu::PackRuns(contig[l].data(), contig[l].size(), 0, &pcontig[l])) {
      std::fprintf(stderr, "scatter_bench: PackRuns refused\n");
      std::exit(1);
    }
  }
  std::vector<char> want(layer), got(layer);
  CHECK_CUDA(cudaMemcpy(want.data(), src, layer, cudaMemcpyDeviceToHost));
  auto verify = [&](const std::string& what, bool scattered) {
    CHECK_CUDA(cudaStreamSynchronize(s));
    for (uint64_t i = 0; i < kBlocks; ++i) {
      const uint64_t at = scattered ? ids[i] * block : i * block;
      CHECK_CUDA(cudaMemcpy(got.data() + i * block, dst + at, block, cudaMemcpyDeviceToHost));
    }
    if (std::memcmp(got.data(), want.data(), layer) != 0) {
      std::fprintf(stderr, "scatter_bench: %s %s: WRONG BYTES\n", name.c_str(), what.c_str());
      std::exit(2);
    }
  };
  for (bool scattered : {true, false}) {
    auto& runs = scattered ? scat : contig;
    const char* sfx = scattered ? "_scatter" : "_contig";
    CHECK_CUDA(cudaMemsetAsync(dst, 0, pool_blocks * block, s));
    table_kernel(runs, 1);
    verify("table_kernel", scattered);
    for (auto [kind, n, base] : {std::tuple<const char*, int, double>{"layer", 1, base1.first},
                                 {"prompt", kLayers, base32.first}}) {
      auto t = Time(kind[0] == 'l' ? iters : std::max(3, iters / 2), s, [&] { table_kernel(runs, n); });
      Emit({name, std::string(kind) + sfx, "table_kernel", n, layer * n, t.first, t.second, base});
    }
    for (const std::string& c : configs) {
      ParamKernelConfig cfg;
      if (!cu::ParseParamKernelConfig(c.c_str(), &cfg)) {
        std::fprintf(stderr, "scatter_bench: bad config %s\n", c.c_str());
        std::exit(1);
      }
      auto& packed = scattered ? pscat : pcontig;
      auto launch = [&](int n) {
        for (int l = 0; l < n; ++l) CheckOk(cu::LaunchParamScatterCopy(packed[l], cfg, s), "param kernel");
      };
      CHECK_CUDA(cudaMemsetAsync(dst, 0, pool_blocks * block, s));
      launch(1);
      verify("param:" + c, scattered);
      for (auto [kind, n, base] : {std::tuple<const char*, int, double>{"layer", 1, base1.first},
                                   {"prompt", kLayers, base32.first}}) {
        auto t = Time(kind[0] == 'l' ? iters : std::max(3, iters / 2), s, [&] { launch(n); });
        Emit({name, std::string(kind) + sfx, "param:" + c, n, layer * n, t.first, t.second, base});
      }
      // The block-table kernel, same config, same layers.
      auto& bt = scattered ? bscat : bcontig;
      const uint64_t unit = scattered ? unit_scat : unit_contig;
      auto blaunch = [&](int n) {
        for (int l = 0; l < n; ++l) {
          CheckOk(cu::LaunchBlockScatterCopy(reinterpret_cast<uint64_t>(src + l * layer),
                                             reinterpret_cast<uint64_t>(dst + l * pool_blocks * block),
                                             unit, bt[l].data(), bt[l].size(), cfg, s),
                  "block kernel");
        }
      };
      CHECK_CUDA(cudaMemsetAsync(dst, 0, pool_blocks * block, s));
      blaunch(1);
      verify("block:" + c, scattered);
      for (auto [kind, n, base] : {std::tuple<const char*, int, double>{"layer", 1, base1.first},
                                   {"prompt", kLayers, base32.first}}) {
        auto t = Time(kind[0] == 'l' ? iters : std::max(3, iters / 2), s, [&] { blaunch(n); });
        Emit({name, std::string(kind) + sfx, "block:" + c, n, layer * n, t.first, t.second, base});
      }
    }
  }

  // Host cost of the calls one Write() makes (the CUDA basics on the first shape only; the
  // planners and launches per shape).
  {
    const std::string nb = std::to_string(kBlocks);
    ParamKernelConfig cfg;
    PackedTable pt;
    (*host_costs)["[" + name + "] PackRuns " + std::to_string(scat[0].size()) + " runs"] =
        CallUs(200, [&] { (void)cu::PackRuns(scat[0].data(), scat[0].size(), 0, &pt); });
    (*host_costs)["[" + name + "] param kernel launches, " + std::to_string(scat[0].size()) + " runs"] =
        CallUs(50, [&] { (void)cu::LaunchParamScatterCopy(pscat[0], cfg, s); });
    CHECK_CUDA(cudaStreamSynchronize(s));
    (*host_costs)["[" + name + "] block kernel launch, " + nb + " units"] = CallUs(50, [&] {
      (void)cu::LaunchBlockScatterCopy(reinterpret_cast<uint64_t>(src), reinterpret_cast<uint64_t>(dst),
                                       unit_scat, bscat[0].data(), bscat[0].size(), cfg, s);
    });
    CHECK_CUDA(cudaStreamSynchronize(s));
    std::vector<kvstream::transport::CopyOp> ops;
    for (uint64_t i = 0; i < kBlocks; ++i) ops.push_back({i * block, ids[i] * block, block});
    cu::CopyPlanner planner;
    (*host_costs)["[" + name + "] CopyPlanner::Build " + nb + " scattered ops"] = CallUs(200, [&] {
      (void)planner.Build(ops, reinterpret_cast<uint64_t>(src), layer, reinterpret_cast<uint64_t>(dst),
                          pool_blocks * block);
    });
    cu::BlockPlanner bp;
    (*host_costs)["[" + name + "] BlockPlanner::Build " + nb + " scattered ops"] = CallUs(200, [&] {
      (void)bp.Build(ops, reinterpret_cast<uint64_t>(src), layer, reinterpret_cast<uint64_t>(dst),
                     pool_blocks * block, 1 << 16);
    });
  }
  if (host_costs->find("cudaGetDevice") == host_costs->end()) {
    cudaEvent_t e;
    CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    int dev = 0;
    (*host_costs)["cudaGetDevice"] = CallUs(200, [&] { (void)cudaGetDevice(&dev); });
    (*host_costs)["cudaEventRecord"] = CallUs(200, [&] { (void)cudaEventRecord(e, s); });
    CHECK_CUDA(cudaStreamSynchronize(s));
    (*host_costs)["cudaEventQuery(done)"] = CallUs(200, [&] { (void)cudaEventQuery(e); });
    (*host_costs)["cudaStreamQuery(idle)"] = CallUs(200, [&] { (void)cudaStreamQuery(s); });
    (*host_costs)["cudaMemcpyAsync d2d 4KiB"] = CallUs(200, [&] {
      (void)cudaMemcpyAsync(dst, src, 4096, cudaMemcpyDeviceToDevice, s);
    });
    CHECK_CUDA(cudaStreamSynchronize(s));
    (*host_costs)["table kernel launch 255 runs (+table memcpy)"] = CallUs(50, [&] { table_kernel(scat, 1); });
    CHECK_CUDA(cudaStreamSynchronize(s));
    CHECK_CUDA(cudaEventDestroy(e));
  }
  CHECK_CUDA(cudaStreamDestroy(s));
  CHECK_CUDA(cudaFree(src));
  CHECK_CUDA(cudaFree(dst));
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string x;
  while (std::getline(in, x, ',')) if (!x.empty()) out.push_back(x);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 15, device = 0;
  uint64_t long_blocks = 1024;  // a third shape: llama-3-8b at 16k tokens (0 = off)
  std::string configs =
      "t256u4,t256u8,t512u4,t512u8,t128u8,t256u4p16,t256u8p32,t512u4p32,t256u8p64,t512u8p64,"
      "t256u8c528,t512u4c528,t256u8c1056";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--iters=", 0) == 0) iters = std::stoi(a.substr(8));
    if (a.rfind("--device=", 0) == 0) device = std::stoi(a.substr(9));
    if (a.rfind("--configs=", 0) == 0) configs = a.substr(10);
    if (a.rfind("--json=", 0) == 0) g_json.open(a.substr(7), std::ios::app);
    if (a.rfind("--long-blocks=", 0) == 0) long_blocks = std::stoull(a.substr(14));
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "scatter_bench: no usable CUDA device\n");
    return 77;
  }
  CHECK_CUDA(cudaSetDevice(device));
  std::map<std::string, double> host_costs;
  RunShape("llama-3-8b", 64 * 1024, 256, iters, Split(configs), &host_costs);
  RunShape("llama-2-7b", 256 * 1024, 256, iters, Split(configs), &host_costs);
  if (long_blocks > 0) {
    RunShape("llama-3-8b-" + std::to_string(long_blocks * 16), 64 * 1024, long_blocks, iters,
             Split(configs), &host_costs);
  }
  std::printf("\n%-11s %-15s %-22s %9s %9s %9s %7s\n", "shape", "case", "variant", "dev us",
              "host us", "dev GB/s", "vs d2d");
  for (const Line& l : g_lines) {
    std::printf("%-11s %-15s %-22s %9.1f %9.1f %9.1f %7.3f\n", l.shape.c_str(), l.kind.c_str(),
                l.variant.c_str(), l.dev_us, l.host_us, l.bytes / l.dev_us / 1e3,
                l.base_dev_us / l.dev_us);
  }
  std::printf("\nhost cost per call (median, us):\n");
  for (auto& [k, v] : host_costs) {
    std::printf("  %-48s %8.2f\n", k.c_str(), v);
    if (g_json.is_open()) {
      g_json << "{\"bench\":\"scatter_bench\",\"host_call\":\"" << k << "\",\"us\":" << v << "}\n";
    }
  }
  return 0;
}
