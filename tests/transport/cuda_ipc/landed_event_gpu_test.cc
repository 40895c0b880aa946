// cuda_ipc early notifications (gpu_landed_wait) between real processes on one GPU: the
// receiver learns of a write while its copy is only enqueued and makes its own stream wait for
// the writer's landed flag on the GPU (StreamWaitLanded: cuStreamWaitValue32 on the flag the
// writer's copy stream writes after the copy), and nothing can leave that stream waiting
// forever: a writer SIGKILLed before its copy, or a wait whose deadline passes, is released by
// the receiver, and ConfirmLanded then says the data did not land.
//
// Three processes: this test (orchestrator), a "waiter" (the receiver: a cuda_ipc transport with
// gpu_landed_wait, a pool, a stream) and a "writer" (connects, holds its copy back behind a
// kernel that spins on its producer stream, then writes into the waiter's pool). The waiter
// runs apart from the orchestrator so that a stream stuck forever cannot take the test down
// with it (the orchestrator kills it and checks the GPU still works).
//
// Without a usable GPU the binary prints why and exits 77 (CTest: skipped).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/time.h"
#include "tests/transport/gpu/gpu_peer.h"
#include "tests/transport/cuda_ipc/spin_kernel.h"
#include "transport/cuda_ipc/cuda_ipc_transport.h"
#include "transport/transport.h"

namespace kvstream::transport {
namespace {

using kvstream::testing::FromHex;
using kvstream::testing::PeerProcess;
using kvstream::testing::ToHex;

constexpr uint64_t kBlock = 64 * 1024;
constexpr uint64_t kBlocks = 64;                 // 4 MiB per write, scattered
constexpr uint64_t kPoolBytes = 4 * kBlocks * kBlock;
constexpr unsigned char kByte = 0x5A;
// Source byte i of the writer (never 0, so an unwritten block cannot pass for a written one).
inline unsigned char Pattern(uint64_t i) {
  const unsigned char v = static_cast<unsigned char>(kByte ^ (i * 2654435761u >> 7));
  return v == 0 ? 1 : v;
}

void Say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

int64_t MsSince(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

// ---- writer ------------------------------------------------------------------------------
// argv: --helper=writer --addr=HEX --key=HEX --raddr=N --rlen=N --hold-ms=N [--no-warmup]
// Fills its source with a byte pattern, writes zeros into the destination blocks once (warm-up,
// left out with --no-warmup: then the held-back write is the process's first),
// then writes kBlocks blocks of the pattern (destination block 4*i+1) with after_stream = a
// stream held by a kernel spinning hold-ms, notify {7, 0}. Prints POSTED <ms Write() took>, then DONE <status> <ms since the spin started>
// when its handle completes; exits when stdin closes.
int RunWriter(const std::map<std::string, std::string>& a) {
  const int hold_ms = std::stoi(a.at("hold-ms"));
  if (cudaSetDevice(0) != cudaSuccess) return 2;
  cuda_ipc::CudaIpcOptions o;
  o.device = 0;
  o.block_table = true;
  auto t = cuda_ipc::CreateCudaIpcTransport(o);
  if (!t.ok()) { Say("ERROR " + t.status().ToString()); return 1; }
  PeerDescriptor peer;
  peer.address = FromHex(a.at("addr"));
  peer.regions.push_back({std::stoull(a.at("raddr")), std::stoull(a.at("rlen")), FromHex(a.at("key"))});
  auto ep = t.value()->Connect(peer);
  if (!ep.ok()) { Say("ERROR " + ep.status().ToString()); return 1; }
  // Source: the pattern, then as many zero bytes (what the warm-up writes).
  void* src = nullptr;
  if (cudaMalloc(&src, 2 * kBlocks * kBlock) != cudaSuccess) return 2;
  {
    std::vector<unsigned char> pattern(2 * kBlocks * kBlock, 0);
    for (uint64_t i = 0; i < kBlocks * kBlock; ++i) pattern[i] = Pattern(i);
    if (cudaMemcpy(src, pattern.data(), pattern.size(), cudaMemcpyHostToDevice) != cudaSuccess) return 2;
  }
  auto reg = t.value()->Register({src, 2 * kBlocks * kBlock, MemoryKind::kCuda, 0});
  if (!reg.ok()) { Say("ERROR " + reg.status().ToString()); return 1; }
  WriteRequest wr;
  wr.local = reg.value().get();
  wr.remote_region = 0;
  if (a.count("no-warmup") == 0) {
    // Warm-up, unnotified, of zeros into the same blocks (they stay zero until the real write):
    // the first launch of the copy kernel loads it (CUDA's lazy loading), which waits for the
    // GPU's running kernels, so behind the spin it would block Write() for the whole hold
    // (seen on the H200: Write() took the hold's 400 ms / 4 s / 20 s).
    for (uint64_t i = 0; i < kBlocks; ++i) {
      wr.ops.push_back({(kBlocks + i) * kBlock, (4 * i + 1) * kBlock, kBlock});
    }
    auto warm = ep.value()->Write(wr);
    if (!warm.ok() || !warm.value()->Wait(DeadlineAfterMs(30000)).ok()) {
      Say("ERROR warm-up write");
      return 1;
    }
  }
  wr.ops.clear();
  for (uint64_t i = 0; i < kBlocks; ++i) wr.ops.push_back({i * kBlock, (4 * i + 1) * kBlock, kBlock});
  cudaStream_t producer;
  if (cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking) != cudaSuccess) return 2;
  const Clock::time_point spin_start = Clock::now();
  if (kvstream::testing::LaunchSpin(producer, static_cast<unsigned long long>(hold_ms) * 1000000ull) !=
      cudaSuccess) {
    return 2;
  }
  wr.notify = true;
  wr.notification = {7, 0, 0};
  wr.after_stream = producer;
  const Clock::time_point w0 = Clock::now();
  auto h = ep.value()->Write(wr);
  if (!h.ok()) { Say("ERROR " + h.status().ToString()); return 1; }
  Say("POSTED " + std::to_string(MsSince(w0)));
  Status s = h.value()->Wait(DeadlineAfterMs(60000));
  Say("DONE " + std::string(StatusCodeName(s.code())) + " " + std::to_string(MsSince(spin_start)) +
      " " + s.ToString());
  std::string line;
  while (std::getline(std::cin, line)) {}
  return 0;
}

// ---- waiter ------------------------------------------------------------------------------
// argv: --helper=waiter --poll-ms=N [--wait-ms=N] [--expect-gone]
// Prints READY <addr> <key> <raddr> <rlen>; on the notification: makes its stream wait
// (StreamWaitLanded, deadline wait-ms, default 60 s), enqueues a copy of the pool to pinned
// memory and a marker event, and prints EARLY <flags> <seq> <marker state right after>; then
// polls the marker for up to poll-ms: RELEASED <ms> or STUCK <ms>; if released, checks every
// byte (DATA OK / DATA BAD <bytes wrong>) and asks ConfirmLanded: CONFIRM <status code name>;
// then asks StreamWaitLanded again with the same notification (with --expect-gone: until it is
// refused, up to 3 s): AFTER <status code name>. If stuck it leaves with _exit (nothing that
// could wait on the stream).
int RunWaiter(const std::map<std::string, std::string>& a) {
  const int poll_ms = std::stoi(a.at("poll-ms"));
  const int wait_ms = a.count("wait-ms") ? std::stoi(a.at("wait-ms")) : 60000;
  if (cudaSetDevice(0) != cudaSuccess) return 2;
  cuda_ipc::CudaIpcOptions o;
  o.device = 0;
  o.gpu_landed_wait = true;
  auto t = cuda_ipc::CreateCudaIpcTransport(o);
  if (!t.ok()) { Say("ERROR " + t.status().ToString()); return 1; }
  auto pool_mem = cuda_vmm::ShareableDeviceMemory::Allocate(0, kPoolBytes);  // shareable, as a KV pool
  if (!pool_mem.ok()) { Say("ERROR " + pool_mem.status().ToString()); return 1; }
  void* pool = pool_mem.value()->data();
  if (cudaMemset(pool, 0, kPoolBytes) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) return 2;
  auto reg = t.value()->Register({pool, kPoolBytes, MemoryKind::kCuda, 0});
  if (!reg.ok()) { Say("ERROR " + reg.status().ToString()); return 1; }
  std::mutex mu;
  std::vector<Notification> notes;
  t.value()->SetNotificationSink([&](const Notification& n) {
    std::lock_guard<std::mutex> lock(mu);
    notes.push_back(n);
  });
  cudaStream_t s;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return 2;
  unsigned char* host = nullptr;
  if (cudaHostAlloc(reinterpret_cast<void**>(&host), kPoolBytes, cudaHostAllocDefault) != cudaSuccess) return 2;
  cudaEvent_t marker;
  if (cudaEventCreateWithFlags(&marker, cudaEventDisableTiming) != cudaSuccess) return 2;
  Say("READY " + ToHex(t.value()->LocalAddress()) + " " + ToHex(reg.value()->RemoteKey()) + " " +
      std::to_string(reinterpret_cast<uint64_t>(pool)) + " " + std::to_string(kPoolBytes));
  Notification n;
  for (auto d = DeadlineAfterMs(10000);;) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!notes.empty()) {
        n = notes.front();
        break;
      }
    }
    if (Expired(d)) { Say("ERROR no notification within 10 s"); return 1; }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  const Clock::time_point c0 = Clock::now();
  Status w = t.value()->StreamWaitLanded(n, s, DeadlineAfterMs(wait_ms));
  if (!w.ok()) { Say("ERROR StreamWaitLanded: " + w.ToString()); return 1; }
  const Clock::time_point c1 = Clock::now();
  if (cudaMemcpyAsync(host, pool, kPoolBytes, cudaMemcpyDeviceToHost, s) != cudaSuccess) return 2;
  if (cudaEventRecord(marker, s) != cudaSuccess) return 2;
  const cudaError_t right_after = cudaEventQuery(marker);
  const auto us = [](Clock::time_point a, Clock::time_point b) {
    return std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(b - a).count());
  };
  // (Host time of the wait call and of the copy + marker enqueue, in us: neither may block.)
  const std::string host_us = " wait_call_us=" + us(c0, c1) + " enqueue_us=" + us(c1, Clock::now());
  Say("EARLY " + std::to_string(n.flags) + " " + std::to_string(n.landed_seq) + " " +
      (right_after == cudaErrorNotReady ? "pending" : "complete") + host_us);
  const Clock::time_point t0 = Clock::now();
  bool released = false;
  while (MsSince(t0) < poll_ms) {
    cudaError_t q = cudaEventQuery(marker);
    if (q != cudaErrorNotReady) {
      released = true;
      Say("RELEASED " + std::to_string(MsSince(t0)) + " " + cudaGetErrorName(q));
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!released) {
    Say("STUCK " + std::to_string(MsSince(t0)));
  } else {
    // Every byte: the written blocks hold the writer's pattern, the others are untouched.
    uint64_t wrong = 0;
    for (uint64_t b = 0; b < kPoolBytes / kBlock; ++b) {
      const bool written = b % 4 == 1 && b / 4 < kBlocks;
      for (uint64_t i = 0; i < kBlock; ++i) {
        const unsigned char want = written ? Pattern((b / 4) * kBlock + i) : 0;
        wrong += host[b * kBlock + i] != want;
      }
    }
    Say(wrong == 0 ? "DATA OK" : "DATA BAD " + std::to_string(wrong));
    Say("CONFIRM " + std::string(StatusCodeName(t.value()->ConfirmLanded(n).code())));
  }
  // The writer's connection may be gone by now: a wait issued after that must say so.
  auto d = DeadlineAfterMs(3000);
  Status after = t.value()->StreamWaitLanded(n, s, DeadlineAfterMs(wait_ms));
  while (after.ok() && !Expired(d) && a.count("expect-gone")) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    after = t.value()->StreamWaitLanded(n, s, DeadlineAfterMs(wait_ms));
  }
  Say("AFTER " + std::string(StatusCodeName(after.code())));
  std::string line;
  if (!released) {
    // Leave without any call that could wait on the stuck stream.
    std::fflush(stdout);
    _exit(0);
  }
  while (std::getline(std::cin, line)) {}
  return 0;
}

std::map<std::string, std::string> Args(int argc, char** argv) {
  std::map<std::string, std::string> m;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    if (s.rfind("--", 0) != 0) continue;
    auto eq = s.find('=');
    if (eq == std::string::npos) m[s.substr(2)] = "1";
    else m[s.substr(2, eq - 2)] = s.substr(eq + 1);
  }
  return m;
}

struct Pair {
  PeerProcess waiter, writer;
  std::string addr, key, raddr, rlen;
};

// Starts the waiter and the writer; returns after the waiter's EARLY line (in *early).
::testing::AssertionResult StartPair(Pair* p, int hold_ms, int poll_ms, bool expect_gone,
                                     std::string* early, int wait_ms = 60000,
                                     bool writer_warmup = true) {
  std::vector<std::string> wargs = {"--helper=waiter", "--poll-ms=" + std::to_string(poll_ms),
                                    "--wait-ms=" + std::to_string(wait_ms)};
  if (expect_gone) wargs.push_back("--expect-gone");
  if (!p->waiter.Start(wargs)) return ::testing::AssertionFailure() << "fork waiter";
  std::string line = p->waiter.ReadLine(DeadlineAfterMs(30000));
  std::istringstream in(line);
  std::string tag;
  in >> tag >> p->addr >> p->key >> p->raddr >> p->rlen;
  if (tag != "READY") return ::testing::AssertionFailure() << "waiter: " << line;
  std::vector<std::string> args = {"--helper=writer", "--addr=" + p->addr, "--key=" + p->key,
                                   "--raddr=" + p->raddr, "--rlen=" + p->rlen,
                                   "--hold-ms=" + std::to_string(hold_ms)};
  if (!writer_warmup) args.push_back("--no-warmup");
  if (!p->writer.Start(args)) {
    return ::testing::AssertionFailure() << "fork writer";
  }
  line = p->writer.ReadLine(DeadlineAfterMs(30000));
  if (line.rfind("POSTED ", 0) != 0) return ::testing::AssertionFailure() << "writer: " << line;
  std::printf("RESULT writer's Write() took %s ms\n", line.substr(7).c_str());
  // Write() only enqueues: it must return long before the held-back copy can run.
  if (std::stoll(line.substr(7)) > hold_ms / 4) {
    return ::testing::AssertionFailure() << "Write() blocked behind the hold: " << line;
  }
  *early = p->waiter.ReadLine(DeadlineAfterMs(10000));
  if (early->rfind("EARLY ", 0) != 0) return ::testing::AssertionFailure() << "waiter: " << *early;
  return ::testing::AssertionSuccess();
}

class LandedEventTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(cudaSetDevice(0), cudaSuccess); }
};

// The notification arrives while the copy is held back (the waiter's marker is still pending
// right after its wait was issued), and the waiter's stream reads the bytes only after they
// landed: every byte of the pool is checked, and ConfirmLanded agrees.
//
// (The interprocess-event version of this test failed on the H200 on 2026-11-29: the waiter's
// stream was released 1 ms after its wait was issued while the copy was still held for 400 ms.
// A memory wait on the flag cannot pass before the writer's stream wrote it.)
void CheckEarlyWriteLands(bool writer_warmup) {
  Pair p;
  std::string early;
  ASSERT_TRUE(StartPair(&p, /*hold_ms=*/400, /*poll_ms=*/10000, false, &early, 60000, writer_warmup));
  std::printf("RESULT %s\n", early.c_str());
  std::istringstream in(early);
  std::string tag, state;
  int flags = 0;
  uint32_t seq = 0;
  in >> tag >> flags >> seq >> state;
  EXPECT_NE(flags & kNotificationLandedOnEvent, 0) << early;
  EXPECT_EQ(state, "pending") << "the notification should precede the held-back copy: " << early;
  std::string line = p.waiter.ReadLine(DeadlineAfterMs(15000));
  std::printf("RESULT %s\n", line.c_str());
  EXPECT_EQ(line.rfind("RELEASED ", 0), 0u) << line;
  EXPECT_NE(line.find("cudaSuccess"), std::string::npos) << line;
  // The waiter's stream stayed held for most of the writer's 400 ms: the notification came
  // before the copy (a late one would release it at once).
  long long released_ms = -1;
  std::sscanf(line.c_str(), "RELEASED %lld", &released_ms);
  EXPECT_GE(released_ms, 150) << line;
  EXPECT_EQ(p.waiter.ReadLine(DeadlineAfterMs(10000)), "DATA OK");
  EXPECT_EQ(p.waiter.ReadLine(DeadlineAfterMs(5000)), "CONFIRM OK");
  line = p.writer.ReadLine(DeadlineAfterMs(15000));
  std::printf("RESULT writer %s\n", line.c_str());
  EXPECT_EQ(line.rfind("DONE OK ", 0), 0u) << line;
  EXPECT_EQ(p.waiter.ReadLine(DeadlineAfterMs(5000)), "AFTER OK");  // writer still connected
  EXPECT_EQ(p.writer.Finish(DeadlineAfterMs(10000)), 0);
  EXPECT_EQ(p.waiter.Finish(DeadlineAfterMs(10000)), 0);
}

TEST_F(LandedEventTest, EarlyNotificationAndGpuWaitSeeTheWholeWrite) { CheckEarlyWriteLands(true); }

// The held-back write is the writer process's first: its copy kernel must already be loaded
// (the transport preloads it when created), or CUDA's lazy loading makes Write() wait for the
// spinning kernel (seen on the H200: Write() took the whole hold). StartPair fails when Write()
// takes more than a quarter of the hold.
TEST_F(LandedEventTest, FirstWriteIsNotHeldByTheProcessRunningKernels) { CheckEarlyWriteLands(false); }

// The writer is SIGKILLed after the early notification, before its copy (and the flag write
// behind it) ran. The waiting stream must be released in bounded time by the receiver (its
// control socket's EOF), ConfirmLanded must say the layer did not land, a wait issued after
// the writer's death must be refused with kUnavailable, and the GPU must stay usable.
TEST_F(LandedEventTest, WriterKilledBeforeItsCopy) {
  Pair p;
  std::string early;
  ASSERT_TRUE(StartPair(&p, /*hold_ms=*/20000, /*poll_ms=*/8000, true, &early));
  std::printf("RESULT %s\n", early.c_str());
  EXPECT_NE(early.find("pending"), std::string::npos) << early;
  const Clock::time_point killed = Clock::now();
  p.writer.Kill();
  std::string verdict = p.waiter.ReadLine(DeadlineAfterMs(20000));
  std::printf("RESULT writer SIGKILLed before its copy: waiting stream %s (%lld ms after the kill)\n",
              verdict.c_str(), static_cast<long long>(MsSince(killed)));
  ASSERT_EQ(verdict.rfind("RELEASED ", 0), 0u) << verdict;
  long long released_ms = -1;
  std::sscanf(verdict.c_str(), "RELEASED %lld", &released_ms);
  EXPECT_LT(released_ms, 5000) << verdict;
  std::string data = p.waiter.ReadLine(DeadlineAfterMs(10000));
  std::printf("RESULT data after release: %s\n", data.c_str());
  EXPECT_EQ(data.rfind("DATA ", 0), 0u) << data;
  EXPECT_EQ(p.waiter.ReadLine(DeadlineAfterMs(5000)), "CONFIRM UNAVAILABLE");
  std::string next = p.waiter.ReadLine(DeadlineAfterMs(10000));
  std::printf("RESULT wait issued after the writer's death: %s\n", next.c_str());
  EXPECT_EQ(next, "AFTER UNAVAILABLE");
  const Clock::time_point gone = Clock::now();
  const int rc = p.waiter.Finish(DeadlineAfterMs(10000));
  std::printf("RESULT waiter process exit: rc %d after %lld ms\n", rc,
              static_cast<long long>(MsSince(gone)));
  EXPECT_EQ(rc, 0);
  // The GPU still works for this process.
  void* x = nullptr;
  ASSERT_EQ(cudaMalloc(&x, 1 << 20), cudaSuccess);
  ASSERT_EQ(cudaMemset(x, 1, 1 << 20), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(x);
}

// A live writer whose copy is held past the wait's deadline: the receiver releases the waiting
// stream soon after the deadline, ConfirmLanded says the layer did not land, and the writer is
// dropped (its write fails instead of landing unannounced later).
TEST_F(LandedEventTest, DeadlineReleasesTheWaitAndDropsTheWriter) {
  Pair p;
  std::string early;
  ASSERT_TRUE(StartPair(&p, /*hold_ms=*/4000, /*poll_ms=*/8000, true, &early, /*wait_ms=*/500));
  std::printf("RESULT %s\n", early.c_str());
  EXPECT_NE(early.find("pending"), std::string::npos) << early;
  std::string verdict = p.waiter.ReadLine(DeadlineAfterMs(20000));
  std::printf("RESULT wait deadline 500 ms, copy held 4 s: waiting stream %s\n", verdict.c_str());
  ASSERT_EQ(verdict.rfind("RELEASED ", 0), 0u) << verdict;
  long long released_ms = -1;
  std::sscanf(verdict.c_str(), "RELEASED %lld", &released_ms);
  EXPECT_GE(released_ms, 300) << verdict;
  EXPECT_LT(released_ms, 2500) << verdict;
  EXPECT_EQ(p.waiter.ReadLine(DeadlineAfterMs(10000)).rfind("DATA ", 0), 0u);
  EXPECT_EQ(p.waiter.ReadLine(DeadlineAfterMs(5000)), "CONFIRM UNAVAILABLE");
  EXPECT_EQ(p.waiter.ReadLine(DeadlineAfterMs(10000)), "AFTER UNAVAILABLE");
  std::string done = p.writer.ReadLine(DeadlineAfterMs(20000));
  std::printf("RESULT dropped writer: %s\n", done.c_str());
  EXPECT_EQ(done.rfind("DONE REMOTE_DISCONNECT", 0), 0u) << done;
  EXPECT_EQ(p.writer.Finish(DeadlineAfterMs(10000)), 0);
  EXPECT_EQ(p.waiter.Finish(DeadlineAfterMs(10000)), 0);
}

}  // namespace
}  // namespace kvstream::transport

int main(int argc, char** argv) {
  auto a = kvstream::transport::Args(argc, argv);
  if (a.count("helper") && a["helper"] == "writer") return kvstream::transport::RunWriter(a);
  if (a.count("helper") && a["helper"] == "waiter") return kvstream::transport::RunWaiter(a);
  ::testing::InitGoogleTest(&argc, argv);
  if (::testing::GTEST_FLAG(list_tests)) return RUN_ALL_TESTS();
  int count = 0;
  if (!kvstream::testing::GpusUsable("landed_event_gpu_test", &count)) return 77;
  return RUN_ALL_TESTS();
}
