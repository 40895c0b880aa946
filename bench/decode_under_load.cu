// Decode attention under transfer load: the paged decode kernel (kernels/paged_attention.h,
// prefetch off and on) runs back to back on GPU 0 on a high-priority stream while a transfer
// moves KV into GPU 0's memory at a set rate on lowest-priority streams, paced by
// transport/pacing.h's TokenBucket on chunk issue (the rule PacedEndpoint applies):
//   d2d:  cudaMemcpyAsync device to device in 32 MiB chunks (the CUDA IPC backend's engine on
//         one GPU: a copy within GPU 0's memory, read and written there);
//   h2d:  cudaMemcpyAsync from pinned host memory in 16 MiB chunks (the host-staged path);
//   peer: cudaMemcpyPeerAsync from a ring on GPU 1 into GPU 0 in 32 MiB chunks, issued on a
//         GPU 1 stream (what the CUDA IPC backend does across GPUs: the writer, on the prefill's
//         GPU, pushes into the decode's pool over NVLink); needs two GPUs;
//   nccl: ncclSend on GPU 1 -> ncclRecv on GPU 0 in 32 MiB chunks, one group per chunk, over a
//         two-rank communicator made in this process (ncclCommInitAll); send and receive
//         streams at the lowest priority, as the nccl transport's are. The receive is a kernel on
//         GPU 0, so it competes with the decode kernel for SMs as well as for HBM. Needs two GPUs
//         and a build that found NCCL (bench/CMakeLists.txt). NCCL_NVLS_ENABLE is set to 0
//         unless the caller set it (send/receive does not use NVLink multicast).
// Rates: 0, 25, 50, 75, 100% of the transfer's own full speed (measured alone in this run), plus
// the rate PaceRateForItlTarget gives for a slowdown target (--itl-slowdown, default 1.2).
//
//   decode_under_load [--json FILE] [--models a,b] [--batches 8,32] [--contexts 4096,16384]
//                     [--kinds d2d,h2d,peer,nccl] [--rates 0,25,50,75,100] [--window-ms 240]
//                     [--itl-slowdown 1.2] [--quick] [--early]
//
// Default kinds: d2d,h2d, plus peer and nccl when two GPUs are visible (nccl only in a build with
// NCCL). Asking for peer or nccl with fewer than two GPUs, or nccl without NCCL, is refused.
//
// --early: the prefetch compared off/on is the early L2 prefetch (issued before the PDL wait,
// kernels/paged_attention.h) of the 16-warp schedule (kWideKernel), the variant the kernel's
// automatic choice uses at batch 1-8 GQA, instead of the in-loop prefetch of the v2 kernel.
//
// Per point and prefetch variant: kernel time (median per launch over the window) against idle
// (rate 0 of the same kind), achieved transfer rate (payload bytes completed / transfer time),
// device memory traffic on GPU 0 (kernel KV bytes/s + transfer HBM bytes/s) against the
// streaming-read and D2D-copy bandwidths of GPU 0 measured in this run. Transfer HBM bytes per
// payload byte on GPU 0, counted from where the payload is read and written: d2d 2 (read and
// written in GPU 0's HBM), h2d 1 (written), peer 1 (written; the read is GPU 1's HBM), nccl 1
// (the payload's write into the receive buffer). NCCL may stage through its own FIFO in GPU 0's
// memory (protocol and P2P mode dependent, not visible here): such extra traffic is not counted,
// so for nccl the figure is a lower bound of GPU 0's traffic. For peer and nccl the achieved rate
// is also given against the peer copy ceiling (cudaMemcpyPeer GPU 1 -> GPU 0 of 1 GiB alone,
// payload bytes/s), the link's own ceiling. Prefetch off and on alternate graph by graph within
// one window, under the same load.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>  // environ

#include "bench/bench_util.cuh"
#include "bench/paged_kv_sets.cuh"
#include "kernels/paged_attention.h"
#include "transport/pacing.h"

#if defined(KVSTREAM_BENCH_HAVE_NCCL)
#include <nccl.h>
#define NK(expr)                                                                          \
  do {                                                                                    \
    ncclResult_t r_ = (expr);                                                             \
    if (r_ != ncclSuccess) {                                                              \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr,                   \
                   ncclGetErrorString(r_));                                               \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)
constexpr bool kHaveNccl = true;
#else
constexpr bool kHaveNccl = false;
#endif

using kvstream::transport::ItlBudget;
using kvstream::transport::PaceRateForItlTarget;
using kvstream::transport::TokenBucket;
using namespace kvstream::kernels;
using namespace kvstream::bench;

namespace {

using Clock = std::chrono::steady_clock;
double Sec(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::vector<std::string> ParseStrs(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  std::string t;
  while (std::getline(ss, t, ',')) v.push_back(t);
  return v;
}

// ---- the transfer: chunked copies on a low-priority stream, paced on chunk issue ---------------

struct TransferSpec {
  std::string kind;       // d2d | h2d | peer | nccl
  const char* src;        // GPU 0 (d2d), pinned host (h2d) or GPU 1 (peer, nccl)
  char* dst;              // GPU 0
  size_t ring_bytes;      // src and dst are rings of this size (rotated past L2)
  size_t chunk_bytes;
  double hbm_per_byte;    // HBM bytes per payload byte on GPU 0 (see the header comment)
  cudaStream_t stream;    // the copy's stream (peer: on GPU 1); nccl: the receive stream (GPU 0)
  int stream_device;      // the device `stream` belongs to (completion events are made there)
  cudaStream_t send_stream = nullptr;  // nccl: the send stream (GPU 1)
#if defined(KVSTREAM_BENCH_HAVE_NCCL)
  ncclComm_t comm_recv = nullptr;  // nccl: rank 0 (GPU 0)
  ncclComm_t comm_send = nullptr;  // nccl: rank 1 (GPU 1)
#endif
};

// Runs copies until stopped; at most kDepth chunks queued on the stream so that a paced rate is
// the rate the copies actually start at (not a backlog), and full speed still keeps the engine
// busy. rate 0 = unlimited. A chunk counts as landed when its event on `stream` completed (for
// nccl the receive, i.e. the bytes are in GPU 0's buffer).
class TransferLoop {
 public:
  static constexpr int kDepth = 3;
  TransferLoop(const TransferSpec& spec, double rate_bytes_per_s) : spec_(spec) {
    if (rate_bytes_per_s > 0) {
      // Burst: 4 chunks, so that the issuing thread's wake-up jitter does not lose budget.
      bucket_ = std::make_unique<TokenBucket>(rate_bytes_per_s, 4 * spec.chunk_bytes);
    }
    thread_ = std::thread([this] { Run(); });
  }
  ~TransferLoop() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  double achieved_bytes_per_s() const { return seconds_ > 0 ? double(bytes_) / seconds_ : 0; }

 private:
  void Issue(size_t off) {
    const size_t n = spec_.chunk_bytes;
    if (spec_.kind == "peer") {
      CK(cudaMemcpyPeerAsync(spec_.dst + off, 0, spec_.src + off, 1, n, spec_.stream));
    } else if (spec_.kind == "nccl") {
#if defined(KVSTREAM_BENCH_HAVE_NCCL)
      // Both ranks are driven from this one thread: the pair must be one group.
      NK(ncclGroupStart());
      NK(ncclSend(spec_.src + off, n, ncclInt8, 0, spec_.comm_send, spec_.send_stream));
      NK(ncclRecv(spec_.dst + off, n, ncclInt8, 1, spec_.comm_recv, spec_.stream));
      NK(ncclGroupEnd());
#else
      std::fprintf(stderr, "nccl transfer in a build without NCCL\n");
      std::exit(1);
#endif
    } else {
      const auto kind = spec_.kind == "d2d" ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice;
      CK(cudaMemcpyAsync(spec_.dst + off, spec_.src + off, n, kind, spec_.stream));
    }
  }

  void Run() {
    // The current device is per thread: events live on the stream's device.
    CK(cudaSetDevice(spec_.stream_device));
    cudaEvent_t ev[kDepth];
    for (auto& e : ev) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    const size_t n_chunks = spec_.ring_bytes / spec_.chunk_bytes;
    std::deque<int> q;  // event slots in flight
    int next_slot = 0;
    size_t idx = 0;
    const auto t0 = Clock::now();
    while (!stop_.load(std::memory_order_relaxed)) {
      if (int(q.size()) == kDepth) {
        CK(cudaEventSynchronize(ev[q.front()]));
        bytes_ += spec_.chunk_bytes;
        q.pop_front();
      }
      if (bucket_) {
        const auto release = bucket_->Reserve(spec_.chunk_bytes);
        // Sleep in short steps so that Stop() is not held up by a far release time.
        while (!stop_.load(std::memory_order_relaxed) && Clock::now() < release) {
          std::this_thread::sleep_until(std::min(release, Clock::now() + std::chrono::milliseconds(2)));
        }
        if (stop_.load(std::memory_order_relaxed)) break;
      }
      Issue((idx++ % n_chunks) * spec_.chunk_bytes);
      CK(cudaEventRecord(ev[next_slot], spec_.stream));
      q.push_back(next_slot);
      next_slot = (next_slot + 1) % kDepth;
    }
    CK(cudaStreamSynchronize(spec_.stream));
    if (spec_.send_stream) CK(cudaStreamSynchronize(spec_.send_stream));
    bytes_ += q.size() * spec_.chunk_bytes;
    seconds_ = Sec(Clock::now() - t0);
    for (auto& e : ev) CK(cudaEventDestroy(e));
  }

  TransferSpec spec_;
  std::unique_ptr<TokenBucket> bucket_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  uint64_t bytes_ = 0;
  double seconds_ = 0;
};

// Payload bytes/s of the transfer alone at full speed for `ms`.
double TransferAlone(const TransferSpec& spec, int ms) {
  TransferLoop loop(spec, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  loop.Stop();
  return loop.achieved_bytes_per_s();
}

// cudaMemcpy device to device of `bytes` (one call), counted as bytes read + written.
double CopyGbps(cudaStream_t st, char* dst, const char* src, size_t bytes) {
  EventPair t;
  std::vector<double> ms;
  for (int r = 0; r < 8; ++r) {
    const double m = TimeOnStream(st, t, [&] { CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st)); });
    if (r >= 2) ms.push_back(m);
  }
  return 2.0 * double(bytes) / (Median(ms) * 1e-3) / 1e9;
}

// cudaMemcpyPeer of `bytes` (one call) from GPU 1 to GPU 0, issued on a GPU 1 stream, counted
// as payload bytes (one way: the link's ceiling). Leaves GPU 0 current.
double PeerCopyGbps(cudaStream_t st1, char* dst0, const char* src1, size_t bytes) {
  CK(cudaSetDevice(1));
  std::vector<double> ms;
  {
    EventPair t;
    for (int r = 0; r < 8; ++r) {
      const double m = TimeOnStream(st1, t, [&] { CK(cudaMemcpyPeerAsync(dst0, 0, src1, 1, bytes, st1)); });
      if (r >= 2) ms.push_back(m);
    }
  }
  CK(cudaSetDevice(0));
  return double(bytes) / (Median(ms) * 1e-3) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  std::vector<Model> models = {{"llama-3-8b", 32, 8}, {"llama-2-7b", 32, 32}};
  std::vector<int> batches = {8, 32};
  std::vector<int> contexts = {4096, 16384};
  std::vector<std::string> kinds;  // empty: the default for the GPUs found
  std::vector<int> rates = {0, 25, 50, 75, 100};
  int window_ms = 240;
  double itl_slowdown = 1.2;
  bool early = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return FlagValue(argc, argv, &i); };
    if (a == "--json") json_path = next();
    else if (a == "--batches") batches = ParseInts(next());
    else if (a == "--contexts") contexts = ParseInts(next());
    else if (a == "--rates") rates = ParseInts(next());
    else if (a == "--kinds") kinds = ParseStrs(next());
    else if (a == "--window-ms") window_ms = std::max(20, std::atoi(next().c_str()));
    else if (a == "--itl-slowdown") itl_slowdown = std::atof(next().c_str());
    else if (a == "--early") early = true;
    else if (a == "--models") {
      models = ModelsNamedIn(models, next());
    } else if (a == "--quick") {
      models = {{"llama-3-8b", 32, 8}};
      batches = {8};
      contexts = {4096};
      rates = {0, 50, 100};
      window_ms = 80;
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  for (const std::string& k : kinds) {
    if (k != "d2d" && k != "h2d" && k != "peer" && k != "nccl") {
      std::fprintf(stderr, "unknown transfer kind %s (d2d, h2d, peer, nccl)\n", k.c_str());
      return 2;
    }
  }
  if (std::find(rates.begin(), rates.end(), 0) == rates.end()) rates.insert(rates.begin(), 0);
  std::sort(rates.begin(), rates.end());

  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::fprintf(stderr, "no usable CUDA device\n");
    return 77;
  }
  auto cross_gpu = [](const std::string& k) { return k == "peer" || k == "nccl"; };
  if (kinds.empty()) {
    kinds = {"d2d", "h2d"};
    if (ndev >= 2) kinds.push_back("peer");
    if (ndev >= 2 && kHaveNccl) kinds.push_back("nccl");
  }
  for (const std::string& k : kinds) {
    if (cross_gpu(k) && ndev < 2) {
      std::fprintf(stderr,
                   "transfer kind %s moves KV from GPU 1 into GPU 0 and needs two GPUs; %d found "
                   "(run with --kinds d2d,h2d here)\n",
                   k.c_str(), ndev);
      return 2;
    }
    if (k == "nccl" && !kHaveNccl) {
      std::fprintf(stderr,
                   "transfer kind nccl: this build has no NCCL (bench/CMakeLists.txt builds the "
                   "NCCL part only where transport/nccl found NCCL >= 2.18)\n");
      return 2;
    }
  }
  const bool two_gpu = std::any_of(kinds.begin(), kinds.end(), cross_gpu);
  const bool use_nccl = std::find(kinds.begin(), kinds.end(), "nccl") != kinds.end();
  JsonLines json(json_path);
  auto emit = [&](const std::string& line) { json.Emit(line); };

  CK(cudaSetDevice(0));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  int prio_low = 0, prio_high = 0;
  CK(cudaDeviceGetStreamPriorityRange(&prio_low, &prio_high));
  cudaStream_t kst, xst, aux;
  CK(cudaStreamCreateWithPriority(&kst, cudaStreamNonBlocking, prio_high));
  CK(cudaStreamCreateWithPriority(&xst, cudaStreamNonBlocking, prio_low));
  CK(cudaStreamCreateWithFlags(&aux, cudaStreamNonBlocking));

  // Transfer rings: 1 GiB each (17x the L2), device source and destination, pinned host source.
  const size_t ring = size_t(1) << 30;
  char *d_src = nullptr, *d_dst = nullptr, *h_src = nullptr;
  CK(cudaMalloc(&d_src, ring));
  CK(cudaMalloc(&d_dst, ring));
  CK(cudaHostAlloc(&h_src, ring, cudaHostAllocPortable));
  std::memset(h_src, 0x5a, ring);
  FillRandomHalf<<<sms * 8, 512, 0, aux>>>(reinterpret_cast<__half*>(d_src), ring / 2, 7);
  CK(cudaGetLastError());
  uint32_t* sink = nullptr;
  CK(cudaMalloc(&sink, 4));
  CK(cudaStreamSynchronize(aux));

  // GPU 1 (peer, nccl): a source ring and a lowest-priority stream there (the writer's side).
  char* d1_src = nullptr;
  cudaStream_t xst1 = nullptr;
  int peer_access = 0;
  if (two_gpu) {
    CK(cudaDeviceCanAccessPeer(&peer_access, 1, 0));
    CK(cudaSetDevice(1));
    int lo1 = 0, hi1 = 0;
    CK(cudaDeviceGetStreamPriorityRange(&lo1, &hi1));
    CK(cudaStreamCreateWithPriority(&xst1, cudaStreamNonBlocking, lo1));
    // Direct NVLink writes into GPU 0 (without it cudaMemcpyPeer is staged through the host).
    if (peer_access) CK(cudaDeviceEnablePeerAccess(0, 0));
    CK(cudaMalloc(&d1_src, ring));
    FillRandomHalf<<<sms * 8, 512, 0, xst1>>>(reinterpret_cast<__half*>(d1_src), ring / 2, 11);
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(xst1));
    CK(cudaSetDevice(0));
  }
#if defined(KVSTREAM_BENCH_HAVE_NCCL)
  ncclComm_t comms[2] = {nullptr, nullptr};  // rank 0 = GPU 0 (receives), rank 1 = GPU 1
  int nccl_version = 0;
  if (use_nccl) {
    // NVLink multicast (NVLS) is not used by send/receive; keep it off unless the caller chose.
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    const int devs[2] = {0, 1};
    NK(ncclCommInitAll(comms, 2, devs));
    NK(ncclGetVersion(&nccl_version));
    // NCCL's own cudaDeviceEnablePeerAccess may leave "already enabled" as this thread's last
    // error; clear it so that the kernel-launch checks below see only their own.
    (void)cudaGetLastError();
    CK(cudaSetDevice(0));
  }
#else
  (void)use_nccl;
#endif

  auto spec_for = [&](const std::string& kind) {
    TransferSpec s;
    s.kind = kind;
    s.src = kind == "d2d" ? d_src : kind == "h2d" ? h_src : d1_src;
    s.dst = d_dst;
    s.ring_bytes = ring;
    s.chunk_bytes = kind == "h2d" ? (size_t(16) << 20) : (size_t(32) << 20);
    s.hbm_per_byte = kind == "d2d" ? 2.0 : 1.0;
    s.stream = kind == "peer" ? xst1 : xst;
    s.stream_device = kind == "peer" ? 1 : 0;
    if (kind == "nccl") {
      s.send_stream = xst1;
#if defined(KVSTREAM_BENCH_HAVE_NCCL)
      s.comm_recv = comms[0];
      s.comm_send = comms[1];
#endif
    }
    return s;
  };

  // Ceilings, measured at the start (and the streaming read again at the end).
  // peer_gbps: GPU 1 -> GPU 0 payload bytes/s (only where two_gpu; else 0).
  auto measure_ceilings = [&](const char* when, double* stream_gbps, double* copy_gbps,
                              double* peer_gbps) {
    *stream_gbps = StreamReadGbps(aux, reinterpret_cast<const uint4*>(d_src), ring / 16, sink, sms);
    *copy_gbps = CopyGbps(aux, d_dst, d_src, ring);
    *peer_gbps = two_gpu ? PeerCopyGbps(xst1, d_dst, d1_src, ring) : 0;
    std::ostringstream o;
    o << "{\"bench\":\"decode_under_load\",\"impl\":\"ceiling\",\"when\":\"" << when
      << "\",\"stream_read_gbps\":" << *stream_gbps << ",\"d2d_copy_gbps_rw\":" << *copy_gbps;
    if (two_gpu) o << ",\"peer_copy_gbps\":" << *peer_gbps;
    o << ",\"bytes\":" << ring << "}";
    emit(o.str());
  };
  double stream_gbps = 0, copy_gbps = 0, peer_gbps = 0;
  {
    std::ostringstream o;
    o << "{\"bench\":\"decode_under_load\",\"impl\":\"device\",\"gpu\":\"" << prop.name
      << "\",\"sms\":" << sms << ",\"l2_bytes\":" << prop.l2CacheSize << ",\"stream_priority_high\":"
      << prio_high << ",\"stream_priority_low\":" << prio_low << ",\"gpus\":" << ndev;
    if (two_gpu) o << ",\"peer_access_1_to_0\":" << (peer_access ? "true" : "false");
#if defined(KVSTREAM_BENCH_HAVE_NCCL)
    if (use_nccl) {
      // The NCCL_* settings in effect (they change NCCL's protocol, channels and copy engine use).
      o << ",\"nccl_version\":" << nccl_version << ",\"nccl_env\":{";
      bool first = true;
      for (char** e = environ; *e != nullptr; ++e) {
        const std::string kv = *e;
        const size_t eq = kv.find('=');
        if (kv.rfind("NCCL_", 0) != 0 || eq == std::string::npos) continue;
        o << (first ? "" : ",") << "\"" << kv.substr(0, eq) << "\":\"" << kv.substr(eq + 1) << "\"";
        first = false;
      }
      o << "}";
    }
#endif
    o << "}";
    emit(o.str());
  }
  measure_ceilings("start", &stream_gbps, &copy_gbps, &peer_gbps);
  std::vector<double> full(kinds.size());
  for (size_t k = 0; k < kinds.size(); ++k) {
    TransferAlone(spec_for(kinds[k]), 40);  // warm-up
    full[k] = TransferAlone(spec_for(kinds[k]), 200);
    std::ostringstream o;
    o << "{\"bench\":\"decode_under_load\",\"impl\":\"transfer_alone\",\"kind\":\"" << kinds[k]
      << "\",\"chunk_bytes\":" << spec_for(kinds[k]).chunk_bytes << ",\"gbps\":" << full[k] / 1e9
      << ",\"hbm_gbps\":" << full[k] * spec_for(kinds[k]).hbm_per_byte / 1e9 << "}";
    emit(o.str());
  }

  struct Row {
    std::string model, kind;
    int batch, ctx, rate_pct;  // rate_pct -1: the ITL-derived rate
    double set_gbps, xfer_gbps, us_off, us_on, slow_off, slow_on, pf_gain, pf_gain_idle;
    double total_gbps, frac_copy, frac_link;  // frac_link: peer/nccl rate / peer ceiling, else -1
  };
  std::vector<Row> rows;
  const int D = 128, bs = 16;
  const double min_rotated = 320.0 * (1 << 20);

  for (const Model& m : models) {
    for (int B : batches) {
      for (int ctx : contexts) {
        const KvSetShape shape = MakeKvSetShape(m, B, ctx, D, bs);
        const size_t set_bytes = shape.set_bytes;
        const int n_sets = std::max(1, int(std::ceil(min_rotated / double(set_bytes))));
        KvSets sets(shape, n_sets, aux, sms);  // freed at the end of this shape
        CK(cudaStreamSynchronize(aux));
        const size_t qn = shape.qn;
        __half* const d_out = sets.out();

        PagedDecodeParams p = sets.Params();
        if (early) {
          p.schedule = Schedule::kWideKernel;
          p.prefetch = Prefetch::kOff;
          p.num_blocks = int(shape.set_blocks);
        }
        sets.SetWorkspace(&p, PagedDecodeWorkspaceBytes(p));  // zeroed once: the workspace contract
        const Prefetch variants[2] = {Prefetch::kOff, Prefetch::kOn};
        auto set_params = [&](int s, Prefetch v) {
          PagedDecodeParams q = sets.ForSet(p, s);
          if (early) {
            q.early_prefetch = v;
          } else {
            q.prefetch = v;
          }
          return q;
        };
        // Both variants compute the same output (checked once per shape).
        std::vector<uint16_t> o_off(qn), o_on(qn);
        for (int v = 0; v < 2; ++v) {
          CK(PagedDecodeAttention(set_params(0, variants[v]), kst));
          CK(cudaStreamSynchronize(kst));
          CK(cudaMemcpy(v == 0 ? o_off.data() : o_on.data(), d_out, qn * 2, cudaMemcpyDeviceToHost));
        }
        const bool identical = std::memcmp(o_off.data(), o_on.data(), qn * 2) == 0;

        // One graph per variant: `launches` launches cycling through the sets, ~1 GiB of KV.
        const int min_launches = int(std::clamp(double(size_t(1) << 30) / double(set_bytes), 2.0, 64.0));
        const int launches = n_sets * std::max(1, (min_launches + n_sets - 1) / n_sets);
        cudaGraphExec_t exec[2] = {nullptr, nullptr};
        for (int v = 0; v < 2; ++v) {
          CK(CaptureGraph(kst, launches, [&](int l) {
            return PagedDecodeAttention(set_params(l % n_sets, variants[v]), kst);
          }, &exec[v]));
        }
        const double kv_bytes = double(B) * ctx * m.kv_heads * D * 2 * 2;
        // Replay time estimate, to size the windows.
        double replay_ms = 0;
        {
          EventPair t;
          for (int r = 0; r < 3; ++r)
            replay_ms = TimeOnStream(kst, t, [&] { CK(cudaGraphLaunch(exec[0], kst)); });
        }
        const int pairs = std::max(4, int(window_ms / (2 * replay_ms)));

        // One window: `pairs` x (off, on) replays queued back to back on the kernel stream; per-
        // launch time of each variant = median replay / launches.
        auto run_window = [&](double* us_off, double* us_on) {
          std::vector<cudaEvent_t> ev(2 * pairs + 1);
          for (auto& e : ev) CK(cudaEventCreate(&e));
          CK(cudaEventRecord(ev[0], kst));
          for (int i = 0; i < 2 * pairs; ++i) {
            CK(cudaGraphLaunch(exec[i % 2], kst));
            CK(cudaEventRecord(ev[i + 1], kst));
          }
          CK(cudaEventSynchronize(ev.back()));
          std::vector<double> t[2];
          for (int i = 0; i < 2 * pairs; ++i) {
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, ev[i], ev[i + 1]));
            t[i % 2].push_back(ms * 1e3 / launches);
          }
          for (auto& e : ev) CK(cudaEventDestroy(e));
          *us_off = Median(t[0]);
          *us_on = Median(t[1]);
        };
        CK(cudaGraphLaunch(exec[0], kst));  // warm-up
        CK(cudaGraphLaunch(exec[1], kst));
        CK(cudaStreamSynchronize(kst));

        for (size_t k = 0; k < kinds.size(); ++k) {
          const TransferSpec spec = spec_for(kinds[k]);
          double idle_off = 0, idle_on = 0;
          // Rates in % of this kind's full speed, then the ITL-derived one (-1).
          std::vector<int> pcts = rates;
          if (itl_slowdown > 1) pcts.push_back(-1);
          for (int pct : pcts) {
            double set_rate = 0;  // bytes/s; 0 = none (pct 0) or unlimited (pct 100)
            if (pct == -1) {
              ItlBudget b;
              b.itl_target_s = itl_slowdown * idle_off * 1e-6;
              b.idle_step_s = idle_off * 1e-6;
              b.device_bw_bytes_per_s = copy_gbps * 1e9;
              b.hbm_bytes_per_byte = spec.hbm_per_byte;
              auto r = PaceRateForItlTarget(b);
              if (!r.ok()) continue;
              set_rate = *r;
            } else if (pct > 0 && pct < 100) {
              set_rate = full[k] * pct / 100.0;
            }
            std::unique_ptr<TransferLoop> loop;
            if (pct != 0) {
              loop = std::make_unique<TransferLoop>(spec, set_rate);
              std::this_thread::sleep_for(std::chrono::milliseconds(15));
            }
            double us_off = 0, us_on = 0;
            run_window(&us_off, &us_on);
            double xfer = 0;
            if (loop) {
              loop->Stop();
              xfer = loop->achieved_bytes_per_s();
            }
            if (pct == 0) {
              idle_off = us_off;
              idle_on = us_on;
            }
            const double kernel_gbps_off = kv_bytes / (us_off * 1e-6) / 1e9;
            const double kernel_gbps_on = kv_bytes / (us_on * 1e-6) / 1e9;
            const double xfer_hbm = xfer * spec.hbm_per_byte / 1e9;
            const double frac_link = cross_gpu(kinds[k]) ? xfer / 1e9 / peer_gbps : -1;
            for (int v = 0; v < 2; ++v) {
              const double us = v == 0 ? us_off : us_on;
              const double idle = v == 0 ? idle_off : idle_on;
              const double kg = v == 0 ? kernel_gbps_off : kernel_gbps_on;
              std::ostringstream o;
              o << "{\"bench\":\"decode_under_load\",\"impl\":\"point\",\"model\":\"" << m.name
                << "\",\"heads\":" << m.heads << ",\"kv_heads\":" << m.kv_heads << ",\"head_dim\":" << D
                << ",\"block\":" << bs << ",\"dtype\":\"f16\",\"batch\":" << B << ",\"ctx\":" << ctx
                << ",\"kind\":\"" << kinds[k] << "\",\"rate_pct\":" << pct
                << ",\"rate_set_gbps\":" << (pct == 100 ? full[k] : set_rate) / 1e9
                << ",\"unlimited\":" << (pct == 100 ? "true" : "false")
                << ",\"prefetch\":" << (v == 1 ? "true" : "false")
                << ",\"prefetch_kind\":\"" << (early ? "early" : "in_loop") << "\"" << ",\"us\":" << us
                << ",\"us_idle\":" << idle << ",\"slowdown\":" << us / idle
                << ",\"pf_gain\":" << us_off / us_on << ",\"pf_gain_idle\":" << idle_off / idle_on
                << ",\"kernel_gbps\":" << kg << ",\"xfer_gbps\":" << xfer / 1e9
                << ",\"xfer_hbm_gbps\":" << xfer_hbm << ",\"total_gbps\":" << kg + xfer_hbm
                << ",\"frac_copy\":" << (kg + xfer_hbm) / copy_gbps
                << ",\"frac_stream\":" << (kg + xfer_hbm) / stream_gbps;
              if (frac_link >= 0) o << ",\"frac_link\":" << frac_link;
              o
                << ",\"kv_bytes\":" << kv_bytes << ",\"launches_per_graph\":" << launches
                << ",\"pairs\":" << pairs << ",\"n_sets\":" << n_sets
                << ",\"identical_outputs\":" << (identical ? "true" : "false") << "}";
              emit(o.str());
            }
            rows.push_back({m.name, kinds[k], B, ctx, pct, (pct == 100 ? full[k] : set_rate) / 1e9,
                            xfer / 1e9, us_off, us_on, us_off / idle_off, us_on / idle_on,
                            us_off / us_on, idle_off / idle_on,
                            kernel_gbps_off + xfer_hbm, (kernel_gbps_off + xfer_hbm) / copy_gbps,
                            frac_link});
          }
        }
        for (auto& e : exec) CK(cudaGraphExecDestroy(e));
      }
    }
  }
  double stream_end = 0, copy_end = 0, peer_end = 0;
  measure_ceilings("end", &stream_end, &copy_end, &peer_end);

  std::printf("\nceilings: streaming read %.0f GB/s (end %.0f), D2D copy %.0f GB/s read+written (end %.0f)",
              stream_gbps, stream_end, copy_gbps, copy_end);
  if (two_gpu) std::printf(", peer copy GPU1->GPU0 %.0f GB/s (end %.0f)", peer_gbps, peer_end);
  for (size_t k = 0; k < kinds.size(); ++k)
    std::printf("; %s alone %.1f GB/s", kinds[k].c_str(), full[k] / 1e9);
  std::printf("\nrate: %% of the transfer's full speed (itl = PaceRateForItlTarget at %.2fx); slow = us / us(idle);"
              " pf = us(off)/us(on); total = kernel(off) + transfer HBM GB/s on GPU 0; frac = total / D2D copy;"
              " link = transfer / peer copy (peer, nccl)\n",
              itl_slowdown);
  std::printf("%-10s %3s %6s %4s %5s | %8s %8s | %8s %8s %6s %6s | %6s %6s | %7s %5s %5s\n", "model",
              "B", "ctx", "kind", "rate", "set GB/s", "got GB/s", "us off", "us on", "slow0", "slow1",
              "pf", "pf idle", "total", "frac", "link");
  for (const Row& r : rows) {
    char rate[16];
    if (r.rate_pct == -1) std::snprintf(rate, sizeof rate, "itl");
    else std::snprintf(rate, sizeof rate, "%d%%", r.rate_pct);
    char link[16] = "-";
    if (r.frac_link >= 0) std::snprintf(link, sizeof link, "%.3f", r.frac_link);
    std::printf("%-10s %3d %6d %4s %5s | %8.1f %8.1f | %8.1f %8.1f %6.3f %6.3f | %6.3f %6.3f | %7.0f %5.3f %5s\n",
                r.model.c_str(), r.batch, r.ctx, r.kind.c_str(), rate, r.set_gbps, r.xfer_gbps,
                r.us_off, r.us_on, r.slow_off, r.slow_on, r.pf_gain, r.pf_gain_idle, r.total_gbps,
                r.frac_copy, link);
  }
  CK(cudaFree(d_src));
  CK(cudaFree(d_dst));
  CK(cudaFreeHost(h_src));
  CK(cudaFree(sink));
#if defined(KVSTREAM_BENCH_HAVE_NCCL)
  for (ncclComm_t c : comms)
    if (c) NK(ncclCommDestroy(c));
#endif
  if (two_gpu) {
    CK(cudaSetDevice(1));
    CK(cudaFree(d1_src));
    CK(cudaStreamDestroy(xst1));
    CK(cudaSetDevice(0));
  }
  CK(cudaStreamDestroy(kst));
  CK(cudaStreamDestroy(xst));
  CK(cudaStreamDestroy(aux));
  return 0;
}
