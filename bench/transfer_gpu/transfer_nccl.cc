// transfer_nccl: GB/s of the GPU transports across two GPUs (writer process on --writer-device,
// receiver process on --receiver-device), against cudaMemcpyPeer of the same bytes measured in
// the same run:
//   transfer_nccl [--models=llama-3-8b,llama-2-7b] [--tokens=4096] [--iters=10]
//                 [--backends=cuda_ipc,nccl,nccl_pack,nccl_direct] [--json=FILE]
//                 [--writer-device=0] [--receiver-device=1] [--chunk-mb=N] [--idle-ms=200]
//                 [--cpu-ms=200] [--trace]
// Cases per model (KV blocks of 16 tokens, paged pool twice the prompt per layer):
//   layer_contig   one layer's KV, one contiguous op
//   layer_scatter  one layer's KV as one op per block, to random pool blocks
//   prompt_contig  every layer, one write per layer (contiguous), posted back to back
//   prompt_scatter every layer, one scattered write per layer
// Every write asks for a notification; the time is from the first Write() to the last handle
// done (for nccl: acked, i.e. landed and notified), median over --iters (or more, see
// --cpu-ms below) after 2 warm-ups.
// Baselines (in-process, same bytes): cudaMemcpyPeerAsync of the contiguous bytes (per layer),
// and, for scattered cases, one cudaMemcpyPeerAsync per block.
// nccl = auto mode, nccl_pack / nccl_direct force the mode. --trace: NcclOptions::trace on both
// sides (one stderr line per write and side with each step's time).
// Host CPU cost (backend rows, both processes): the measured iterations of a case (not its
// warm-ups; at least the --iters count, more until the span lasts --cpu-ms, 0 = exactly that
// count; the median is over all of them) are one span; each process's CPU time over it
// (CLOCK_PROCESS_CPUTIME_ID: user + system, all threads) gives writer_cores / receiver_cores
// (CPU s / wall s; 1.0 = one core busy throughout) and writer_cpu_us_per_write /
// receiver_cpu_us_per_write (per Write(): one layer).
// The receiver reports its CPU time over the control pipe (command "CPU") just before and just
// after the span. Rows idle_connected (connected, nothing written yet) and idle_after (right
// after the last case) are --idle-ms spans with no writes (gbps 0): the endpoint threads' cost
// while nothing moves. Fields: see CpuJson() in bench_common.h.
// The receiver is this binary re-executed with --role=receiver.
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/transfer_gpu/bench_common.h"
#include "common/status.h"
#include "common/time.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "tests/transport/gpu/gpu_peer.h"
#include "transport/cuda_ipc/cuda_ipc_transport.h"
#include "transport/nccl/nccl_transport.h"
#include "transport/transport.h"

namespace kvstream::bench {
namespace {

using kvstream::testing::PeerProcess;
using transport::CopyOp;
using transport::MemoryKind;
using transport::PeerDescriptor;
using transport::Transport;
using transport::WriteHandle;
using transport::WriteRequest;

uint64_t g_chunk_bytes = 0;  // --chunk-mb: nccl staging chunk (0 = the backend's default)
bool g_trace = false;        // --trace: NcclOptions::trace

Result<std::unique_ptr<Transport>> MakeBackend(const std::string& name, int device) {
  if (name == "cuda_ipc") {
    transport::cuda_ipc::CudaIpcOptions o;
    o.device = device;
    return transport::cuda_ipc::CreateCudaIpcTransport(o);
  }
  if (name.rfind("nccl", 0) == 0) {
    transport::nccl::NcclOptions o;
    o.device = device;
    o.connect_timeout_ms = 20000;
    if (g_chunk_bytes) o.chunk_bytes = g_chunk_bytes;
    o.trace = g_trace;
    if (name == "nccl_pack") o.copy_mode = transport::nccl::CopyMode::kPack;
    else if (name == "nccl_direct") o.copy_mode = transport::nccl::CopyMode::kDirect;
    else if (name != "nccl") return NotSupported("unknown backend " + name);
    return transport::nccl::CreateNcclTransport(o);
  }
  return NotSupported("backend " + name + " is not built into transfer_nccl");
}

int RunReceiver(const std::map<std::string, std::string>& args) {
  const int device = std::stoi(args.at("device"));
  KV_BENCH_CUDA(cudaSetDevice(device));
  return ServeAsBenchReceiver(MakeBackend(args.at("backend"), device), device,
                              std::stoi(args.at("regions")), std::stoull(args.at("region-bytes")),
                              /*host_memory=*/false);
}

struct Row {
  std::string model, backend, kase;
  uint64_t bytes = 0;
  size_t writes = 0, runs = 0;
  double gbps = 0, vs_peer = 0;
  CpuSpan cpu;  // host CPU of both processes over the measured iterations (or the idle span)
};
std::vector<Row> g_rows;
std::ofstream g_json;

void Emit(const Row& r, int tokens) {
  std::ostringstream o;
  o << "{\"bench\":\"transfer_nccl\",\"model\":\"" << r.model << "\",\"tokens\":" << tokens
    << ",\"backend\":\"" << r.backend << "\",\"case\":\"" << r.kase << "\",\"bytes\":" << r.bytes
    << ",\"writes\":" << r.writes << ",\"runs\":" << r.runs << ",\"gbps\":" << r.gbps
    << ",\"vs_memcpy_peer\":" << r.vs_peer << CpuJson(r.cpu) << "}";
  EmitJsonLine(o.str(), g_json);
  g_rows.push_back(r);
}

template <typename Fn>
double TimeIt(int iters, Fn fn) {
  return TimedMedian(2, iters, fn);  // after 2 warm-ups
}

CpuSpanFlags g_span;  // --idle-ms, --cpu-ms

void RunModel(const std::string& model_name, int tokens, int iters, int wdev, int rdev,
              const std::vector<std::string>& backends) {
  auto cfg = model::PresetConfig(model_name);
  if (!cfg.ok()) Die(cfg.status().ToString());
  model::KvLayout layout{cfg->num_layers, cfg->num_kv_heads, cfg->head_dim, 16, cfg->kv_dtype};
  const int layers = layout.num_layers;
  const uint64_t bb = layout.block_bytes();
  const uint64_t blocks = static_cast<uint64_t>((tokens + 15) / 16);
  const uint64_t layer_bytes = blocks * bb;
  const uint64_t prompt_bytes = layer_bytes * layers;
  const uint64_t pool_blocks = 2 * blocks;
  const uint64_t region_bytes = pool_blocks * bb;
  std::fprintf(stderr, "[%s] %d layers, block %llu B, %llu blocks, %.1f MiB/layer, %.1f MiB/prompt\n",
               model_name.c_str(), layers, (unsigned long long)bb, (unsigned long long)blocks,
               layer_bytes / 1048576.0, prompt_bytes / 1048576.0);

  std::mt19937_64 rng(42);
  std::vector<uint64_t> ids(pool_blocks);
  for (uint64_t i = 0; i < pool_blocks; ++i) ids[i] = i;
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(blocks);

  KV_BENCH_CUDA(cudaSetDevice(wdev));
  void* src = nullptr;
  KV_BENCH_CUDA(cudaMalloc(&src, prompt_bytes));
  KV_BENCH_CUDA(cudaMemset(src, 0x3C, prompt_bytes));
  KV_BENCH_CUDA(cudaDeviceSynchronize());

  // ---- cudaMemcpyPeer baselines (this process, writer GPU -> receiver GPU) ----
  std::map<std::string, double> peer_gbps;
  {
    KV_BENCH_CUDA(cudaSetDevice(rdev));
    void* dst = nullptr;
    KV_BENCH_CUDA(cudaMalloc(&dst, region_bytes * layers));
    KV_BENCH_CUDA(cudaSetDevice(wdev));
    cudaStream_t s;
    KV_BENCH_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    auto contig = [&](int n) {
      for (int l = 0; l < n; ++l) {
        KV_BENCH_CUDA(cudaMemcpyPeerAsync(static_cast<char*>(dst) + l * region_bytes, rdev,
                                       static_cast<char*>(src) + l * layer_bytes, wdev, layer_bytes, s));
      }
      KV_BENCH_CUDA(cudaStreamSynchronize(s));
    };
    auto scatter = [&](int n) {
      for (int l = 0; l < n; ++l) {
        for (uint64_t b = 0; b < blocks; ++b) {
          KV_BENCH_CUDA(cudaMemcpyPeerAsync(static_cast<char*>(dst) + l * region_bytes + ids[b] * bb, rdev,
                                         static_cast<char*>(src) + l * layer_bytes + b * bb, wdev, bb, s));
        }
      }
      KV_BENCH_CUDA(cudaStreamSynchronize(s));
    };
    peer_gbps["layer_contig"] = layer_bytes / TimeIt(iters, [&] { contig(1); }) / 1e9;
    peer_gbps["prompt_contig"] = prompt_bytes / TimeIt(std::max(3, iters / 2), [&] { contig(layers); }) / 1e9;
    const double layer_scatter = layer_bytes / TimeIt(iters, [&] { scatter(1); }) / 1e9;
    const double prompt_scatter =
        prompt_bytes / TimeIt(std::max(3, iters / 2), [&] { scatter(layers); }) / 1e9;
    auto base = [&](const std::string& name, const std::string& kase, uint64_t bytes, size_t writes,
                    size_t runs, double gbps) {
      Row r{model_name, name, kase, bytes, writes, runs, gbps,
            gbps / peer_gbps[kase.find("layer") == 0 ? "layer_contig" : "prompt_contig"], CpuSpan{}};
      Emit(r, tokens);
    };
    base("cudaMemcpyPeer", "layer_contig", layer_bytes, 1, 1, peer_gbps["layer_contig"]);
    base("cudaMemcpyPeer", "prompt_contig", prompt_bytes, layers, layers, peer_gbps["prompt_contig"]);
    base("cudaMemcpyPeer_per_block", "layer_scatter", layer_bytes, 1, blocks, layer_scatter);
    base("cudaMemcpyPeer_per_block", "prompt_scatter", prompt_bytes, layers, blocks * layers, prompt_scatter);
    KV_BENCH_CUDA(cudaStreamDestroy(s));
    KV_BENCH_CUDA(cudaFree(dst));
    KV_BENCH_CUDA(cudaSetDevice(wdev));
  }

  for (const std::string& backend : backends) {
    PeerProcess rx;
    PeerDescriptor peer;
    const std::string err = kvstream::testing::StartPeerReceiver(
        &rx,
        {"--role=receiver", "--backend=" + backend, "--device=" + std::to_string(rdev),
         "--chunk-mb=" + std::to_string(g_chunk_bytes >> 20), std::string("--trace=") + (g_trace ? "1" : "0"),
         "--regions=" + std::to_string(layers),
         "--region-bytes=" + std::to_string(region_bytes)},
        layers, 60000, &peer);
    if (!err.empty()) {
      std::fprintf(stderr, "[%s] receiver failed: %s\n", backend.c_str(), err.c_str());
      continue;
    }
    auto t = MakeBackend(backend, wdev);
    if (!t.ok()) Die(backend + ": " + t.status().ToString());
    const auto t_connect = Clock::now();
    auto ep = t.value()->Connect(peer);
    if (!ep.ok()) {
      std::fprintf(stderr, "[%s] connect: %s\n", backend.c_str(), ep.status().ToString().c_str());
      continue;
    }
    std::fprintf(stderr, "[%s] connected in %.0f ms\n", backend.c_str(), SecondsSince(t_connect) * 1e3);
    auto reg = t.value()->Register({src, prompt_bytes, MemoryKind::kCuda, wdev});
    if (!reg.ok()) Die(backend + " register: " + reg.status().ToString());
    uint64_t request = 1;
    bool failed = false;  // a backend that fails is reported and skipped; the others still run
    auto run_case = [&](const std::string& kase, int nlayers, bool scattered) {
      if (failed) return;
      std::vector<WriteRequest> reqs(nlayers);
      size_t runs = 0;
      for (int l = 0; l < nlayers; ++l) {
        WriteRequest& wr = reqs[l];
        wr.local = reg.value().get();
        wr.remote_region = l;
        wr.notify = true;
        if (scattered) {
          for (uint64_t b = 0; b < blocks; ++b) wr.ops.push_back({l * layer_bytes + b * bb, ids[b] * bb, bb});
        } else {
          wr.ops.push_back({l * layer_bytes, 0, layer_bytes});
        }
      }
      CpuSpan cpu;
      const int n = nlayers == 1 ? iters : std::max(3, iters / 2);
      const double sec = TimedMedianWithCpu(2, n, g_span.cpu_ms * 1e-3, rx, uint64_t(nlayers), &cpu, [&] {
        std::vector<std::unique_ptr<WriteHandle>> hs;
        for (int l = 0; l < nlayers; ++l) {
          reqs[l].notification = {request++, l, 0};
          if (failed) return;
          auto h = ep.value()->Write(reqs[l]);
          if (!h.ok()) {
            std::fprintf(stderr, "[%s] %s write: %s\n", backend.c_str(), kase.c_str(),
                         h.status().ToString().c_str());
            failed = true;
            return;
          }
          hs.push_back(std::move(h).value());
        }
        for (auto& h : hs) {
          Status st = h->Wait(DeadlineAfterMs(20000));
          if (!st.ok()) {
            std::fprintf(stderr, "[%s] %s wait: %s\n", backend.c_str(), kase.c_str(), st.ToString().c_str());
            failed = true;
          }
          runs = h->transfers();
        }
      });
      if (failed) return;
      const uint64_t bytes = layer_bytes * nlayers;
      Row r{model_name, backend, kase, bytes, static_cast<size_t>(nlayers), runs * nlayers,
            bytes / sec / 1e9, 0, cpu};
      r.vs_peer = r.gbps / peer_gbps[nlayers == 1 ? "layer_contig" : "prompt_contig"];
      Emit(r, tokens);
    };
    auto idle_case = [&](const std::string& kase) {
      Row r{model_name, backend, kase, 0, 0, 0, 0, 0, IdleCpuSpan(rx, g_span.idle_ms)};
      Emit(r, tokens);
    };
    idle_case("idle_connected");
    run_case("layer_contig", 1, false);
    run_case("layer_scatter", 1, true);
    run_case("prompt_contig", layers, false);
    run_case("prompt_scatter", layers, true);
    if (!failed) idle_case("idle_after");
    ep.value().reset();
    rx.Send("COUNT");
    std::string count = rx.ReadLine(DeadlineAfterMs(10000));
    std::fprintf(stderr, "[%s] receiver: %s (writes posted: %llu)\n", backend.c_str(), count.c_str(),
                 (unsigned long long)(request - 1));
    reg.value().reset();
    t.value().reset();
    rx.Finish(DeadlineAfterMs(20000));
  }
  KV_BENCH_CUDA(cudaFree(src));
}

void PrintTable() {
  std::printf("\nnccl chunk: %s\n", g_chunk_bytes ? (std::to_string(g_chunk_bytes >> 20) + " MiB").c_str() : "default");
  std::printf("%-12s %-26s %-15s %10s %7s %9s %14s%s\n", "model", "backend", "case", "MiB", "runs",
              "GB/s", "x memcpyPeer", CpuHeader().c_str());
  for (const Row& r : g_rows) {
    std::printf("%-12s %-26s %-15s %10.1f %7zu %9.1f %14.3f%s\n", r.model.c_str(), r.backend.c_str(),
                r.kase.c_str(), r.bytes / 1048576.0, r.runs, r.gbps, r.vs_peer, CpuCells(r.cpu).c_str());
  }
}

}  // namespace
}  // namespace kvstream::bench

int main(int argc, char** argv) {
  using namespace kvstream::bench;
  auto args = ParseArgs(argc, argv);
  if (args.count("chunk-mb")) g_chunk_bytes = std::stoull(args["chunk-mb"]) << 20;
  g_trace = args.count("trace") && args["trace"] != "0";
  if (args["role"] == "receiver") return RunReceiver(args);
  int count = 0;
  const cudaError_t count_err = cudaGetDeviceCount(&count);
  if (count_err != cudaSuccess || count < 2) {
    std::printf("SKIP transfer_nccl: needs 2 GPUs (%d visible; cudaGetDeviceCount: %s)\n", count,
                cudaGetErrorString(count_err));
    return 77;
  }
  const int wdev = args.count("writer-device") ? std::stoi(args["writer-device"]) : 0;
  const int rdev = args.count("receiver-device") ? std::stoi(args["receiver-device"]) : 1;
  const int tokens = args.count("tokens") ? std::stoi(args["tokens"]) : 4096;
  const int iters = args.count("iters") ? std::stoi(args["iters"]) : 10;
  std::string models = args.count("models") ? args["models"] : "llama-3-8b,llama-2-7b";
  std::string backends = args.count("backends") ? args["backends"] : "cuda_ipc,nccl,nccl_pack,nccl_direct";
  if (args.count("json")) g_json.open(args["json"], std::ios::app);
  g_span = ParseCpuSpanFlags(args);
  int access = 0;
  cudaDeviceCanAccessPeer(&access, wdev, rdev);
  std::fprintf(stderr, "transfer_nccl: writer GPU %d, receiver GPU %d, peer access %d, %s\n", wdev, rdev,
               access, kvstream::transport::nccl::NcclVersionString().c_str());
  if (access) {
    KV_BENCH_CUDA(cudaSetDevice(wdev));
    cudaError_t e = cudaDeviceEnablePeerAccess(rdev, 0);
    if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) KV_BENCH_CUDA(e);
    (void)cudaGetLastError();
  }
  for (const auto& m : Split(models)) RunModel(m, tokens, iters, wdev, rdev, Split(backends));
  PrintTable();
  return 0;
}
