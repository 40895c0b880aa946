// The gtest side of gpu_peer.h, shared by the GPU transport tests (transport_gpu_test,
// nccl_transport_gpu_test): the writer's link to a receiver process, and the checks both run against any backend (scattered layer writes, a write behind
// a producer stream, a flood of writes cut by closing the endpoint, one checked write before the
// peer is killed, bad registrations and writes refused). What differs per backend (how its
// transport is made, the receiver's arguments, the deadlines) comes in as arguments.
//
// The helpers that assert are void: a fatal failure returns from the helper only, so callers
// wrap them in ASSERT_NO_FATAL_FAILURE to stop the test there as an inline ASSERT would.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/time.h"
#include "tests/transport/gpu/gpu_peer.h"
#include "transport/transport.h"

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr
#define ASSERT_OK(expr)                        \
  do {                                         \
    ::kvstream::Status s_ = (expr);            \
    ASSERT_TRUE(s_.ok()) << s_.ToString();     \
  } while (0)

namespace kvstream::testing {

// Writer: a receiver process (this binary re-executed with `args`) and the peer its READY line
// announced (kPeerRegions regions).
struct Receiver {
  PeerProcess proc;
  transport::PeerDescriptor peer;
};

inline ::testing::AssertionResult StartReceiver(const std::vector<std::string>& args,
                                                int64_t timeout_ms, Receiver* r) {
  const std::string err = StartPeerReceiver(&r->proc, args, kPeerRegions, timeout_ms, &r->peer);
  if (err.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << err;
}

inline ::testing::AssertionResult ExpectNotes(PeerProcess& proc,
                                              std::map<std::pair<uint64_t, int>, bool> want,
                                              int64_t timeout_ms) {
  const std::string err = ExpectNotesError(proc, std::move(want), timeout_ms);
  if (err.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << err;
}

// Writer: a receiver process, this process's transport and an endpoint connected to the
// receiver. Members are destroyed endpoint first, receiver last.
struct Link {
  Receiver rx;
  std::unique_ptr<transport::Transport> t;
  std::unique_ptr<transport::Endpoint> ep;
  double connect_ms = 0;  // how long Connect took
};

using TransportMaker = std::function<Result<std::unique_ptr<transport::Transport>>()>;

// Starts the receiver (`args`, READY within timeout_ms), then makes the writer's transport and
// connects it. A fatal failure if any step fails.
inline void OpenLink(const std::vector<std::string>& args, int64_t timeout_ms,
                     const TransportMaker& make, Link* l) {
  ASSERT_TRUE(StartReceiver(args, timeout_ms, &l->rx));
  auto t = make();
  ASSERT_OK(t.status());
  l->t = std::move(t).value();
  const auto t0 = Clock::now();
  auto ep = l->t->Connect(l->rx.peer);
  ASSERT_OK(ep.status());
  l->connect_ms = SecondsSince(t0) * 1e3;
  l->ep = std::move(ep).value();
  // What a daemon's handshake does: the receiver admits the endpoint's connection.
  if (const std::string ticket = l->ep->AdmissionTicket(); !ticket.empty()) {
    ASSERT_TRUE(l->rx.proc.Send("ADMIT " + ToHex(ticket)));
    ASSERT_EQ(l->rx.proc.ReadLine(DeadlineAfterMs(timeout_ms)), "ADMITTED OK");
  }
}

// The endpoint must still be healthy; closes it, then the receiver (exit 0 within finish_ms).
inline void CloseLink(Link& l, int64_t finish_ms) {
  ASSERT_OK(l.ep->status());
  l.ep.reset();
  EXPECT_EQ(l.rx.proc.Finish(DeadlineAfterMs(finish_ms)), 0);
}

// Copies a checked write's source to device memory at `dst` before it is posted.
inline void StageSource(void* dst, const SourceWrite& w) {
  CUDA_OK(cudaMemcpy(dst, w.host.data(), w.host.size() * 8, cudaMemcpyHostToDevice));
  // A pageable-memory cudaMemcpy may return before its DMA is done, and the transport's
  // copy stream does not wait for the legacy stream: without this the source could still be
  // landing while the write reads it (it did, on the H200, in the scatter-kernel pass).
  CUDA_OK(cudaDeviceSynchronize());
}

// Six checked writes of 96 scattered blocks (6 MiB) each, request RequestId(serial, 96), layer
// l into region l % kPeerRegions from its own slice of one registration, all posted before any
// is waited for (each within wait_ms); the receiver must report every one OK. With
// expect_split, each write must have gone out as more than one transfer. Then closes the
// endpoint and the receiver (exit 0 within finish_ms) and frees the source.
inline void WriteScatteredLayers(Link& l, uint64_t serial, int64_t wait_ms, int64_t finish_ms,
                                 bool expect_split) {
  constexpr int kLayers = 6;
  constexpr size_t kCount = 96;  // 6 MiB per write
  void* src = nullptr;
  CUDA_OK(cudaMalloc(&src, kLayers * kCount * kPeerBlock));
  // One registration over all layers' sources: op offsets include the layer's base.
  auto reg = l.t->Register({src, kLayers * kCount * kPeerBlock, transport::MemoryKind::kCuda, 0});
  ASSERT_OK(reg.status());
  std::vector<std::unique_ptr<transport::WriteHandle>> handles;
  std::map<std::pair<uint64_t, int>, bool> want;
  for (int layer = 0; layer < kLayers; ++layer) {
    uint64_t req = RequestId(serial, kCount);
    SourceWrite w = MakeSource(req, layer, kCount);
    const uint64_t base = layer * kCount * kPeerBlock;
    ASSERT_NO_FATAL_FAILURE(StageSource(static_cast<char*>(src) + base, w));
    // The first write into each region also checks nothing else in it was touched.
    auto h = l.ep->Write(CheckedWriteRequest(reg.value().get(), w, base, layer % kPeerRegions,
                                             {req, layer, layer < kPeerRegions ? kFlagCheckUntouched : 0}));
    ASSERT_OK(h.status());
    EXPECT_EQ(h.value()->bytes(), kCount * kPeerBlock);
    if (expect_split) {
      EXPECT_GT(h.value()->transfers(), 1u);
    }
    handles.push_back(std::move(h).value());
    want[{req, layer}] = true;
  }
  for (auto& h : handles) ASSERT_OK(h->Wait(DeadlineAfterMs(wait_ms)));
  EXPECT_TRUE(ExpectNotes(l.rx.proc, want, 20000));
  ASSERT_NO_FATAL_FAILURE(CloseLink(l, finish_ms));
  reg.value().reset();
  CUDA_OK(cudaFree(src));
}

// The copy must wait for the producer stream (after_stream) and the notification for the copy:
// the source (128 blocks, request RequestId(serial, 128), layer 1 into region 1) holds garbage
// until a slow producer stream overwrites it with the pattern. Then closes the endpoint and the
// receiver (exit 0 within finish_ms) and frees what it allocated.
inline void WriteAfterProducerStream(Link& l, uint64_t serial, int64_t wait_ms, int64_t finish_ms) {
  constexpr size_t kCount = 128;
  uint64_t req = RequestId(serial, kCount);
  SourceWrite w = MakeSource(req, 1, kCount);
  void* src = nullptr;
  void* scratch = nullptr;
  void* pinned = nullptr;
  const size_t kScratch = 1ull << 30;
  CUDA_OK(cudaMalloc(&src, kCount * kPeerBlock));
  CUDA_OK(cudaMalloc(&scratch, kScratch));
  CUDA_OK(cudaMallocHost(&pinned, kCount * kPeerBlock));
  std::memcpy(pinned, w.host.data(), kCount * kPeerBlock);
  CUDA_OK(cudaMemset(src, 0xAB, kCount * kPeerBlock));
  CUDA_OK(cudaDeviceSynchronize());
  auto reg = l.t->Register({src, kCount * kPeerBlock, transport::MemoryKind::kCuda, 0});
  ASSERT_OK(reg.status());
  cudaStream_t producer;
  CUDA_OK(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking));
  // Tens of milliseconds of work ahead of the source's real contents.
  for (int i = 0; i < 40; ++i) CUDA_OK(cudaMemsetAsync(scratch, i, kScratch, producer));
  CUDA_OK(cudaMemcpyAsync(src, pinned, kCount * kPeerBlock, cudaMemcpyHostToDevice, producer));
  transport::WriteRequest wr = CheckedWriteRequest(reg.value().get(), w, 0, 1, {req, 1, 0});
  wr.after_stream = producer;
  auto h = l.ep->Write(wr);
  ASSERT_OK(h.status());
  EXPECT_EQ(cudaStreamQuery(producer), cudaErrorNotReady) << "producer finished too early to test";
  ASSERT_OK(h.value()->Wait(DeadlineAfterMs(wait_ms)));
  EXPECT_TRUE(ExpectNotes(l.rx.proc, {{{req, 1}, true}}, 20000));
  CUDA_OK(cudaStreamSynchronize(producer));
  l.ep.reset();
  EXPECT_EQ(l.rx.proc.Finish(DeadlineAfterMs(finish_ms)), 0);
  CUDA_OK(cudaStreamDestroy(producer));
  reg.value().reset();
  cudaFree(src);
  cudaFree(scratch);
  cudaFreeHost(pinned);
}

// Posts `n` writes of a whole region (0x5A bytes, regions taking turns) back to back from a
// fresh device buffer *src registered as *reg; their handles go to *handles.
inline void PostWholeRegionWrites(Link& l, int n, void** src,
                                  std::unique_ptr<transport::Registration>* reg,
                                  std::vector<std::unique_ptr<transport::WriteHandle>>* handles) {
  CUDA_OK(cudaMalloc(src, kPeerRegionBytes));
  CUDA_OK(cudaMemset(*src, 0x5A, kPeerRegionBytes));
  CUDA_OK(cudaDeviceSynchronize());
  auto r = l.t->Register({*src, kPeerRegionBytes, transport::MemoryKind::kCuda, 0});
  ASSERT_OK(r.status());
  *reg = std::move(r).value();
  for (int i = 0; i < n; ++i) {
    transport::WriteRequest wr;
    wr.local = reg->get();
    wr.remote_region = i % kPeerRegions;
    wr.ops = {{0, 0, kPeerRegionBytes}};
    auto h = l.ep->Write(wr);
    ASSERT_OK(h.status());
    handles->push_back(std::move(h).value());
  }
}

// The receiver's pool does not change any more: two HASH answers 100 ms apart are equal.
inline void ExpectPoolUnchanged(PeerProcess& proc) {
  ASSERT_TRUE(proc.Send("HASH"));
  std::string a = proc.ReadLine(DeadlineAfterMs(10000));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(proc.Send("HASH"));
  std::string b = proc.ReadLine(DeadlineAfterMs(10000));
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a, b);
}

// Lands one checked write (16 blocks, request RequestId(3000, 16), layer 0 into region 0) from a
// fresh device buffer *src registered as *reg, within wait_ms, and waits for the receiver's OK.
// *wr is that request, to post again.
inline void LandCheckedWrite(Link& l, int64_t wait_ms, void** src,
                             std::unique_ptr<transport::Registration>* reg, transport::WriteRequest* wr) {
  constexpr size_t kCount = 16;
  uint64_t req = RequestId(3000, kCount);
  SourceWrite w = MakeSource(req, 0, kCount);
  CUDA_OK(cudaMalloc(src, kCount * kPeerBlock));
  CUDA_OK(cudaMemcpy(*src, w.host.data(), kCount * kPeerBlock, cudaMemcpyHostToDevice));
  auto r = l.t->Register({*src, kCount * kPeerBlock, transport::MemoryKind::kCuda, 0});
  ASSERT_OK(r.status());
  *reg = std::move(r).value();
  *wr = CheckedWriteRequest(reg->get(), w, 0, 0, {req, 0, 0});
  auto h = l.ep->Write(*wr);
  ASSERT_OK(h.status());
  ASSERT_OK(h.value()->Wait(DeadlineAfterMs(wait_ms)));
  EXPECT_TRUE(ExpectNotes(l.rx.proc, {{{req, 0}, true}}, 20000));
}

// Registrations a GPU backend must refuse: host memory (kNotSupported; not for a backend that
// moves host memory too, `takes_host`), a null address, zero length, host memory called kCuda,
// and a length past the allocation (`dev`: 1 MiB of device 0; `host`: 1 MiB).
inline void ExpectRegisterRefusals(transport::Transport& tx, void* dev, std::vector<char>& host,
                                   bool takes_host = false) {
  using transport::MemoryKind;
  if (!takes_host) {
    EXPECT_EQ(tx.Register({host.data(), host.size(), MemoryKind::kHost, -1}).status().code(),
              StatusCode::kNotSupported);
  }
  EXPECT_EQ(tx.Register({nullptr, 4096, MemoryKind::kCuda, 0}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(tx.Register({dev, 0, MemoryKind::kCuda, 0}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(tx.Register({host.data(), host.size(), MemoryKind::kCuda, 0}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(tx.Register({dev, 64 << 20, MemoryKind::kCuda, 0}).status().code(),
            StatusCode::kInvalidArgument);
}

// Writes that an endpoint to one 512 KiB region must refuse, in this order: no source
// registration; `foreign` as the source (another transport's registration; skipped when null);
// then from `local` (512 KiB) a region out of range either way, an op past the source or the
// destination, a length that overflows. Leaves *wr at local, region 0, that last op.
inline void ExpectWriteRefusals(transport::Endpoint& ep, const transport::Registration* local,
                                const transport::Registration* foreign, transport::WriteRequest* wr) {
  wr->local = nullptr;
  wr->ops = {{0, 0, 4096}};
  EXPECT_EQ(ep.Write(*wr).status().code(), StatusCode::kInvalidArgument);
  if (foreign != nullptr) {
    wr->local = foreign;
    EXPECT_EQ(ep.Write(*wr).status().code(), StatusCode::kInvalidArgument);
  }
  wr->local = local;
  wr->remote_region = 1;
  EXPECT_EQ(ep.Write(*wr).status().code(), StatusCode::kInvalidArgument);
  wr->remote_region = -1;
  EXPECT_EQ(ep.Write(*wr).status().code(), StatusCode::kInvalidArgument);
  wr->remote_region = 0;
  wr->ops = {{(1 << 19) - 100, 0, 4096}};
  EXPECT_EQ(ep.Write(*wr).status().code(), StatusCode::kInvalidArgument);
  wr->ops = {{0, (1 << 19) - 100, 4096}};
  EXPECT_EQ(ep.Write(*wr).status().code(), StatusCode::kInvalidArgument);
  wr->ops = {{0, 0, ~0ull}};
  EXPECT_EQ(ep.Write(*wr).status().code(), StatusCode::kInvalidArgument);
}

// After the refusals a good write still goes through: 4 KiB of 7s from the start of `dev` (the
// writer's registration in *wr) into the start of region 0 as two 2 KiB ops, notifying {77, 3};
// the receiving transport `rx` gets a sink that counts that notification in *notes (the caller
// removes it). Checks the handle completes within wait_ms; the caller checks the bytes and
// the notification (each at the moment it needs).
inline void PostGoodWrite(transport::Transport& rx, transport::Endpoint& ep, void* dev,
                          transport::WriteRequest* wr, std::atomic<int>* notes, int64_t wait_ms) {
  CUDA_OK(cudaMemset(dev, 7, 4096));
  CUDA_OK(cudaDeviceSynchronize());
  // The tag (the connector's MAC) must arrive unchanged where the backend says it carries one.
  transport::Notification note{77, 3, 0};
  for (size_t i = 0; i < note.mac.size(); ++i) note.mac[i] = uint8_t(0x5A ^ (13 * i));
  const bool carries_mac = rx.capabilities().notification_mac;
  rx.SetNotificationSink([notes, note, carries_mac](const transport::Notification& n) {
    if (n.request_id == 77 && n.layer == 3 && (!carries_mac || n.mac == note.mac)) (*notes)++;
  });
  wr->ops = {{0, 0, 2048}, {2048, 2048, 2048}};
  wr->notify = true;
  wr->notification = note;
  auto h = ep.Write(*wr);
  ASSERT_OK(h.status());
  ASSERT_OK(h.value()->Wait(DeadlineAfterMs(wait_ms)));
}

}  // namespace kvstream::testing
