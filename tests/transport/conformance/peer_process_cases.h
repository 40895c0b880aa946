// The conformance cases that need CUDA (suite.h): device memory written into a receiver in
// another process (this binary re-executed as a helper: tests/transport/gpu/gpu_peer.h, whose
// notification sink checks that every block of a write is in its pool when the notification
// arrives), a producer stream the copy must wait for, endpoint destruction, cancel, ordering,
// a killed peer, and device-memory refusals. Without CUDA (transport_conformance_test) each
// case is skipped with the reason; transport_conformance_gpu_test runs them on device memory.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "tests/transport/conformance/suite.h"
#if KVSTREAM_CONFORMANCE_CUDA
#include <cuda_runtime_api.h>

#include "tests/transport/gpu/gpu_peer.h"
#include "tests/transport/gpu/gpu_peer_test.h"
#endif

namespace kvstream::transport::conformance {

#if KVSTREAM_CONFORMANCE_CUDA
using namespace kvstream::testing;

// ---- defined by the GPU binary ----------------------------------------------------------------
// Whether it runs these cases for configuration `c` (a receiver helper for its backend).
bool HasPeerProcess(const Config& c);
// A receiver process of `c`'s backend and a writer (made by `make`, by default MakeTransport)
// connected to it.
void OpenPeer(const Config& c, Link* l, TransportMaker make = nullptr);
// The writers a case goes through, one link each (a backend's copy paths).
struct WriterVariant {
  uint64_t serial;  // request serial of its writes
  TransportMaker make;
};
std::vector<WriterVariant> ScatterVariants(const Config& c);  // the scattered-write case's
std::vector<WriterVariant> StreamVariants(const Config& c);   // the producer-stream case's
// The backend's own checks of a fresh link (ucx_staged: the path its endpoint took; nccl
// prints how long Connect took).
void CheckFreshLink(const Config& c, const Link& l);
// A backend's bounds in these cases.
struct PeerBounds {
  int64_t wait_ms = 10000;    // a checked write's Wait
  int64_t finish_ms = 10000;  // the receiver's exit once the link is closed
  bool expect_split = false;  // a 6 MiB scattered write goes out as more than one transfer
  int close_writes = 32;      // writes in flight when an endpoint is destroyed
};
PeerBounds BoundsOf(const Config& c);
// -----------------------------------------------------------------------------------------------

// Runs `body` over a fresh link per writer variant (its serial as the request serial), after
// the backend's own checks of the link; stops at a fatal failure.
inline void OnEachLink(const Config& c, const std::vector<WriterVariant>& variants,
                       const std::function<void(Link&, uint64_t)>& body) {
  for (const WriterVariant& v : variants) {
    SCOPED_TRACE("variant " + std::to_string(v.serial));
    Link l;
    ASSERT_NO_FATAL_FAILURE(OpenPeer(c, &l, v.make));
    ASSERT_NO_FATAL_FAILURE(CheckFreshLink(c, l));
    ASSERT_NO_FATAL_FAILURE(body(l, v.serial));
  }
}

#define NEED_DEVICE_CASE()                                                                      \
  do {                                                                                          \
    if (P().memory != Memory::kDevice) {                                                        \
      GTEST_SKIP() << "written for device memory (" << MemoryName(P().memory) << " here)";      \
    }                                                                                           \
    if (!HasPeerProcess(P())) GTEST_SKIP() << P().backend << ": no receiver helper here";       \
    CUDA_OK(cudaSetDevice(P().writer_device));                                                  \
  } while (0)
#else
#define NEED_DEVICE_CASE() \
  GTEST_SKIP() << "needs CUDA: transport_conformance_gpu_test runs it on device memory"
#endif

TEST_P(TransportConformance, ScatteredWritesLandByteExactInAnotherProcess) {
  NEED_DEVICE_CASE();
#if KVSTREAM_CONFORMANCE_CUDA
  // cuda_ipc: copy engine, block-table kernel (the default for these paged writes), packed-run
  // kernel (the previous path, block_table off), and auto mode with the block table.
  // nccl: pack (6 MiB per write: several 1 MiB chunks), direct and auto mode.
  const PeerBounds b = BoundsOf(P());
  OnEachLink(P(), ScatterVariants(P()), [&](Link& l, uint64_t serial) {
    WriteScatteredLayers(l, serial, b.wait_ms, b.finish_ms, b.expect_split);
  });
#endif
}

// The copy must wait for the producer stream (after_stream) and the notification for the copy
// (WriteAfterProducerStream).
TEST_P(TransportConformance, NotificationOnlyAfterDataProducedOnAnotherStream) {
  NEED_DEVICE_CASE();
#if KVSTREAM_CONFORMANCE_CUDA
  // nccl: in pack and in direct mode.
  const PeerBounds b = BoundsOf(P());
  OnEachLink(P(), StreamVariants(P()), [&](Link& l, uint64_t serial) {
    WriteAfterProducerStream(l, serial, b.wait_ms, b.finish_ms);
  });
#endif
}

// Destroying the endpoint stops its writes, within a bound: every handle is done (OK or
// kCanceled) and the peer's memory stops changing.
TEST_P(TransportConformance, EndpointDestructionStopsWrites) {
  NEED_DEVICE_CASE();
#if KVSTREAM_CONFORMANCE_CUDA
  Link l;
  ASSERT_NO_FATAL_FAILURE(OpenPeer(P(), &l));
  void* src = nullptr;
  std::unique_ptr<Registration> reg;
  std::vector<std::unique_ptr<WriteHandle>> handles;
  const PeerBounds b = BoundsOf(P());
  ASSERT_NO_FATAL_FAILURE(PostWholeRegionWrites(l, b.close_writes, &src, &reg, &handles));
  const auto t0 = Clock::now();
  l.ep.reset();
  EXPECT_LT(SecondsSince(t0), 10.0) << "closing must be bounded";
  int ok = 0, canceled = 0;
  for (auto& h : handles) {
    EXPECT_TRUE(h->Done());
    Status s = h->Wait(DeadlineAfterMs(5000));
    EXPECT_TRUE(s.ok() || s.code() == StatusCode::kCanceled) << s.ToString();
    (s.ok() ? ok : canceled)++;
  }
  std::printf("[%s] after close: %d writes complete, %d cancelled\n", P().backend.c_str(), ok, canceled);
  ASSERT_NO_FATAL_FAILURE(ExpectPoolUnchanged(l.rx.proc));
  EXPECT_EQ(l.rx.proc.Finish(DeadlineAfterMs(b.finish_ms)), 0);
  reg.reset();
  cudaFree(src);
#endif
}

// Cancel() of a write with chunks still queued: the handle completes (kCanceled, or OK when it
// had gone out entirely), no notification for a canceled write, and the next write lands and is
// notified as usual.
TEST_P(TransportConformance, CancelEndsAWriteAndTheNextOneLands) {
  NEED_DEVICE_CASE();
#if KVSTREAM_CONFORMANCE_CUDA
  if (P().backend.rfind("ucx_staged", 0) != 0) GTEST_SKIP() << P().backend << ": cancel not covered here";
  Link l;
  ASSERT_NO_FATAL_FAILURE(OpenPeer(P(), &l));
  constexpr size_t kCount = 160;  // 10 MiB: several chunks, some still queued at Cancel()
  void* src = nullptr;
  CUDA_OK(cudaMalloc(&src, 2 * kCount * kPeerBlock));
  auto reg = l.t->Register({src, 2 * kCount * kPeerBlock, MemoryKind::kCuda, 0});
  ASSERT_OK(reg.status());
  std::map<std::pair<uint64_t, int>, bool> want;
  for (int layer = 0; layer < 2; ++layer) {
    const uint64_t req = RequestId(5000, kCount);
    SourceWrite w = MakeSource(req, layer, kCount);
    const uint64_t base = layer * kCount * kPeerBlock;
    ASSERT_NO_FATAL_FAILURE(StageSource(static_cast<char*>(src) + base, w));
    auto h = l.ep->Write(CheckedWriteRequest(reg.value().get(), w, base, layer, {req, layer, 0}));
    ASSERT_OK(h.status());
    if (layer == 0) {
      EXPECT_TRUE(h.value()->Cancel());
    }
    Status s = h.value()->Wait(DeadlineAfterMs(10000));
    if (layer == 0) {
      EXPECT_TRUE(s.ok() || s.code() == StatusCode::kCanceled) << s.ToString();
      std::printf("[%s] canceled write ended: %s\n", P().backend.c_str(), s.ToString().c_str());
      if (s.ok()) want[{req, layer}] = true;
    } else {
      ASSERT_OK(s);
      want[{req, layer}] = true;
    }
  }
  EXPECT_TRUE(ExpectNotes(l.rx.proc, want, 20000));
  ASSERT_NO_FATAL_FAILURE(CloseLink(l, 10000));
  reg.value().reset();
  cudaFree(src);
#endif
}

// ucx_staged: a write whose blocks are gathered on the writer and scattered on the receiver by
// kernels (on streams of their own, overlapping the copies), followed at once by a small
// write that the copy engine lands straight in one of the first write's blocks: the later write
// must win, every time, and every other block must hold what the first write put there.
TEST_P(TransportConformance, LaterWriteToTheSameBlockLandsLast) {
  NEED_DEVICE_CASE();
#if KVSTREAM_CONFORMANCE_CUDA
  if (P().backend.rfind("ucx_staged", 0) != 0) GTEST_SKIP() << P().backend << ": staged ordering only";
  Link l;
  ASSERT_NO_FATAL_FAILURE(OpenPeer(P(), &l));
  constexpr uint64_t kN = 128;  // blocks of the first write (8 MiB)
  constexpr uint64_t kReq = 7000;
  void* src = nullptr;
  CUDA_OK(cudaMalloc(&src, (kN + 1) * kPeerBlock));
  std::vector<uint64_t> host((kN + 1) * kPeerBlock / 8);
  for (uint64_t j = 0; j <= kN; ++j) FillPattern(kReq, 0, j, host.data() + j * kPeerBlock / 8, kPeerBlock / 8);
  CUDA_OK(cudaMemcpy(src, host.data(), host.size() * 8, cudaMemcpyHostToDevice));
  CUDA_OK(cudaDeviceSynchronize());
  auto reg = l.t->Register({src, (kN + 1) * kPeerBlock, MemoryKind::kCuda, 0});
  ASSERT_OK(reg.status());
  // Neither side contiguous: op i reads source block (37 i) mod kN into destination block
  // (91 i) mod kN of region 0; the second write puts source block kN into the destination block
  // of the first write's last op (its last chunk).
  WriteRequest a;
  a.local = reg.value().get();
  a.remote_region = 0;
  for (uint64_t i = 0; i < kN; ++i) a.ops.push_back({(37 * i) % kN * kPeerBlock, (91 * i) % kN * kPeerBlock, kPeerBlock});
  const uint64_t last_dst = (91 * (kN - 1)) % kN;
  WriteRequest b;
  b.local = reg.value().get();
  b.remote_region = 0;
  b.ops = {{kN * kPeerBlock, last_dst * kPeerBlock, kPeerBlock}};
  std::vector<std::unique_ptr<WriteHandle>> handles;
  for (int round = 0; round < 4; ++round) {
    for (const WriteRequest* wr : {&a, &b}) {
      auto h = l.ep->Write(*wr);
      ASSERT_OK(h.status());
      handles.push_back(std::move(h).value());
    }
  }
  for (auto& h : handles) ASSERT_OK(h->Wait(DeadlineAfterMs(10000)));
  // The receiver's whole pool as it must be, hashed the way its HASH command does.
  std::vector<uint64_t> pool(kPeerPoolBytes / 8, 0);
  for (uint64_t i = 0; i < kN; ++i) {
    const uint64_t s = (37 * i) % kN, d = (91 * i) % kN;
    std::memcpy(pool.data() + d * kPeerBlock / 8, host.data() + s * kPeerBlock / 8, kPeerBlock);
  }
  std::memcpy(pool.data() + last_dst * kPeerBlock / 8, host.data() + kN * kPeerBlock / 8, kPeerBlock);
  uint64_t want = 0;
  for (uint64_t w : pool) want = SplitMix64(want ^ w);
  ASSERT_TRUE(l.rx.proc.Send("HASH"));
  EXPECT_EQ(l.rx.proc.ReadLine(DeadlineAfterMs(10000)), "HASH " + std::to_string(want));
  ASSERT_NO_FATAL_FAILURE(CloseLink(l, 10000));
  reg.value().reset();
  cudaFree(src);
#endif
}

TEST_P(TransportConformance, KilledPeerSurfacesAsRemoteDisconnect) {
  NEED_DEVICE_CASE();
#if KVSTREAM_CONFORMANCE_CUDA
  Link l;
  ASSERT_NO_FATAL_FAILURE(OpenPeer(P(), &l));
  void* src = nullptr;
  std::unique_ptr<Registration> reg;
  WriteRequest wr;
  ASSERT_NO_FATAL_FAILURE(LandCheckedWrite(l, BoundsOf(P()).wait_ms, &src, &reg, &wr));

  // nccl: a write in flight when the peer dies (posted right before the kill) must fail, not
  // hang. (cuda_ipc's copies must never go to a dead process's memory: none in flight there.)
  Result<std::unique_ptr<WriteHandle>> pending = Unavailable("not posted");
  if (P().backend == "nccl") pending = l.ep->Write(wr);
  l.rx.proc.Kill();  // SIGKILL and reap: the peer's sockets are closed now
  const auto killed = Clock::now();
  // Watch the endpoint alone for 200 ms (cuda_ipc sees the socket close within ~20 ms; its
  // copies must never go to a dead process's memory), then keep writing so that backends
  // which learn of a dead peer only through traffic (UCX) see it; each Wait is bounded.
  Status failure;
  while (failure.ok() && SecondsSince(killed) < 10.0) {
    Status st = l.ep->status();
    if (!st.ok()) {
      failure = st;
      break;
    }
    if (SecondsSince(killed) < 0.2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      continue;
    }
    auto h2 = l.ep->Write(wr);
    if (!h2.ok()) {
      failure = h2.status();
      break;
    }
    const auto t0 = Clock::now();
    Status s = h2.value()->Wait(DeadlineAfterMs(500));
    EXPECT_LT(SecondsSince(t0), 1.0) << "Wait overran its deadline";
    if (!s.ok() && s.code() != StatusCode::kTimeout) failure = s;
  }
  const double seconds = SecondsSince(killed);
  ASSERT_FALSE(failure.ok()) << "peer death not reported within 10 s";
  EXPECT_EQ(failure.code(), StatusCode::kRemoteDisconnect) << failure.ToString();
  if (P().backend == "cuda_ipc") {
    EXPECT_LT(seconds, 0.2) << "socket EOF should surface at once";
  }
  if (P().backend == "nccl") {
    EXPECT_LT(seconds, 1.0);
  }
  std::printf("[%s] peer loss surfaced after %.1f ms\n", P().backend.c_str(), seconds * 1e3);
  if (pending.ok()) {
    Status s = pending.value()->Wait(DeadlineAfterMs(10000));
    EXPECT_TRUE(s.ok() || s.code() == StatusCode::kRemoteDisconnect) << s.ToString();
  }
  auto status_deadline = DeadlineAfterMs(5000);
  while (l.ep->status().ok() && !Expired(status_deadline)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(l.ep->status().code(), StatusCode::kRemoteDisconnect);
  auto later = l.ep->Write(wr);
  ASSERT_FALSE(later.ok());
  EXPECT_EQ(later.status().code(), StatusCode::kRemoteDisconnect) << later.status().ToString();
  const auto t_close = Clock::now();
  l.ep.reset();
  EXPECT_LT(SecondsSince(t_close), 12.0) << "closing an endpoint to a dead peer must be bounded";
  reg.reset();
  cudaFree(src);
#endif
}

// Bad registrations, peers and writes are refused; a good write still works afterwards
// (in-process peer: on this GPU, or on the second for nccl, which also refuses another device's
// memory, a region longer than its registration and another transport's registration).
TEST_P(TransportConformance, RefusesBadInput) {
  NEED_DEVICE_CASE();
#if KVSTREAM_CONFORMANCE_CUDA
  const int wd = P().writer_device, rd = P().reader_device;
  const bool nccl = P().backend == "nccl";
  auto rxt = MakeTransport(P(), rd);
  ASSERT_OK(rxt.status());
  auto t = MakeTransport(P(), wd);
  ASSERT_OK(t.status());
  Transport& tx = *t.value();
  // Device memory as the suite allocates it (shareable: cuda_ipc writes only into such).
  void* dev = AllocateMemory(Memory::kDevice, wd, 1 << 20);
  ASSERT_NE(dev, nullptr);
  // The receiver's 1 MiB: the second half of `dev` (and no more) on one GPU, its own on another.
  void* rdev = nullptr;
  if (rd != wd) {
    rdev = AllocateMemory(Memory::kDevice, rd, 1 << 20);
    ASSERT_NE(rdev, nullptr);
    CUDA_OK(cudaSetDevice(wd));
  }
  char* remote_base = rd != wd ? static_cast<char*>(rdev) : static_cast<char*>(dev) + (1 << 19);
  std::vector<char> host(1 << 20);

  ExpectRegisterRefusals(tx, dev, host, /*takes_host=*/P().name == "ucx");
  if (rd != wd) {
    EXPECT_EQ(tx.Register({rdev, 4096, MemoryKind::kCuda, rd}).status().code(),
              StatusCode::kInvalidArgument);  // another device's memory
  }

  auto local = tx.Register({dev, 1 << 19, MemoryKind::kCuda, wd});
  ASSERT_OK(local.status());
  auto remote = rxt.value()->Register({remote_base, 1 << 19, MemoryKind::kCuda, rd});
  ASSERT_OK(remote.status());
  std::unique_ptr<Registration> foreign;
  if (nccl) {
    auto f = rxt.value()->Register({static_cast<char*>(rdev) + (1 << 19), 1 << 19, MemoryKind::kCuda, rd});
    ASSERT_OK(f.status());
    foreign = std::move(f).value();
  }

  PeerDescriptor bad;
  bad.address = rxt.value()->LocalAddress();
  bad.regions.push_back({0, 16, "not a key"});
  EXPECT_EQ(tx.Connect(bad).status().code(), StatusCode::kInvalidArgument);
  if (nccl) {
    PeerDescriptor too_long;
    too_long.address = rxt.value()->LocalAddress();
    too_long.regions.push_back({0, 1 << 20, remote.value()->RemoteKey()});
    EXPECT_EQ(tx.Connect(too_long).status().code(), StatusCode::kInvalidArgument);
  }
  PeerDescriptor nowhere;
  nowhere.address = "unix:@kvstream-test-nobody-listens-here";
  EXPECT_FALSE(tx.Connect(nowhere).ok());
  PeerDescriptor garbage_addr;
  garbage_addr.address = "tcp://1.2.3.4:5";
  if (nccl) {
    EXPECT_EQ(tx.Connect(garbage_addr).status().code(), StatusCode::kInvalidArgument);
  } else {
    EXPECT_FALSE(tx.Connect(garbage_addr).ok());
  }

  auto ep = test::ConnectAdmitted(tx, *rxt.value(), InProcessPeer(*rxt.value(), *remote.value(), 1 << 19));
  ASSERT_OK(ep.status());
  WriteRequest wr;
  ExpectWriteRefusals(*ep.value(), local.value().get(), foreign.get(), &wr);
  // A good write still works after the refusals.
  std::atomic<int> notes{0};
  ASSERT_NO_FATAL_FAILURE(PostGoodWrite(*rxt.value(), *ep.value(), dev, &wr, &notes, BoundsOf(P()).wait_ms));
  if (nccl) {
    EXPECT_EQ(notes.load(), 1) << "the handle completes only after the notification was delivered";
  }
  std::vector<char> back(4096);
  CUDA_OK(cudaMemcpy(back.data(), remote_base, 4096, cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, std::vector<char>(4096, 7));
  auto deadline = DeadlineAfterMs(5000);
  while (notes.load() == 0 && !Expired(deadline)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(notes.load(), 1);
  ep.value().reset();
  rxt.value()->SetNotificationSink(nullptr);
  local.value().reset();
  remote.value().reset();
  foreign.reset();
  FreeMemory(Memory::kDevice, dev);
  if (rdev != nullptr) FreeMemory(Memory::kDevice, rdev);
#endif
}

}  // namespace kvstream::transport::conformance
