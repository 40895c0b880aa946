// cuda_ipc's memory is a capability (issue 15, item 3): a key names a registration, and only the
// receiver's control socket hands out the memory, as a cuMem POSIX descriptor, to the writer that
// holds the address's token. Forged, replayed, foreign and old-format keys are refused, memory that
// cannot be shared (cudaMalloc'd) is refused as a write target with a clear error, and no
// descriptor, mapping or device memory outlives its registration or endpoint. (The descriptor
// passing itself, and that a connection without the token or of another uid never gets one:
// control_socket_test MemoryGoesOnlyAsADescriptorToTheTokenHolder, on the CPU. Data landing
// byte-exact in another process through this path: transport_conformance_gpu_test.)
//
// Without a usable GPU the binary prints why and exits 77 (CTest: skipped).
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "common/cuda_vmm.h"
#include "common/status.h"
#include "common/time.h"
#include "tests/transport/gpu/gpu_peer.h"
#include "tests/transport/gpu/gpu_peer_test.h"
#include "transport/cuda_ipc/cuda_ipc_transport.h"
#include "transport/transport.h"

namespace kvstream::transport {
namespace {

using namespace kvstream::testing;

constexpr size_t kGrantIdOffset = 8 + 4 + 4 + 32 + 48;  // in a cuda_ipc key (cuda_ipc_wire.h)
constexpr size_t kOffsetOffset = kGrantIdOffset + 8;

std::unique_ptr<Transport> MakeIpc() {
  cuda_ipc::CudaIpcOptions o;
  o.device = 0;
  auto t = cuda_ipc::CreateCudaIpcTransport(o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

int OpenFds() {
  int n = 0;
  for (int fd = 0; fd < 65536; ++fd) n += ::fcntl(fd, F_GETFD) >= 0 ? 1 : 0;
  return n;
}

// Writes 4 KiB of `value` from `src` (a registration of `tx`'s) to the start of the peer's
// region 0 and waits for the write and its notification.
void WriteAndWait(Transport& rx, Endpoint& ep, const Registration& src, void* src_ptr, int value) {
  std::atomic<int> notes{0};
  rx.SetNotificationSink([&notes](const Notification& n) {
    if (n.request_id == 5) notes++;
  });
  CUDA_OK(cudaMemset(src_ptr, value, 4096));
  CUDA_OK(cudaDeviceSynchronize());
  WriteRequest wr;
  wr.local = &src;
  wr.remote_region = 0;
  wr.ops = {{0, 0, 4096}};
  wr.notify = true;
  wr.notification = Notification{5, 0, 0};
  auto h = ep.Write(wr);
  ASSERT_OK(h.status());
  ASSERT_OK(h.value()->Wait(DeadlineAfterMs(10000)));
  const Deadline d = DeadlineAfterMs(5000);
  while (notes.load() == 0 && !Expired(d)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(notes.load(), 1);
  rx.SetNotificationSink(nullptr);
}

class CudaIpcTrustTest : public ::testing::Test {
 protected:
  void SetUp() override { CUDA_OK(cudaSetDevice(0)); }
};

TEST_F(CudaIpcTrustTest, OnlyKeysOfLiveShareableRegistrationsOpenMemory) {
  auto rx = MakeIpc(), rx2 = MakeIpc(), tx = MakeIpc();
  ASSERT_TRUE(rx && rx2 && tx);
  auto pool = cuda_vmm::ShareableDeviceMemory::Allocate(0, 4 << 20);
  ASSERT_OK(pool.status());
  char* base = static_cast<char*>(pool.value()->data());
  CUDA_OK(cudaMemset(base, 0, 4 << 20));
  void* src = nullptr;
  CUDA_OK(cudaMalloc(&src, 1 << 20));  // a source need not be shareable
  auto local = tx->Register({src, 1 << 20, MemoryKind::kCuda, 0});
  ASSERT_OK(local.status());
  auto reg = rx->Register({base + (1 << 20), 1 << 20, MemoryKind::kCuda, 0});
  ASSERT_OK(reg.status());
  const std::string key = reg.value()->RemoteKey();

  // The genuine key: data lands byte-exact through the descriptor-mapped memory.
  {
    auto ep = tx->Connect(InProcessPeer(*rx, *reg.value(), 1 << 20));
    ASSERT_OK(ep.status());
    ASSERT_NO_FATAL_FAILURE(WriteAndWait(*rx, *ep.value(), *local.value(), src, 0x3C));
    std::vector<unsigned char> back(8192);
    CUDA_OK(cudaMemcpy(back.data(), base + (1 << 20) - 4096, back.size(), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < back.size(); ++i) {
      ASSERT_EQ(back[i], i < 4096 ? 0 : 0x3C) << "byte " << i << " around the region's start";
    }
  }
  auto connect_with = [&](const std::string& address, const std::string& k) {
    PeerDescriptor p;
    p.address = address;
    p.regions.push_back({reinterpret_cast<uint64_t>(base + (1 << 20)), 4096, k});
    return tx->Connect(p);
  };

  // A forged grant id (a key nobody registered): the receiver has no such registration.
  std::string forged = key;
  forged[kGrantIdOffset] ^= 0x5A;
  auto f = connect_with(rx->LocalAddress(), forged);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound) << f.status().ToString();
  EXPECT_NE(f.status().message().find("grant id"), std::string::npos) << f.status().ToString();

  // The genuine id with another place in the allocation: refused, the receiver's word counts.
  std::string moved = key;
  uint64_t off = 0;
  std::memcpy(&off, moved.data() + kOffsetOffset, 8);
  off -= 1 << 20;
  std::memcpy(moved.data() + kOffsetOffset, &off, 8);
  auto m = connect_with(rx->LocalAddress(), moved);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument) << m.status().ToString();

  // A key of another receiver presented at this one's address: not this receiver's.
  auto other = rx2->Register({base, 1 << 20, MemoryKind::kCuda, 0});
  ASSERT_OK(other.status());
  auto o = connect_with(rx->LocalAddress(), other.value()->RemoteKey());
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), StatusCode::kNotFound) << o.status().ToString();

  // A replayed key: its registration is gone, so is the memory behind it.
  auto gone = rx->Register({base + (2 << 20), 1 << 20, MemoryKind::kCuda, 0});
  ASSERT_OK(gone.status());
  const std::string old_key = gone.value()->RemoteKey();
  gone.value().reset();
  auto r = connect_with(rx->LocalAddress(), old_key);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << r.status().ToString();

  // Memory that cannot be shared as a descriptor (cudaMalloc'd) is no write target.
  void* plain = nullptr;
  CUDA_OK(cudaMalloc(&plain, 1 << 20));
  auto plain_reg = rx->Register({plain, 1 << 20, MemoryKind::kCuda, 0});
  ASSERT_OK(plain_reg.status());
  auto p = connect_with(rx->LocalAddress(), plain_reg.value()->RemoteKey());
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kFailedPrecondition) << p.status().ToString();
  EXPECT_NE(p.status().message().find("cannot be shared"), std::string::npos) << p.status().ToString();

  // A key of the old format (with a legacy CUDA IPC handle): not accepted at all.
  std::string legacy = key;
  legacy[7] = '1';  // "KVIPCK01"
  auto l = connect_with(rx->LocalAddress(), legacy);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument) << l.status().ToString();

  // After all of that the genuine key still works.
  {
    auto ep = tx->Connect(InProcessPeer(*rx, *reg.value(), 1 << 20));
    ASSERT_OK(ep.status());
    ASSERT_NO_FATAL_FAILURE(WriteAndWait(*rx, *ep.value(), *local.value(), src, 0x4D));
    unsigned char b = 0;
    CUDA_OK(cudaMemcpy(&b, base + (1 << 20) + 4095, 1, cudaMemcpyDeviceToHost));
    EXPECT_EQ(b, 0x4D);
  }
  plain_reg.value().reset();
  other.value().reset();
  reg.value().reset();
  local.value().reset();
  cudaFree(plain);
  cudaFree(src);
}

// Register / connect / write / disconnect / unregister loops (with a fresh pool each round):
// every descriptor, mapping and byte of device memory they used is released.
TEST_F(CudaIpcTrustTest, LoopsLeaveNoDescriptorsMappingsOrMemory) {
  auto rx = MakeIpc(), tx = MakeIpc();
  ASSERT_TRUE(rx && tx);
  void* src = nullptr;
  CUDA_OK(cudaMalloc(&src, 1 << 20));
  auto local = tx->Register({src, 1 << 20, MemoryKind::kCuda, 0});
  ASSERT_OK(local.status());
  auto round = [&](int i) {
    auto pool = cuda_vmm::ShareableDeviceMemory::Allocate(0, 8 << 20);
    ASSERT_OK(pool.status());
    auto reg = rx->Register({pool.value()->data(), 8 << 20, MemoryKind::kCuda, 0});
    ASSERT_OK(reg.status());
    for (int c = 0; c < 2; ++c) {
      auto ep = tx->Connect(InProcessPeer(*rx, *reg.value(), 8 << 20));
      ASSERT_OK(ep.status());
      ASSERT_NO_FATAL_FAILURE(WriteAndWait(*rx, *ep.value(), *local.value(), src, 1 + (i + c) % 200));
    }
    reg.value().reset();
  };
  // The first round lets the driver open what it keeps for the process; the receiver's
  // listener closes a writer's connection when it sees it close (give it time to).
  ASSERT_NO_FATAL_FAILURE(round(0));
  CUDA_OK(cudaDeviceSynchronize());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  size_t free0 = 0, total = 0;
  CUDA_OK(cudaMemGetInfo(&free0, &total));
  const int fds0 = OpenFds();
  for (int i = 1; i <= 25; ++i) ASSERT_NO_FATAL_FAILURE(round(i));
  const Deadline d = DeadlineAfterMs(3000);
  while (OpenFds() > fds0 && !Expired(d)) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_LE(OpenFds(), fds0) << "descriptors leaked over 25 rounds (" << fds0 << " before)";
  size_t free1 = 0;
  CUDA_OK(cudaMemGetInfo(&free1, &total));
  // 25 rounds of an 8 MiB pool, mapped twice each: any leak shows as >= 200 MiB.
  EXPECT_LT(free0 > free1 ? free0 - free1 : 0, size_t(64) << 20) << "device memory leaked";
  local.value().reset();
  cudaFree(src);
}

}  // namespace
}  // namespace kvstream::transport

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (::testing::GTEST_FLAG(list_tests)) return RUN_ALL_TESTS();
  int count = 0;
  if (!kvstream::testing::GpusUsable("cuda_ipc_trust_gpu_test", &count)) return 77;
  return RUN_ALL_TESTS();
}
