// The transport conformance suite (tests/transport/conformance/) over device and managed
// memory (label gpu): the GPU backends (cuda_ipc; ucx_staged with zero-copy, with UCX puts, in
// 1 MiB chunks, and polling instead of a busy wait; nccl, which needs two GPUs), each also
// with host memory, and the CPU backends with CUDA memory, which their capabilities refuse
// (skipped with that reason) unless UCX was built with CUDA: then the ucx configurations run
// the peer-process cases too, their receiver on the same UCX_TLS. Real processes on one GPU:
// the receiver of the peer-process cases is this binary re-executed with --helper=receiver
// (tests/transport/gpu/gpu_peer.h). And the ucx_staged receiver's slot reclaim after a killed
// writer (StagedReclaimTest).
//
// Without a usable GPU the binary prints why and exits 77 (CTest: skipped).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include "common/cuda_vmm.h"
#include "common/status.h"
#include "common/time.h"
#include "tests/transport/conformance/in_process_cases.h"
#include "tests/transport/conformance/peer_process_cases.h"
#include "tests/transport/gpu/gpu_peer.h"
#include "tests/transport/gpu/gpu_peer_test.h"
#include "tests/transport/test_util.h"
#include "transport/cuda_ipc/cuda_ipc_transport.h"
#include "transport/transport.h"
#if KVSTREAM_HAVE_UCX_STAGED
#include "transport/staged/staged_transport.h"
#endif
#if KVSTREAM_HAVE_NCCL
#include "tests/transport/nccl/make_nccl.h"
#include "transport/nccl/nccl_transport.h"
#endif

namespace kvstream::transport::conformance {
namespace {

int g_gpus = 0;


Result<std::unique_ptr<Transport>> MakeBackend(const std::string& name, int device,
                                               cuda_ipc::CopyMode mode = cuda_ipc::CopyMode::kAuto,
                                               bool block_table = true) {
  if (name == "cuda_ipc") {
    cuda_ipc::CudaIpcOptions o;
    o.device = device;
    o.copy_mode = mode;
    o.block_table = block_table;
    return cuda_ipc::CreateCudaIpcTransport(o);
  }
#if KVSTREAM_HAVE_UCX_STAGED
  // ucx_staged: zero-copy where the peer is on this host; ucx_staged_put: UCX puts always;
  // ucx_staged_c1: zero-copy in 1 MiB chunks (every write of the tests spans several chunks,
  // which may land in any order); ucx_staged_plain: zero-copy with fixed-size chunks and 20 us
  // sleeps between looks at the copies instead of a busy wait.
  if (name == "ucx_staged" || name == "ucx_staged_put" || name == "ucx_staged_c1" ||
      name == "ucx_staged_plain") {
    staged::StagedOptions o;
    o.device = device;
    if (name == "ucx_staged_put") o.zero_copy = staged::ZeroCopy::kOff;
    if (name == "ucx_staged_c1") o.chunk_bytes = 1 << 20;
    if (name == "ucx_staged_plain") {
      o.adaptive_chunk_fill = 0;
      o.poll_us = 20;
    }
    return staged::CreateStagedTransport(o);
  }
#endif
#if KVSTREAM_HAVE_NCCL
  if (name == "nccl") return MakeNccl(device);
#endif
  (void)device;
  return NotSupported("backend " + name + " not built");
}

// The ucx configurations' writer and receiver: the configuration's UCX_TLS.
TransportMaker UcxMaker(const std::string& tls) {
  return [tls] {
    TransportOptions o;
    o.backend = "ucx";
    o.ucx.tls = tls;
    return CreateTransport(o);
  };
}

bool IsGpuBackend(const std::string& b) { return b == "cuda_ipc" || b == "nccl" || b.rfind("ucx_staged", 0) == 0; }

std::vector<Config> GpuConfigs() {
  std::vector<std::string> gpu = {"cuda_ipc"};
#if KVSTREAM_HAVE_UCX_STAGED
  for (const char* b : {"ucx_staged", "ucx_staged_put", "ucx_staged_c1", "ucx_staged_plain"}) gpu.push_back(b);
#endif
#if KVSTREAM_HAVE_NCCL
  gpu.push_back("nccl");
#endif
  std::vector<Config> out;
  for (const std::string& b : gpu) {
    const std::string name = b.rfind("ucx_staged", 0) == 0 ? "ucx_staged" : b;
    const int reader = b == "nccl" ? 1 : 0;  // nccl: two ranks on one GPU are refused
    for (Memory m : {Memory::kDevice, Memory::kManaged, Memory::kHost}) {
      out.push_back(Config{b, name, m, 0, reader, {}, /*refuses_foreign_registration=*/b == "nccl"});
    }
  }
  // The CPU backends over CUDA memory (their capabilities say whether they move it), and UCX
  // on its network path for CUDA memory (TCP beside its CUDA copy transport).
  std::vector<test::BackendConfig> cpu = test::AllConfigs();
  for (const test::BackendConfig& c : test::AllConfigs()) {
    if (c.label == "ucx_tcp") cpu.push_back({"ucx_tcp_cuda", test::Options("ucx", "tcp,cuda_copy")});
  }
  for (const test::BackendConfig& c : cpu) {
    for (Memory m : {Memory::kDevice, Memory::kManaged}) {
      out.push_back(Config{c.label, c.options.backend, m, 0, 0, c.options});
    }
  }
  return out;
}

}  // namespace

Result<std::unique_ptr<Transport>> MakeTransport(const Config& c, int device) {
  if (IsGpuBackend(c.backend)) return MakeBackend(c.backend, device);
  return CreateTransport(c.options);
}

// Device memory is shareable (common/cuda_vmm.h), a KV pool's kind: cuda_ipc writes only into
// such memory. Its owners, by address.
std::mutex g_shareable_mu;
std::map<void*, std::unique_ptr<cuda_vmm::ShareableDeviceMemory>> g_shareable;

void* AllocateMemory(Memory m, int device, size_t bytes) {
  if (m == Memory::kHost) return std::calloc(1, bytes);
  void* p = nullptr;
  if (cudaSetDevice(device) != cudaSuccess) return nullptr;
  std::unique_ptr<cuda_vmm::ShareableDeviceMemory> owner;
  if (m == Memory::kDevice) {
    auto s = cuda_vmm::ShareableDeviceMemory::Allocate(device, bytes);
    if (!s.ok()) return nullptr;
    owner = std::move(s).value();
    p = owner->data();
  } else if (cudaMallocManaged(&p, bytes) != cudaSuccess) {
    return nullptr;
  }
  if (cudaMemset(p, 0, bytes) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
    if (!owner) cudaFree(p);
    return nullptr;
  }
  if (owner) {
    std::lock_guard<std::mutex> lock(g_shareable_mu);
    g_shareable[p] = std::move(owner);
  }
  return p;
}

void FreeMemory(Memory m, void* p) {
  if (m == Memory::kHost) {
    std::free(p);
  } else if (m == Memory::kDevice) {
    std::unique_ptr<cuda_vmm::ShareableDeviceMemory> owner;
    {
      std::lock_guard<std::mutex> lock(g_shareable_mu);
      auto it = g_shareable.find(p);
      if (it != g_shareable.end()) {
        owner = std::move(it->second);
        g_shareable.erase(it);
      }
    }
  } else {
    cudaFree(p);
  }
}

void CopyMemory(void* dst, const void* src, size_t n) {
  cudaPointerAttributes a{};
  const bool to_gpu = cudaPointerGetAttributes(&a, dst) == cudaSuccess &&
                      (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged);
  cudaGetLastError();
  if (cudaMemcpy(dst, src, n, cudaMemcpyDefault) != cudaSuccess) {
    ADD_FAILURE() << "cudaMemcpy of " << n << " bytes failed";
    return;
  }
  // A copy from pageable memory may return before its DMA is done.
  if (to_gpu && cudaDeviceSynchronize() != cudaSuccess) ADD_FAILURE() << "cudaDeviceSynchronize failed";
}

int VisibleGpus() { return g_gpus; }

// ---- the peer-process cases' hooks (peer_process_cases.h) -----------------------------------

bool HasPeerProcess(const Config& c) {
  return c.backend == "cuda_ipc" || c.backend == "nccl" || c.backend.rfind("ucx_staged", 0) == 0 ||
         c.name == "ucx";
}

// The receiver: this binary with --helper=receiver on the configuration's reader device (nccl's
// on GPU 1).
void OpenPeer(const Config& c, Link* l, TransportMaker make) {
  const bool ucx = c.name == "ucx";
  const std::string backend = ucx ? std::string("ucx") : c.backend;
  if (!make) make = ucx ? UcxMaker(c.options.ucx.tls) : [backend] { return MakeBackend(backend, 0); };
  const int64_t start_ms = backend == "nccl" ? 30000 : 20000;
  OpenLink({"--helper=receiver", "--backend=" + backend, "--device=" + std::to_string(c.reader_device),
            "--ucx-tls=" + c.options.ucx.tls},
           start_ms, make, l);
}

PeerBounds BoundsOf(const Config& c) {
  if (c.backend == "nccl") return PeerBounds{20000, 15000, /*expect_split=*/true, 64};
  return PeerBounds{};
}

std::vector<WriterVariant> ScatterVariants(const Config& c) {
  std::vector<WriterVariant> out;
  const std::string backend = c.backend;
#if KVSTREAM_HAVE_NCCL
  if (backend == "nccl") {
    for (auto mode : {nccl::CopyMode::kPack, nccl::CopyMode::kDirect, nccl::CopyMode::kAuto}) {
      out.push_back({1000 + static_cast<uint64_t>(mode), [mode] { return MakeNccl(0, mode); }});
    }
    return out;
  }
#endif
  if (c.name == "ucx") return {{1000, UcxMaker(c.options.ucx.tls)}};
  // cuda_ipc: copy engine, block-table kernel (the default for these paged writes), packed-run
  // kernel (the previous path, block_table off), and auto mode with the block table.
  struct Variant {
    cuda_ipc::CopyMode mode;
    bool block_table;
    uint64_t serial;
  };
  for (Variant v : {Variant{cuda_ipc::CopyMode::kMemcpy, true, 1000},
                    Variant{cuda_ipc::CopyMode::kKernel, true, 1001},
                    Variant{cuda_ipc::CopyMode::kKernel, false, 1002},
                    Variant{cuda_ipc::CopyMode::kAuto, true, 1003}}) {
    if (backend != "cuda_ipc" && v.serial != 1000) continue;
    out.push_back({v.serial, [backend, v] { return MakeBackend(backend, 0, v.mode, v.block_table); }});
  }
  return out;
}

std::vector<WriterVariant> StreamVariants(const Config& c) {
#if KVSTREAM_HAVE_NCCL
  if (c.backend == "nccl") {
    std::vector<WriterVariant> out;
    for (auto mode : {nccl::CopyMode::kPack, nccl::CopyMode::kDirect}) {
      out.push_back({2000 + static_cast<uint64_t>(mode), [mode] { return MakeNccl(0, mode); }});
    }
    return out;
  }
#endif
  const std::string backend = c.backend;
  if (c.name == "ucx") return {{2000, UcxMaker(c.options.ucx.tls)}};
  return {{2000, [backend] { return MakeBackend(backend, 0); }}};
}

void CheckFreshLink(const Config& c, const Link& l) {
  if (c.backend == "nccl") {
    std::printf("[nccl] connect (communicator init) took %.0f ms\n", l.connect_ms);
    return;
  }
#if KVSTREAM_HAVE_UCX_STAGED
  if (c.backend == "cuda_ipc") return;
  if (c.name == "ucx") return;
  // The receiver is another process on this host: zero-copy unless turned off. Asserted where
  // the caller says the host allows it (KVSTREAM_EXPECT_ZERO_COPY=1), printed always.
  const std::string path = staged::EndpointPath(*l.ep);
  std::printf("[%s] path %s\n", c.backend.c_str(), path.c_str());
  if (c.backend == "ucx_staged_put") {
    EXPECT_EQ(path, "ucx_put");
  }
  const char* want = std::getenv("KVSTREAM_EXPECT_ZERO_COPY");
  if (c.backend != "ucx_staged_put" && want != nullptr && std::string(want) == "1") {
    EXPECT_EQ(path, "zero_copy");
  }
#endif
}

namespace {

// Receiver helper process on `device`: the sink runs on the transport's thread; blocking there
// is the test's choice (it checks the data at the moment the notification arrives).
int RunReceiver(const std::string& backend, int device, const std::string& ucx_tls) {
  if (cudaSetDevice(device) != cudaSuccess) {
    PeerSay("ERROR cudaSetDevice " + std::to_string(device));
    return 1;
  }
  Result<std::unique_ptr<Transport>> made = NotSupported("backend " + backend + " not built");
#if KVSTREAM_HAVE_NCCL
  // Small staging chunks so that the test's 6 MiB writes cross several chunks.
  if (backend == "nccl") made = MakeNccl(device, nccl::CopyMode::kAuto, 1 << 20);
#endif
  if (backend != "nccl") made = MakeBackend(backend, device);
  if (backend == "ucx") made = UcxMaker(ucx_tls)();
  return ServeAsReceiver(
      std::move(made), device, kPeerRegions, kPeerRegionBytes, /*host_memory=*/false,
      [device](const ReceiverPool& pool) { return CheckingSink(pool, device); }, HashCommand);
}

INSTANTIATE_TEST_SUITE_P(Backends, TransportConformance, ::testing::ValuesIn(GpuConfigs()),
                         ConfigName);

#if KVSTREAM_HAVE_UCX_STAGED
// ---------------------------------------------------------------------------------------------
// A staged writer killed while it holds the receiver's slots: the receiver must hand them to
// the next writer (it used to keep them until restart: with every slot held by dead writers,
// no writer could connect any more).

std::string EncodePeer(const PeerDescriptor& d) {
  std::string out = ToHex(d.address);
  for (const RemoteRegion& r : d.regions) {
    out += ',';
    out += ToHex(r.key);
    out += ':';
    out += std::to_string(r.addr);
    out += ':';
    out += std::to_string(r.length);
  }
  return out;
}

PeerDescriptor DecodePeer(const std::string& s) {
  PeerDescriptor d;
  std::istringstream in(s);
  std::string part;
  bool first = true;
  while (std::getline(in, part, ',')) {
    if (first) {
      d.address = FromHex(part);
      first = false;
      continue;
    }
    RemoteRegion r;
    const size_t a = part.find(':'), b = part.find(':', a + 1);
    r.key = FromHex(part.substr(0, a));
    r.addr = std::stoull(part.substr(a + 1, b - a - 1));
    r.length = std::stoull(part.substr(b + 1));
    d.regions.push_back(r);
  }
  return d;
}

constexpr uint64_t kReclaimBytes = 4ull << 20;

// Helper process: connects, lands one write of 0x11 bytes, says WROTE, then holds its slots
// until killed.
int RunWriter(const std::string& backend, const std::string& peer) {
  auto t = MakeBackend(backend, 0);
  if (!t.ok()) {
    std::printf("ERROR %s\n", t.status().ToString().c_str());
    return 1;
  }
  void* src = nullptr;
  if (cudaMalloc(&src, kReclaimBytes) != cudaSuccess || cudaMemset(src, 0x11, kReclaimBytes) != cudaSuccess ||
      cudaDeviceSynchronize() != cudaSuccess) {
    std::printf("ERROR cuda\n");
    return 1;
  }
  auto reg = t.value()->Register({src, kReclaimBytes, MemoryKind::kCuda, 0});
  if (!reg.ok()) {
    std::printf("ERROR %s\n", reg.status().ToString().c_str());
    return 1;
  }
  auto ep = t.value()->Connect(DecodePeer(peer));
  if (!ep.ok()) {
    std::printf("ERROR %s\n", ep.status().ToString().c_str());
    return 1;
  }
  // The receiver (the test) admits our connection before we write.
  std::printf("TICKET %s\n", ToHex(ep.value()->AdmissionTicket()).c_str());
  std::fflush(stdout);
  std::string go;
  if (!std::getline(std::cin, go) || go != "GO") return 1;
  WriteRequest wr;
  wr.local = reg.value().get();
  wr.ops = {{0, 0, kReclaimBytes}};
  auto h = ep.value()->Write(wr);
  Status s = h.ok() ? h.value()->Wait(DeadlineAfterMs(10000)) : h.status();
  std::printf("%s %s\n", s.ok() ? "WROTE" : "ERROR", staged::EndpointPath(*ep.value()).c_str());
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  return 0;
}

class StagedReclaimTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { CUDA_OK(cudaSetDevice(0)); }
};

TEST_P(StagedReclaimTest, KilledWritersSlotsGoToTheNextWriter) {
  const bool zero_copy = GetParam() == "ucx_staged";
  // Four slots, all four granted to one writer: while a dead writer keeps them, nobody else
  // gets one. A zero-copy writer's slots come back when its process has exited (the 60 s
  // quarantine is far beyond the test's deadlines); a put writer's after the quarantine.
  staged::StagedOptions ro;
  ro.device = 0;
  ro.chunk_bytes = 1 << 20;
  ro.recv_slots = 4;
  ro.credits_per_peer = 4;
  ro.reclaim_quarantine_ms = zero_copy ? 60000 : 1500;
  auto rx = staged::CreateStagedTransport(ro);
  ASSERT_OK(rx.status());
  void* pool = nullptr;
  CUDA_OK(cudaMalloc(&pool, kReclaimBytes));
  CUDA_OK(cudaMemset(pool, 0, kReclaimBytes));
  CUDA_OK(cudaDeviceSynchronize());
  auto pool_reg = rx.value()->Register({pool, kReclaimBytes, MemoryKind::kCuda, 0});
  ASSERT_OK(pool_reg.status());
  PeerDescriptor d;
  d.address = rx.value()->LocalAddress();
  d.regions.push_back({reinterpret_cast<uint64_t>(pool), kReclaimBytes, pool_reg.value()->RemoteKey()});

  for (int round = 0; round < 2; ++round) {  // twice: capacity must not shrink per lost writer
    // A new address for each writer, as a daemon's handshake makes one: its same-host token is
    // good for one writer (transport/ucx/ucx_same_host.h).
    d.address = rx.value()->LocalAddress();
    PeerProcess w;
    ASSERT_TRUE(w.Start({"--helper=writer", "--backend=" + GetParam(), "--peer=" + EncodePeer(d)}));
    std::string line = w.ReadLine(DeadlineAfterMs(20000));
    ASSERT_EQ(line.rfind("TICKET ", 0), 0u) << "writer: '" << line << "'";
    ASSERT_OK(rx.value()->Admit(FromHex(line.substr(7))));
    ASSERT_TRUE(w.Send("GO"));
    line = w.ReadLine(DeadlineAfterMs(20000));
    ASSERT_EQ(line.rfind("WROTE", 0), 0u) << "writer: '" << line << "'";
    std::printf("[%s] round %d: writer path %s\n", GetParam().c_str(), round, line.substr(6).c_str());
    std::vector<uint8_t> back(kReclaimBytes);
    CUDA_OK(cudaMemcpy(back.data(), pool, kReclaimBytes, cudaMemcpyDeviceToHost));
    EXPECT_EQ(back, std::vector<uint8_t>(kReclaimBytes, 0x11));
    w.Kill();
    const auto killed = Clock::now();

    // The next writer (this process) must get slots and land its write.
    staged::StagedOptions wo;
    wo.device = 0;
    wo.connect_timeout_ms = 8000;
    auto tx = staged::CreateStagedTransport(wo);
    ASSERT_OK(tx.status());
    void* src = nullptr;
    CUDA_OK(cudaMalloc(&src, kReclaimBytes));
    CUDA_OK(cudaMemset(src, 0x22 + round, kReclaimBytes));
    CUDA_OK(cudaDeviceSynchronize());
    auto reg = tx.value()->Register({src, kReclaimBytes, MemoryKind::kCuda, 0});
    ASSERT_OK(reg.status());
    d.address = rx.value()->LocalAddress();
    auto ep = test::ConnectAdmitted(*tx.value(), *rx.value(), d);
    ASSERT_OK(ep.status());
    // The hello goes with the first write: the write lands once the peer granted slots.
    WriteRequest wr;
    wr.local = reg.value().get();
    wr.ops = {{0, 0, kReclaimBytes}};
    auto h = ep.value()->Write(wr);
    ASSERT_OK(h.status());
    ASSERT_OK(h.value()->Wait(DeadlineAfterMs(10000)));
    const double reclaimed_s = SecondsSince(killed);
    std::printf("[%s] round %d: next writer's write landed %.0f ms after the kill\n",
                GetParam().c_str(), round, reclaimed_s * 1e3);
    if (zero_copy) {
      EXPECT_LT(reclaimed_s, 5.0) << "a zero-copy writer's exit should free its slots";
    }
    CUDA_OK(cudaMemcpy(back.data(), pool, kReclaimBytes, cudaMemcpyDeviceToHost));
    EXPECT_EQ(back, std::vector<uint8_t>(kReclaimBytes, uint8_t(0x22 + round)));
    ep.value().reset();  // goodbye: its slots are free at once for the next round
    reg.value().reset();
    tx.value().reset();
    cudaFree(src);
  }
  pool_reg.value().reset();
  rx.value().reset();
  cudaFree(pool);
}

// ucx_staged's inner UCX connections go through the listener's admission (issue 15, item 3),
// like the ucx backend's: a writer whose ticket the receiver never admitted gets no slot, its
// write fails, nothing reaches the receiver's pool, and the refusal is counted; the same
// receiver then serves an admitted writer.
TEST_P(StagedReclaimTest, UnadmittedWriterIsRefused) {
  staged::StagedOptions ro;
  ro.device = 0;
  if (GetParam() == "ucx_staged_put") ro.zero_copy = staged::ZeroCopy::kOff;
  auto rx = staged::CreateStagedTransport(ro);
  ASSERT_OK(rx.status());
  constexpr uint64_t kBytes = 1 << 20;
  void* pool = nullptr;
  void* src = nullptr;
  CUDA_OK(cudaMalloc(&pool, kBytes));
  CUDA_OK(cudaMalloc(&src, kBytes));
  CUDA_OK(cudaMemset(pool, 0, kBytes));
  CUDA_OK(cudaMemset(src, 0x33, kBytes));
  CUDA_OK(cudaDeviceSynchronize());
  auto pool_reg = rx.value()->Register({pool, kBytes, MemoryKind::kCuda, 0});
  ASSERT_OK(pool_reg.status());
  PeerDescriptor d;
  d.address = rx.value()->LocalAddress();
  d.regions.push_back({reinterpret_cast<uint64_t>(pool), kBytes, pool_reg.value()->RemoteKey()});
  std::atomic<int> notes{0};
  rx.value()->SetNotificationSink([&notes](const Notification&) { notes++; });

  staged::StagedOptions wo = ro;
  wo.connect_timeout_ms = 3000;
  auto tx = staged::CreateStagedTransport(wo);
  ASSERT_OK(tx.status());
  auto reg = tx.value()->Register({src, kBytes, MemoryKind::kCuda, 0});
  ASSERT_OK(reg.status());
  WriteRequest wr;
  wr.local = reg.value().get();
  wr.ops = {{0, 0, kBytes}};
  wr.notify = true;
  wr.notification = {5, 1, 0};
  {
    auto ep = tx.value()->Connect(d);  // nobody admits its ticket
    ASSERT_OK(ep.status());
    EXPECT_FALSE(ep.value()->AdmissionTicket().empty());
    auto h = ep.value()->Write(wr);
    Status s = h.ok() ? h.value()->Wait(DeadlineAfterMs(15000)) : h.status();
    EXPECT_FALSE(s.ok()) << "a write through a connection nobody admitted completed";
    std::printf("[%s] unadmitted writer: %s\n", GetParam().c_str(), s.ToString().c_str());
  }
  std::vector<uint8_t> back(kBytes);
  CUDA_OK(cudaMemcpy(back.data(), pool, kBytes, cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, std::vector<uint8_t>(kBytes, 0)) << "an unadmitted writer's bytes landed";
  EXPECT_EQ(notes.load(), 0);
  EXPECT_GE(rx.value()->counters().connections_refused, 1u);
  EXPECT_EQ(rx.value()->counters().connections_admitted, 0u);
  EXPECT_EQ(tx.value()->counters().connections_admitted, 0u);

  // Admitted, the same writer transport lands its write; the receiver accepted one connection
  // and the writer none (credits come back over the writer's own connection).
  auto ep = test::ConnectAdmitted(*tx.value(), *rx.value(), d);
  ASSERT_OK(ep.status());
  auto h = ep.value()->Write(wr);
  ASSERT_OK(h.status());
  ASSERT_OK(h.value()->Wait(DeadlineAfterMs(15000)));
  CUDA_OK(cudaMemcpy(back.data(), pool, kBytes, cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, std::vector<uint8_t>(kBytes, 0x33));
  const auto deadline = DeadlineAfterMs(5000);
  while (notes.load() == 0 && !Expired(deadline)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(notes.load(), 1);
  EXPECT_EQ(rx.value()->counters().connections_admitted, 1u);
  EXPECT_EQ(tx.value()->counters().connections_admitted, 0u);
  ep.value().reset();
  rx.value()->SetNotificationSink(nullptr);
  reg.value().reset();
  tx.value().reset();
  pool_reg.value().reset();
  rx.value().reset();
  cudaFree(src);
  cudaFree(pool);
}

INSTANTIATE_TEST_SUITE_P(Staged, StagedReclaimTest,
                         ::testing::Values(std::string("ucx_staged"), std::string("ucx_staged_put")),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });
#endif

}  // namespace
}  // namespace kvstream::transport::conformance

int main(int argc, char** argv) {
  std::string helper, backend = "cuda_ipc", peer, ucx_tls;
  int device = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--helper=", 0) == 0) helper = a.substr(9);
    if (a.rfind("--backend=", 0) == 0) backend = a.substr(10);
    if (a.rfind("--peer=", 0) == 0) peer = a.substr(7);
    if (a.rfind("--device=", 0) == 0) device = std::stoi(a.substr(9));
    if (a.rfind("--ucx-tls=", 0) == 0) ucx_tls = a.substr(10);
  }
  if (helper == "receiver") return kvstream::transport::conformance::RunReceiver(backend, device, ucx_tls);
#if KVSTREAM_HAVE_UCX_STAGED
  if (helper == "writer") return kvstream::transport::conformance::RunWriter(backend, peer);
#endif
  ::testing::InitGoogleTest(&argc, argv);
  if (::testing::GTEST_FLAG(list_tests)) return RUN_ALL_TESTS();
  int count = 0;
  if (!kvstream::testing::GpusUsable("transport_conformance_gpu_test", &count)) return 77;
  kvstream::transport::conformance::g_gpus = count;
  return RUN_ALL_TESTS();
}
