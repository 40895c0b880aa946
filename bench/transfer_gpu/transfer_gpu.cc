// transfer_gpu: GB/s of the GPU transport backends between two processes on one GPU, against
// the device's own copy bandwidth and pinned host<->device bandwidth measured in the same run.
//
//   transfer_gpu [--models=llama-3-8b,llama-2-7b] [--tokens=4096] [--iters=20]
//                [--backends=cuda_ipc,cuda_ipc_memcpy,ucx_host,ucx_staged] [--json=FILE] [--device=0]
//                [--rx-device=N] [--idle-ms=200] [--cpu-ms=200]
//
// --rx-device: the receiver process's GPU (default --device).
// Across a network hop: --rx-netns=PATH runs the receiver in the network namespace PATH names
// (e.g. /run/netns/NAME: it setns()es there before making its transport), and
// --ucx-net-devices / --rx-ucx-net-devices pin the writer's / receiver's UCX to a device (e.g.
// the two ends of a veth pair); UCX_TLS from the environment applies to both.
// Backend "ucx": the UCX backend moving the CUDA memory itself (needs a UCX built with CUDA:
// scripts/install-deps.sh --ucx-cuda); its rows compare against pinned H2D/D2H and ucx_host
// like ucx_staged's, and the transports UCX chose for it (ucp_ep_print_info) go to stderr. With two GPUs the pinned
// baselines are host->device on the receiver's GPU and device->host on the writer's, and
// "both at once" runs each on its own GPU (own PCIe link).
//
// ucx_staged variants: "ucx_staged" (zero-copy on a same-host peer when the mapping works),
// "ucx_staged_put" (zero-copy off: device -> pinned send buffer -> UCX put), either with
// ":cN" for N MiB chunks (both processes) and ":kN" for N credits (slots granted to the writer)
// and N send buffers, ":mN" for at least N chunks per write (min_chunks_per_write), e.g.
// ucx_staged:c16 or ucx_staged:c8:k3; ":aN" sets adaptive_chunk_fill to N KiB (0 = chunks of
// chunk_bytes always), ":pN" polls copy events every N us (0: busy wait). (":s0", one stream
// per side, and ":d0", no doorbells, were removed with their switches once measured:
// bench/results/transfer_staged_2026-11-29_v3.md.) Their rows carry "path"
// (zero_copy / ucx_put: what the endpoint actually used).
//
// Per model (KV layout from model/ presets, block 16 tokens, fp16) it moves one request's KV:
//   layer_contig   one layer, destination contiguous (1 run)
//   layer_scatter  one layer, destination blocks scattered over a pool twice that size
//   prompt_contig  every layer, one write per layer posted back to back (notify each), contiguous
//   prompt_scatter the same, destination blocks scattered
//   tiny_x32       cuda_ipc only: 32 writes of 4 KiB back to back (notify each): the per-Write()
//                  host cost with almost no copy behind it (the host path's floor)
// Time = host clock from the first Write() to the last WriteHandle::Wait() returning (data at
// the destination and the notification sent), median over --iters (backend
// rows: or more, see --cpu-ms below). Baselines, same bytes,
// same process, same clock: cudaMemcpyAsync device-to-device (+ stream sync), and pinned
// host->device / device->host cudaMemcpyAsync. Ratios: cuda_ipc* against D2D, ucx_staged
// against min(H2D, D2H) (the staged path does both) and against ucx_host: the UCX backend
// moving the same bytes host memory to host memory between the same two processes (the
// staged path's own network leg, its ceiling on a host where UCX is the slower part).
//
// Host/device breakdown (every backend row): write_host_us = mean host time inside Write() per
// call (clocked by the bench around each call); device_us = the device's own time for the same
// bytes (cudaEventElapsedTime around cudaMemcpyAsync D2D, measured in this run; contiguous).
// cuda_ipc rows also carry the backend's own Write() profile (EnableWriteProfile): plan_us
// (validation, coalescing), submit_us (CUDA calls), enqueue_us (hand-off), frames_per_batch
// (notifications per socket write of the completion thread), wakeups_per_write, kernel_share.
// Host CPU cost (every backend row, both processes): the measured iterations of a case (not
// its warm-ups; at least --iters, more until the span lasts --cpu-ms, 0 = exactly --iters, so
// that scheduler-tick granularity of the CPU clock stays small against it; the median is over
// all of them) are one span; each process's CPU time over it (CLOCK_PROCESS_CPUTIME_ID: user +
// system of all its threads, the transport's own included) gives writer_cores / receiver_cores
// (CPU seconds / wall seconds: 1.0 = one core busy throughout) and writer_cpu_us_per_write /
// receiver_cpu_us_per_write (per Write() call: one layer). The receiver reports its CPU time
// over the control pipe (command "CPU"), asked just before and just after the span. Two rows
// per backend have no writes: idle_connected (connected and registered, nothing written yet,
// --idle-ms of sleep in the writer) and idle_after (the same right after the last case's last
// Wait(): includes whatever the transport's threads do before they park); their median_us is
// the idle span. Fields: see CpuJson() in bench_common.h.
// Output: one JSON line per measurement on stdout (and --json FILE), then a table.
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
#include "tests/veth_pair.h"
#include "transport/cuda_ipc/cuda_ipc_transport.h"
#include "transport/transport.h"
#if KVSTREAM_HAVE_UCX_STAGED
#include "transport/staged/staged_transport.h"
#include "transport/ucx/ucx_transport.h"
#endif

namespace kvstream::bench {
namespace {

using transport::CopyOp;
using transport::MemoryKind;
using transport::PeerDescriptor;
using transport::Transport;
using transport::WriteHandle;
using transport::WriteRequest;

std::string g_net_devices;  // this process's UCX net devices (--ucx-net-devices / --rx-...)
std::string g_rx_netns, g_rx_net_devices;  // the receiver's (writer side)

Result<std::unique_ptr<Transport>> MakeBackend(const std::string& name, int device) {
  // cuda_ipc_packed: the previous pass's path (packed runs, <= 336 per launch), for
  // before/after in one run; the other cuda_ipc rows use the block-table kernel for paged writes.
  // cuda_ipc_early: the receiver asks for early notifications (gpu_landed_wait): each write's
  // notification leaves when its copy is enqueued (Wait() still returns at completion).
  if (name == "cuda_ipc" || name == "cuda_ipc_memcpy" || name == "cuda_ipc_kernel" ||
      name == "cuda_ipc_packed" || name == "cuda_ipc_early") {
    transport::cuda_ipc::CudaIpcOptions o;
    o.device = device;
    if (name == "cuda_ipc_memcpy") o.copy_mode = transport::cuda_ipc::CopyMode::kMemcpy;
    if (name == "cuda_ipc_kernel") o.copy_mode = transport::cuda_ipc::CopyMode::kKernel;
    o.block_table = name != "cuda_ipc_packed";
    o.gpu_landed_wait = name == "cuda_ipc_early";
    return transport::cuda_ipc::CreateCudaIpcTransport(o);
  }
#if KVSTREAM_HAVE_UCX_STAGED
  // ucx_host: the staged path's own UCX leg, host memory to host memory; ucx: CUDA memory.
  if (name == "ucx_host" || name == "ucx") {
    transport::TransportOptions o;
    o.backend = "ucx";
    o.ucx.admit_any = true;  // a benchmark: the receiver takes the writer's connection unasked
    o.ucx.net_devices = g_net_devices;
    auto t = transport::ucx::CreateUcxTransport(o);
    if (t.ok() && name == "ucx" && !(*t)->capabilities().cuda_memory) {
      return NotSupported("backend ucx: this UCX moves no CUDA memory (build one with "
                          "scripts/install-deps.sh --ucx-cuda)");
    }
    return t;
  }
  if (name.rfind("ucx_staged", 0) == 0) {
    transport::staged::StagedOptions o;
    o.device = device;
    o.ucx.admit_any = true;  // a benchmark: the receiver takes the writer's connection unasked
    o.ucx.net_devices = g_net_devices;
    const std::string base = name.substr(0, name.find(':'));
    if (auto c = name.find(":c"); c != std::string::npos) {
      const int mib = std::atoi(name.c_str() + c + 2);
      if (mib < 1 || mib > 256) return InvalidArgument("bad chunk size in " + name);
      o.chunk_bytes = size_t(mib) << 20;
    }
    if (auto m = name.find(":m"); m != std::string::npos) {
      const int n = std::atoi(name.c_str() + m + 2);
      if (n < 1 || n > 64) return InvalidArgument("bad min chunks in " + name);
      o.min_chunks_per_write = n;
    }
    if (auto k = name.find(":k"); k != std::string::npos) {
      const int n = std::atoi(name.c_str() + k + 2);
      if (n < 1 || n > 64) return InvalidArgument("bad credit count in " + name);
      o.credits_per_peer = o.send_buffers = n;
      o.recv_slots = std::max(o.recv_slots, 2 * n);
    }
    if (auto a = name.find(":a"); a != std::string::npos) {
      const int kib = std::atoi(name.c_str() + a + 2);
      if (kib < 0 || kib > 65536) return InvalidArgument("bad chunk fill in " + name);
      o.adaptive_chunk_fill = uint64_t(kib) << 10;
    }
    if (auto p = name.find(":p"); p != std::string::npos) {
      const int us = std::atoi(name.c_str() + p + 2);
      if (us < 0 || us > 1000) return InvalidArgument("bad poll interval in " + name);
      o.poll_us = us;
    }
    if (base == "ucx_staged_put") {
      o.zero_copy = transport::staged::ZeroCopy::kOff;
    } else if (base != "ucx_staged") {
      return NotSupported("backend " + name + " is not built into transfer_gpu");
    }
    return transport::staged::CreateStagedTransport(o);
  }
#endif
  return NotSupported("backend " + name + " is not built into transfer_gpu");
}

// ---- receiver process -------------------------------------------------------------------

int RunReceiver(const std::map<std::string, std::string>& args) {
  const std::string backend = args.at("backend");
  const int device = std::stoi(args.at("device"));
  if (args.count("netns") && !args.at("netns").empty()) {
    if (std::string why = kvstream::testing::EnterNetns(args.at("netns")); !why.empty()) {
      std::fprintf(stderr, "receiver: entering the network namespace: %s\n", why.c_str());
      return 1;
    }
  }
  if (args.count("ucx-net-devices")) g_net_devices = args.at("ucx-net-devices");
  KV_BENCH_CUDA(cudaSetDevice(device));
  // ucx_host: host memory on both sides (the staged backend's UCX leg alone).
  return ServeAsBenchReceiver(MakeBackend(backend, device), device, std::stoi(args.at("regions")),
                              std::stoull(args.at("region-bytes")),
                              /*host_memory=*/backend == "ucx_host");
}

// ---- writer side --------------------------------------------------------------------------

struct Row {
  std::string model, backend, kase, baseline;
  uint64_t bytes = 0;
  size_t writes = 0, runs = 0;
  double seconds = 0, gbps = 0, baseline_gbps = 0;
  double ucx_host_gbps = 0;  // ucx_staged rows: its UCX leg alone, same case, same run
  std::string path;          // ucx_staged rows: zero_copy or ucx_put
  double write_host_us = -1;  // mean host time per Write() call (bench clock)
  double device_us = -1;      // device time of the same bytes, D2D copy (event clock)
  bool have_profile = false;
  transport::cuda_ipc::WriteProfile profile;
  CpuSpan cpu;  // host CPU of both processes over the measured iterations (or the idle span)
};

std::vector<Row> g_rows;
std::map<std::string, double> g_ucx_host;  // "model/case" -> GB/s of ucx_host
std::ofstream g_json;

void Emit(const Row& r, int tokens) {
  std::ostringstream j;
  j.setf(std::ios::fixed);
  j.precision(3);
  j << "{\"bench\":\"transfer_gpu\",\"model\":\"" << r.model << "\",\"tokens\":" << tokens
    << ",\"backend\":\"" << r.backend << "\",\"case\":\"" << r.kase << "\",\"bytes\":" << r.bytes
    << ",\"writes\":" << r.writes << ",\"ops_per_write\":" << r.runs
    << ",\"median_us\":" << r.seconds * 1e6 << ",\"gbps\":" << r.gbps;
  if (!r.baseline.empty()) {
    j << ",\"baseline\":\"" << r.baseline << "\",\"baseline_gbps\":" << r.baseline_gbps
      << ",\"ratio\":" << (r.baseline_gbps > 0 ? r.gbps / r.baseline_gbps : 0);
  }
  if (!r.path.empty()) j << ",\"path\":\"" << r.path << "\"";
  if (r.ucx_host_gbps > 0) {
    j << ",\"ucx_host_gbps\":" << r.ucx_host_gbps << ",\"ratio_vs_ucx_host\":" << r.gbps / r.ucx_host_gbps;
  }
  if (r.write_host_us >= 0) j << ",\"write_host_us\":" << r.write_host_us;
  if (r.device_us >= 0) j << ",\"device_us\":" << r.device_us;
  if (r.have_profile && r.profile.writes > 0) {
    const auto& p = r.profile;
    const double w = double(p.writes);
    j << ",\"profile_writes\":" << p.writes << ",\"plan_us\":" << p.plan_ns / w / 1e3
      << ",\"submit_us\":" << p.submit_ns / w / 1e3 << ",\"copy_call_us\":" << p.copy_ns / w / 1e3
      << ",\"record_us\":" << p.record_ns / w / 1e3 << ",\"enqueue_us\":" << p.enqueue_ns / w / 1e3
      << ",\"write_total_us\":" << p.total_ns / w / 1e3
      << ",\"kernel_share\":" << p.kernel_writes / w << ",\"block_share\":" << p.block_writes / w
      << ",\"memcpy_calls_per_write\":" << p.memcpy_calls / w
      << ",\"frames_per_batch\":" << (p.notify_batches ? double(p.notify_frames) / p.notify_batches : 0)
      << ",\"wakeups_per_write\":" << p.wakeups / w;
  }
  j << CpuJson(r.cpu);
  j << "}";
  EmitJsonLine(j.str(), g_json);
  g_rows.push_back(r);
}

template <typename Fn>
double TimeIt(int iters, Fn fn) {
  return TimedMedian(3, iters, fn);  // after 3 warm-ups
}

CpuSpanFlags g_span;  // --idle-ms, --cpu-ms

struct Baselines {
  double d2d_layer = 0, d2d_prompt = 0, h2d_layer = 0, h2d_prompt = 0, d2h_layer = 0, d2h_prompt = 0;
  double bidir_layer = 0, bidir_prompt = 0;  // H2D and D2H of the same bytes at once, per direction
  double d2d_layer_dev_us = 0, d2d_prompt_dev_us = 0, d2d_tiny_dev_us = 0;  // event clock
};

// Device-clocked median (cudaEventElapsedTime) of the copies `fn` enqueues on `s`, in us.
template <typename Fn>
double DeviceTimeUs(int iters, cudaStream_t s, Fn fn) {
  cudaEvent_t a, b;
  KV_BENCH_CUDA(cudaEventCreate(&a));
  KV_BENCH_CUDA(cudaEventCreate(&b));
  std::vector<double> t;
  for (int i = 0; i < iters + 2; ++i) {
    KV_BENCH_CUDA(cudaEventRecord(a, s));
    fn();
    KV_BENCH_CUDA(cudaEventRecord(b, s));
    KV_BENCH_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    KV_BENCH_CUDA(cudaEventElapsedTime(&ms, a, b));
    if (i >= 2) t.push_back(ms * 1e3);
  }
  KV_BENCH_CUDA(cudaEventDestroy(a));
  KV_BENCH_CUDA(cudaEventDestroy(b));
  return Median(t);
}

void RunModel(const std::string& model_name, int tokens, int iters, int device, int rx_device,
              const std::vector<std::string>& backends) {
  auto cfg = model::PresetConfig(model_name);
  if (!cfg.ok()) Die(cfg.status().ToString());
  model::KvLayout layout{cfg->num_layers, cfg->num_kv_heads, cfg->head_dim, 16, cfg->kv_dtype};
  const int layers = layout.num_layers;
  const uint64_t bb = layout.block_bytes();
  const uint64_t blocks = static_cast<uint64_t>((tokens + 15) / 16);
  const uint64_t layer_bytes = blocks * bb;
  const uint64_t prompt_bytes = layer_bytes * layers;
  const uint64_t pool_blocks = 2 * blocks;  // receiver: blocks of one layer's region
  std::fprintf(stderr, "[%s] %d layers, block %llu B, %llu blocks, %.1f MiB/layer, %.1f MiB/prompt\n",
               model_name.c_str(), layers, (unsigned long long)bb, (unsigned long long)blocks,
               layer_bytes / 1048576.0, prompt_bytes / 1048576.0);

  KV_BENCH_CUDA(cudaSetDevice(device));
  void* src = nullptr;
  void* dst = nullptr;
  void* pinned = nullptr;
  KV_BENCH_CUDA(cudaMalloc(&src, prompt_bytes));
  KV_BENCH_CUDA(cudaMalloc(&dst, prompt_bytes));
  KV_BENCH_CUDA(cudaMemset(src, 0x3C, prompt_bytes));
  KV_BENCH_CUDA(cudaHostAlloc(&pinned, prompt_bytes, cudaHostAllocPortable));
  std::memset(pinned, 0x5A, prompt_bytes);
  cudaStream_t s;
  KV_BENCH_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  KV_BENCH_CUDA(cudaDeviceSynchronize());
  // Host -> device baselines land where the receiver's copies land: its GPU.
  void* rx_dst = dst;
  cudaStream_t rx_s = s;
  if (rx_device != device) {
    KV_BENCH_CUDA(cudaSetDevice(rx_device));
    KV_BENCH_CUDA(cudaMalloc(&rx_dst, prompt_bytes));
    KV_BENCH_CUDA(cudaStreamCreateWithFlags(&rx_s, cudaStreamNonBlocking));
    KV_BENCH_CUDA(cudaDeviceSynchronize());
    KV_BENCH_CUDA(cudaSetDevice(device));
  }

  Baselines b;
  auto copy_layers = [&](void* to, const void* from, cudaMemcpyKind kind, int n) {
    cudaStream_t cs = kind == cudaMemcpyHostToDevice ? rx_s : s;
    for (int l = 0; l < n; ++l) {
      KV_BENCH_CUDA(cudaMemcpyAsync(static_cast<char*>(to) + l * layer_bytes,
                                    static_cast<const char*>(from) + l * layer_bytes, layer_bytes, kind, cs));
    }
    KV_BENCH_CUDA(cudaStreamSynchronize(cs));
  };
  b.d2d_layer = layer_bytes / TimeIt(iters, [&] { copy_layers(dst, src, cudaMemcpyDeviceToDevice, 1); }) / 1e9;
  b.d2d_prompt = prompt_bytes / TimeIt(iters, [&] { copy_layers(dst, src, cudaMemcpyDeviceToDevice, layers); }) / 1e9;
  {
    auto enqueue = [&](int n, uint64_t bytes) {
      for (int l = 0; l < n; ++l) {
        KV_BENCH_CUDA(cudaMemcpyAsync(static_cast<char*>(dst) + l * layer_bytes,
                                   static_cast<const char*>(src) + l * layer_bytes, bytes,
                                   cudaMemcpyDeviceToDevice, s));
      }
    };
    b.d2d_layer_dev_us = DeviceTimeUs(iters, s, [&] { enqueue(1, layer_bytes); });
    b.d2d_prompt_dev_us = DeviceTimeUs(std::max(3, iters / 4), s, [&] { enqueue(layers, layer_bytes); });
    b.d2d_tiny_dev_us = DeviceTimeUs(iters, s, [&] { enqueue(32, 4096); });
  }
  b.h2d_layer = layer_bytes / TimeIt(iters, [&] { copy_layers(rx_dst, pinned, cudaMemcpyHostToDevice, 1); }) / 1e9;
  b.h2d_prompt = prompt_bytes / TimeIt(std::max(3, iters / 4), [&] { copy_layers(rx_dst, pinned, cudaMemcpyHostToDevice, layers); }) / 1e9;
  b.d2h_layer = layer_bytes / TimeIt(iters, [&] { copy_layers(pinned, src, cudaMemcpyDeviceToHost, 1); }) / 1e9;
  b.d2h_prompt = prompt_bytes / TimeIt(std::max(3, iters / 4), [&] { copy_layers(pinned, src, cudaMemcpyDeviceToHost, layers); }) / 1e9;
  {
    // The staged path runs D2H (writer) and H2D (receiver) at once: the same bytes both ways
    // concurrently, on two streams of this process, each direction with its own pinned buffer.
    void* pinned2 = nullptr;
    KV_BENCH_CUDA(cudaHostAlloc(&pinned2, prompt_bytes, cudaHostAllocPortable));
    std::memset(pinned2, 0x5A, prompt_bytes);
    cudaStream_t s2;
    KV_BENCH_CUDA(cudaSetDevice(rx_device));
    KV_BENCH_CUDA(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    KV_BENCH_CUDA(cudaSetDevice(device));
    auto both = [&](int n) {
      for (int l = 0; l < n; ++l) {
        KV_BENCH_CUDA(cudaMemcpyAsync(static_cast<char*>(rx_dst) + l * layer_bytes,
                                   static_cast<const char*>(pinned2) + l * layer_bytes, layer_bytes,
                                   cudaMemcpyHostToDevice, s2));
        KV_BENCH_CUDA(cudaMemcpyAsync(static_cast<char*>(pinned) + l * layer_bytes,
                                   static_cast<const char*>(src) + l * layer_bytes, layer_bytes,
                                   cudaMemcpyDeviceToHost, s));
      }
      KV_BENCH_CUDA(cudaStreamSynchronize(s));
      KV_BENCH_CUDA(cudaStreamSynchronize(s2));
    };
    b.bidir_layer = layer_bytes / TimeIt(iters, [&] { both(1); }) / 1e9;
    b.bidir_prompt = prompt_bytes / TimeIt(std::max(3, iters / 4), [&] { both(layers); }) / 1e9;
    KV_BENCH_CUDA(cudaStreamDestroy(s2));
    KV_BENCH_CUDA(cudaFreeHost(pinned2));
  }
  auto base_row = [&](const std::string& name, const std::string& kase, uint64_t bytes, size_t writes, double gbps) {
    Row r;
    r.model = model_name;
    r.backend = name;
    r.kase = kase;
    r.bytes = bytes;
    r.writes = writes;
    r.runs = 1;
    r.gbps = gbps;
    r.seconds = bytes / (gbps * 1e9);
    Emit(r, tokens);
  };
  base_row("cudaMemcpy_d2d", "layer_contig", layer_bytes, 1, b.d2d_layer);
  base_row("cudaMemcpy_d2d", "prompt_contig", prompt_bytes, layers, b.d2d_prompt);
  base_row("pinned_h2d", "layer_contig", layer_bytes, 1, b.h2d_layer);
  base_row("pinned_h2d", "prompt_contig", prompt_bytes, layers, b.h2d_prompt);
  base_row("pinned_d2h", "layer_contig", layer_bytes, 1, b.d2h_layer);
  base_row("pinned_d2h", "prompt_contig", prompt_bytes, layers, b.d2h_prompt);
  base_row("pinned_bidir", "layer_contig", layer_bytes, 1, b.bidir_layer);
  base_row("pinned_bidir", "prompt_contig", prompt_bytes, layers, b.bidir_prompt);
  KV_BENCH_CUDA(cudaFreeHost(pinned));
  KV_BENCH_CUDA(cudaFree(dst));
  if (rx_device != device) {
    KV_BENCH_CUDA(cudaFree(rx_dst));  // UVA: freed on its own device
    KV_BENCH_CUDA(cudaStreamDestroy(rx_s));
  }

  // Scattered destination blocks: a fixed random choice of `blocks` out of `pool_blocks`.
  std::mt19937_64 rng(42);
  std::vector<uint64_t> ids(pool_blocks);
  for (uint64_t i = 0; i < pool_blocks; ++i) ids[i] = i;
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(blocks);

  for (const std::string& backend : backends) {
    kvstream::testing::PeerProcess rx;
    PeerDescriptor peer;
    const std::string err = kvstream::testing::StartPeerReceiver(
        &rx,
        {"--role=receiver", "--backend=" + backend, "--device=" + std::to_string(rx_device),
         "--regions=" + std::to_string(layers),
         "--region-bytes=" + std::to_string(pool_blocks * bb), "--netns=" + g_rx_netns,
         "--ucx-net-devices=" + g_rx_net_devices},
        layers, 60000, &peer);
    if (!err.empty()) {
      std::fprintf(stderr, "[%s] receiver failed: %s\n", backend.c_str(), err.c_str());
      continue;
    }
    auto t = MakeBackend(backend, device);
    if (!t.ok()) Die(t.status().ToString());
    auto ep = t.value()->Connect(peer);
    if (!ep.ok()) Die(backend + " connect: " + ep.status().ToString());
    const bool host = backend == "ucx_host";
    std::vector<char> host_src;
    if (host) host_src.assign(prompt_bytes, 0x3C);
    auto reg = host ? t.value()->Register({host_src.data(), prompt_bytes, MemoryKind::kHost, -1})
                    : t.value()->Register({src, prompt_bytes, MemoryKind::kCuda, device});
    if (!reg.ok()) Die(reg.status().ToString());

    uint64_t expected_notes = 0;
    uint64_t next_req = 1;
    const bool ipc = backend.rfind("cuda_ipc", 0) == 0;
    if (ipc) transport::cuda_ipc::EnableWriteProfile(true);
    double write_ns = 0;  // host time inside Write(), summed since the last case started
    uint64_t write_calls = 0;
    // Scattered requests are built once, outside the clock (the caller's op list is not the
    // transport's cost; building 1024 ops per write took ~1-2 us of the measured time before).
    std::vector<WriteRequest> scatter_reqs(layers);
    for (int l = 0; l < layers; ++l) {
      WriteRequest& wr = scatter_reqs[l];
      wr.local = reg.value().get();
      wr.remote_region = l;
      wr.ops.reserve(blocks);
      for (uint64_t i = 0; i < blocks; ++i) wr.ops.push_back({l * layer_bytes + i * bb, ids[i] * bb, bb});
    }
    bool described = backend != "ucx" && backend != "ucx_host";  // ucp_ep_print_info printed
    auto run = [&](bool scatter, int nlayers, uint64_t tiny = 0) {
      std::vector<std::unique_ptr<WriteHandle>> hs;
      hs.reserve(nlayers);
      WriteRequest contig;
      for (int l = 0; l < nlayers; ++l) {
        WriteRequest& wr = scatter ? scatter_reqs[l] : contig;
        if (!scatter) {
          wr.local = reg.value().get();
          wr.remote_region = l;
          wr.ops = {{l * layer_bytes, 0, tiny ? tiny : layer_bytes}};
        }
        wr.notify = true;
        wr.notification = {next_req, l, 0};
        auto w0 = Clock::now();
        auto h = ep.value()->Write(wr);
        write_ns += SecondsSince(w0) * 1e9;
        write_calls++;
        if (!h.ok()) Die(backend + " write: " + h.status().ToString());
        hs.push_back(std::move(h).value());
        expected_notes++;
      }
      for (auto& h : hs) {
        Status st = h->Wait(DeadlineAfterMs(10000));
        if (!st.ok()) Die(backend + " wait: " + st.ToString());
      }
      next_req++;
      if (!described) {  // after the first write: the connection exists from then on
        described = true;
        auto info = transport::ucx::DescribeEndpoint(*ep.value());
        std::fprintf(stderr, "[%s] ucp_ep_print_info:\n%s\n", backend.c_str(),
                     info.ok() ? info->c_str() : info.status().ToString().c_str());
      }
    };
    // ucx (CUDA memory through UCX) is measured as the staged path is: against pinned copies
    // and against ucx_host, the same UCX path with host memory.
    const bool staged = backend.rfind("ucx_staged", 0) == 0 || host || backend == "ucx";
    std::string path;
#if KVSTREAM_HAVE_UCX_STAGED
    if (!host && staged && backend != "ucx") {
      path = transport::staged::EndpointPath(*ep.value());
      std::fprintf(stderr, "[%s] path %s\n", backend.c_str(), path.c_str());
    }
#endif
    const double base_layer = staged ? std::min(b.h2d_layer, b.d2h_layer) : b.d2d_layer;
    const double base_prompt = staged ? std::min(b.h2d_prompt, b.d2h_prompt) : b.d2d_prompt;
    const std::string base_name = staged ? "min(pinned_h2d,pinned_d2h)" : "cudaMemcpy_d2d";
    CpuSpan cpu;  // of the case just measured
    auto row = [&](const std::string& kase, uint64_t bytes, size_t writes, size_t runs, double sec, double base) {
      Row r;
      r.cpu = cpu;
      r.model = model_name;
      r.backend = backend;
      r.kase = kase;
      r.bytes = bytes;
      r.writes = writes;
      r.runs = runs;
      r.seconds = sec;
      r.gbps = bytes / sec / 1e9;
      r.baseline = base_name;
      r.baseline_gbps = base;
      r.path = path;
      if (staged && !host && g_ucx_host.count(model_name + "/" + kase)) {
        r.ucx_host_gbps = g_ucx_host[model_name + "/" + kase];
      }
      if (host) g_ucx_host[model_name + "/" + kase] = r.gbps;
      if (write_calls > 0) r.write_host_us = write_ns / write_calls / 1e3;
      r.device_us = kase == "tiny_x32"        ? b.d2d_tiny_dev_us
                    : kase.rfind("layer", 0) == 0 ? b.d2d_layer_dev_us
                                                 : b.d2d_prompt_dev_us;
      if (ipc) {
        r.have_profile = true;
        r.profile = transport::cuda_ipc::TakeWriteProfile();
      }
      Emit(r, tokens);
    };
    auto reset = [&] {
      write_ns = 0;
      write_calls = 0;
      if (ipc) (void)transport::cuda_ipc::TakeWriteProfile();
    };
    // Idle rows: no writes, no baseline; median_us = the idle span.
    auto idle_row = [&](const std::string& kase) {
      Row r;
      r.model = model_name;
      r.backend = backend;
      r.kase = kase;
      r.path = path;
      r.cpu = IdleCpuSpan(rx, g_span.idle_ms);
      r.seconds = r.cpu.writer_wall_s;
      Emit(r, tokens);
    };
    // The measured iterations of a case, after 3 warm-ups (as TimeIt), are one CPU span.
    auto time_case = [&](int n, uint64_t writes_per_call, auto fn) {
      return TimedMedianWithCpu(3, n, g_span.cpu_ms * 1e-3, rx, writes_per_call, &cpu, fn);
    };
    idle_row("idle_connected");
    double sec;
    reset();
    sec = time_case(iters, 1, [&] { run(false, 1); });
    row("layer_contig", layer_bytes, 1, 1, sec, base_layer);
    reset();
    sec = time_case(iters, 1, [&] { run(true, 1); });
    row("layer_scatter", layer_bytes, 1, blocks, sec, base_layer);
    reset();
    sec = time_case(std::max(3, iters / 4), layers, [&] { run(false, layers); });
    row("prompt_contig", prompt_bytes, layers, 1, sec, base_prompt);
    reset();
    sec = time_case(std::max(3, iters / 4), layers, [&] { run(true, layers); });
    row("prompt_scatter", prompt_bytes, layers, blocks, sec, base_prompt);
    if (ipc) {
      // 32 writes of 4 KiB: nearly no copy, so the time is the host path (Write(), completion,
      // notification). The baseline is 32 cudaMemcpyAsync of 4 KiB + one stream sync.
      reset();
      const int tiny_n = std::min(32, layers);
      sec = time_case(iters, tiny_n, [&] { run(false, tiny_n, 4096); });
      const double tiny_base = tiny_n * 4096.0 / TimeIt(iters, [&] {
        for (int l = 0; l < tiny_n; ++l) {
          KV_BENCH_CUDA(cudaMemcpyAsync(static_cast<char*>(src) + prompt_bytes - 4096 * (l + 1),
                                     static_cast<const char*>(src) + 4096 * l, 4096,
                                     cudaMemcpyDeviceToDevice, s));
        }
        KV_BENCH_CUDA(cudaStreamSynchronize(s));
      }) / 1e9;
      row("tiny_x32", uint64_t(tiny_n) * 4096, size_t(tiny_n), 1, sec, tiny_base);
    }
    idle_row("idle_after");

    // Every notification must have reached the receiver.
    auto deadline = DeadlineAfterMs(10000);
    uint64_t got = 0;
    while (!Expired(deadline)) {
      rx.Send("COUNT");
      std::string c = rx.ReadLine(DeadlineAfterMs(5000));
      std::istringstream ci(c);
      std::string ctag;
      ci >> ctag >> got;
      if (got == expected_notes) break;
      usleep(10000);
    }
    std::fprintf(stderr, "[%s] receiver got %llu of %llu notifications\n", backend.c_str(),
                 (unsigned long long)got, (unsigned long long)expected_notes);
    if (got != expected_notes) Die("notifications missing");
    ep.value().reset();
    reg.value().reset();
    t.value().reset();
    rx.Finish(DeadlineAfterMs(10000));
  }
  KV_BENCH_CUDA(cudaStreamDestroy(s));
  KV_BENCH_CUDA(cudaFree(src));
}

void PrintTable() {
  std::printf("\n%-12s %-22s %-15s %10s %7s %10s %10s %9s %8s%s %7s\n", "model", "backend", "case",
              "MiB", "ops", "us", "GB/s", "Write()us", "dev us", CpuHeader().c_str(), "ratio");
  for (const Row& r : g_rows) {
    std::printf("%-12s %-22s %-15s %10.1f %7zu %10.1f %10.1f", r.model.c_str(), r.backend.c_str(),
                r.kase.c_str(), r.bytes / 1048576.0, r.runs, r.seconds * 1e6, r.gbps);
    if (r.write_host_us >= 0) {
      std::printf(" %9.2f %8.1f", r.write_host_us, r.device_us);
    } else {
      std::printf(" %9s %8s", "-", "-");
    }
    std::printf("%s", CpuCells(r.cpu).c_str());
    if (!r.baseline.empty()) std::printf(" %7.3f  (vs %s %.1f GB/s)", r.gbps / r.baseline_gbps,
                                         r.baseline.c_str(), r.baseline_gbps);
    if (!r.path.empty()) std::printf("  [%s]", r.path.c_str());
    if (r.ucx_host_gbps > 0) std::printf("  %.3f of ucx_host %.1f GB/s", r.gbps / r.ucx_host_gbps, r.ucx_host_gbps);
    if (r.have_profile && r.profile.writes > 0) {
      const double w = double(r.profile.writes);
      std::printf("  [plan %.2f submit %.2f (copy %.2f record %.2f) enqueue %.2f us/write, %.1f notes/batch, %.2f wakes/write]",
                  r.profile.plan_ns / w / 1e3, r.profile.submit_ns / w / 1e3,
                  r.profile.copy_ns / w / 1e3, r.profile.record_ns / w / 1e3,
                  r.profile.enqueue_ns / w / 1e3,
                  r.profile.notify_batches ? double(r.profile.notify_frames) / r.profile.notify_batches : 0.0,
                  r.profile.wakeups / w);
    }
    std::printf("\n");
  }
}

}  // namespace
}  // namespace kvstream::bench

int main(int argc, char** argv) {
  using namespace kvstream::bench;
  auto args = ParseArgs(argc, argv);
  if (args.count("role") && args["role"] == "receiver") return RunReceiver(args);
  int count = 0;
  const cudaError_t count_err = cudaGetDeviceCount(&count);
  if (count_err != cudaSuccess || count == 0) {
    std::fprintf(stderr, "transfer_gpu: no usable CUDA device (cudaGetDeviceCount: %s, %d devices)\n",
                 cudaGetErrorString(count_err), count);
    return 77;
  }
  const int tokens = args.count("tokens") ? std::stoi(args["tokens"]) : 4096;
  const int iters = args.count("iters") ? std::stoi(args["iters"]) : 20;
  const int device = args.count("device") ? std::stoi(args["device"]) : 0;
  const int rx_device = args.count("rx-device") ? std::stoi(args["rx-device"]) : device;
  if (device >= count || rx_device < 0 || rx_device >= count) {
    std::fprintf(stderr, "transfer_gpu: --device=%d / --rx-device=%d: %d GPUs usable\n", device, rx_device, count);
    return 77;
  }
  std::string backends = "cuda_ipc,cuda_ipc_memcpy";
#if KVSTREAM_HAVE_UCX_STAGED
  backends += ",ucx_host,ucx_staged";
#endif
  if (args.count("backends")) backends = args["backends"];
  if (args.count("rx-netns")) g_rx_netns = args["rx-netns"];
  if (args.count("ucx-net-devices")) g_net_devices = args["ucx-net-devices"];
  if (args.count("rx-ucx-net-devices")) g_rx_net_devices = args["rx-ucx-net-devices"];
  std::string models = args.count("models") ? args["models"] : "llama-3-8b,llama-2-7b";
  if (args.count("json")) g_json.open(args["json"], std::ios::app);
  g_span = ParseCpuSpanFlags(args);
  for (const auto& m : Split(models)) RunModel(m, tokens, iters, device, rx_device, Split(backends));
  PrintTable();
  return 0;
}
