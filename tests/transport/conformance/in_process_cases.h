// The conformance cases with both transports in this process (suite.h): data lands
// byte-exact, notifications only after their data, coalescing, bad input refused without
// disturbing other writes, deadlines respected, lifetimes.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "tests/transport/conformance/suite.h"

namespace kvstream::transport::conformance {

TEST_P(TransportConformance, ReportsNameAndCapabilities) {
  OPEN_IN_PROCESS();
  EXPECT_EQ(writer_->name(), P().name);
  if (P().memory == Memory::kHost) {
    EXPECT_TRUE(writer_->capabilities().host_memory);
  } else {
    EXPECT_TRUE(writer_->capabilities().cuda_memory);
  }
  EXPECT_TRUE(writer_->capabilities().notifications);
  EXPECT_FALSE(writer_->LocalAddress().empty());
  EXPECT_TRUE(ep_->status().ok());
}

TEST_P(TransportConformance, ScatteredOpsLandByteExact) {
  OPEN_IN_PROCESS();
  // 200 blocks of 4 KiB scattered over the region in random order (no overlaps), one write.
  constexpr size_t kBlock = 4096, kBlocks = kRegion / kBlock;
  std::vector<uint64_t> slots(kBlocks);
  for (size_t i = 0; i < kBlocks; ++i) slots[i] = i;
  std::mt19937_64 rng(7);
  std::shuffle(slots.begin(), slots.end(), rng);
  std::vector<CopyOp> ops;
  std::vector<uint8_t> expect(kRegion, 0);
  for (size_t i = 0; i < 200; ++i) {
    CopyOp op{slots[i] * kBlock, slots[(i + 300) % kBlocks] * kBlock, kBlock};
    ops.push_back(op);
  }
  // Remote slots must not repeat; they are a permutation window, so they do not.
  for (const CopyOp& op : ops) {
    std::memcpy(expect.data() + op.remote_offset, src_host_.data() + op.local_offset, op.length);
  }
  auto h = ep_->Write(Request(ops, true, Notification{42, 3, 0}));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_TRUE((*h)->Wait(Soon()).ok());
  EXPECT_TRUE((*h)->Done());
  EXPECT_EQ((*h)->bytes(), 200 * kBlock);
  Notification n;
  ASSERT_TRUE(notes_.Pop(&n, Soon()));
  EXPECT_EQ(n.request_id, 42u);
  EXPECT_EQ(n.layer, 3);
  EXPECT_EQ(0, std::memcmp(dst_.Read().data(), expect.data(), kRegion));
}

TEST_P(TransportConformance, NotificationOnlyAfterItsData) {
  OPEN_IN_PROCESS();
  // 16 writes of 256 KiB as 64 ops each (4 KiB, adjacent); the sink checks the bytes on arrival.
  std::vector<std::unique_ptr<WriteHandle>> hs;
  for (int layer = 0; layer < 16; ++layer) {
    std::vector<CopyOp> ops;
    for (size_t off = 0; off < kChunk; off += 4096) {
      uint64_t o = layer * kChunk + off;
      ops.push_back(CopyOp{o, o, 4096});
    }
    auto h = ep_->Write(Request(ops, true, Notification{7, layer, kCheckOnArrival}));
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    hs.push_back(std::move(h).value());
  }
  for (auto& h : hs) ASSERT_TRUE(h->Wait(Soon()).ok());
  std::vector<bool> seen(16, false);
  for (int i = 0; i < 16; ++i) {
    Notification n;
    ASSERT_TRUE(notes_.Pop(&n, Soon())) << "notification " << i << " missing";
    ASSERT_GE(n.layer, 0);
    ASSERT_LT(n.layer, 16);
    EXPECT_FALSE(seen[n.layer]);
    seen[n.layer] = true;
  }
  EXPECT_EQ(data_missing_at_notification_.load(), 0);
  EXPECT_EQ(0, std::memcmp(dst_.Read().data(), src_host_.data(), 16 * kChunk));
}

TEST_P(TransportConformance, CoalescesAdjacentOps) {
  OPEN_IN_PROCESS();
  std::vector<CopyOp> adjacent;
  for (uint64_t i = 0; i < 32; ++i) adjacent.push_back(CopyOp{i * 1024, 8192 + i * 1024, 1024});
  auto h = ep_->Write(Request(adjacent));
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE((*h)->Wait(Soon()).ok());
  EXPECT_EQ((*h)->transfers(), 1u);
  EXPECT_EQ(0, std::memcmp(dst_.Read().data() + 8192, src_host_.data(), 32 * 1024));

  // Contiguous locally but not remotely, and a gap: three runs.
  std::vector<CopyOp> mixed = {{0, 0, 100}, {100, 200, 100}, {200, 300, 100}, {1000, 1000, 5}};
  auto h2 = ep_->Write(Request(mixed));
  ASSERT_TRUE(h2.ok());
  ASSERT_TRUE((*h2)->Wait(Soon()).ok());
  EXPECT_EQ((*h2)->transfers(), 3u);
  EXPECT_EQ((*h2)->bytes(), 305u);
  EXPECT_EQ(0, std::memcmp(dst_.Read().data() + 200, src_host_.data() + 100, 200));
}

TEST_P(TransportConformance, BadInputRefusedWithoutDisturbingOthers) {
  OPEN_IN_PROCESS();
  // A good write in flight across the bad ones.
  auto good = ep_->Write(Request({{0, 0, kRegion}}, true, Notification{1, 0, 0}));
  ASSERT_TRUE(good.ok());

  auto expect_invalid = [&](WriteRequest r, const char* what) {
    auto h = ep_->Write(r);
    ASSERT_FALSE(h.ok()) << what;
    EXPECT_EQ(h.status().code(), StatusCode::kInvalidArgument) << what << ": " << h.status().ToString();
  };
  WriteRequest r = Request({{0, 0, 16}});
  r.remote_region = 1;
  expect_invalid(r, "region index past the end");
  r.remote_region = -1;
  expect_invalid(r, "negative region index");
  expect_invalid(Request({{0, kRegion - 8, 16}}), "op past the remote end");
  expect_invalid(Request({{kRegion - 8, 0, 16}}), "op past the local end");
  expect_invalid(Request({{0, 0, 16}, {~0ull - 4, 0, 16}}), "offset overflow");
  expect_invalid(Request({{0, 16, ~0ull}}), "length overflow");
  WriteRequest no_local = Request({{0, 0, 16}});
  no_local.local = nullptr;
  expect_invalid(no_local, "no local registration");
  WriteRequest foreign = Request({{0, 0, 16}});
  foreign.local = remote_.get();  // made by the other transport
  if (P().refuses_foreign_registration) {
    expect_invalid(foreign, "registration of another transport");
  }

  WriteRequest gpu_dependency = Request({{0, 0, 16}});
  gpu_dependency.after_stream = reinterpret_cast<void*>(0x1);
  if (!writer_->capabilities().cuda_memory) {
    auto h = ep_->Write(gpu_dependency);
    ASSERT_FALSE(h.ok());
    EXPECT_EQ(h.status().code(), StatusCode::kNotSupported);
  }

  ASSERT_TRUE((*good)->Wait(Soon()).ok());
  Notification n;
  ASSERT_TRUE(notes_.Pop(&n, Soon()));
  EXPECT_EQ(0, std::memcmp(dst_.Read().data(), src_host_.data(), kRegion));
  EXPECT_TRUE(ep_->status().ok());
  // And the endpoint still works afterwards.
  auto after = ep_->Write(Request({{0, 0, 4096}}));
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE((*after)->Wait(Soon()).ok());
}

TEST_P(TransportConformance, RefusesBadRegistrationAndPeerData) {
  OPEN_IN_PROCESS();
  MemoryRegion null_region = src_.Region();
  null_region.addr = nullptr;
  null_region.length = 10;
  EXPECT_EQ(writer_->Register(null_region).status().code(), StatusCode::kInvalidArgument);
  MemoryRegion empty_region = src_.Region();
  empty_region.length = 0;
  EXPECT_EQ(writer_->Register(empty_region).status().code(), StatusCode::kInvalidArgument);
  PeerDescriptor junk;
  junk.address = "not an address";
  EXPECT_EQ(writer_->Connect(junk).status().code(), StatusCode::kInvalidArgument);
  PeerDescriptor bad_key;
  bad_key.address = reader_->LocalAddress();
  bad_key.regions.push_back(RemoteRegion{reinterpret_cast<uint64_t>(dst_.data()), 16, "junk"});
  EXPECT_EQ(writer_->Connect(bad_key).status().code(), StatusCode::kInvalidArgument);
  PeerDescriptor truncated;
  truncated.address = reader_->LocalAddress();
  truncated.address.resize(truncated.address.size() / 2);
  EXPECT_EQ(writer_->Connect(truncated).status().code(), StatusCode::kInvalidArgument);
}

TEST_P(TransportConformance, WaitRespectsItsDeadline) {
  OPEN_IN_PROCESS();
  std::vector<std::unique_ptr<WriteHandle>> hs;
  for (int i = 0; i < 8; ++i) {
    auto h = ep_->Write(Request({{0, 0, kRegion}}));
    ASSERT_TRUE(h.ok());
    hs.push_back(std::move(h).value());
  }
  auto t0 = Clock::now();
  Status s = hs.back()->Wait(Clock::now());  // already expired: must not block
  EXPECT_LT(SecondsSince(t0), 0.05);
  EXPECT_TRUE(s.ok() || s.code() == StatusCode::kTimeout) << s.ToString();
  for (auto& h : hs) EXPECT_TRUE(h->Wait(Soon()).ok());
}

TEST_P(TransportConformance, EmptyWriteStillNotifies) {
  OPEN_IN_PROCESS();
  auto h = ep_->Write(Request({}, true, Notification{9, 31, 0}));
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE((*h)->Wait(Soon()).ok());
  EXPECT_EQ((*h)->bytes(), 0u);
  Notification n;
  ASSERT_TRUE(notes_.Pop(&n, Soon()));
  EXPECT_EQ(n.request_id, 9u);
  EXPECT_EQ(n.layer, 31);
}

TEST_P(TransportConformance, ConcurrentWritersOnOneEndpoint) {
  OPEN_IN_PROCESS();
  constexpr int kThreads = 4, kPerThread = 40;
  constexpr size_t kSlice = kRegion / (kThreads * kPerThread);
  std::atomic<int> failures{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      std::vector<std::unique_ptr<WriteHandle>> hs;
      for (int i = 0; i < kPerThread; ++i) {
        uint64_t off = (t * kPerThread + i) * kSlice;
        auto h = ep_->Write(Request({{off, off, kSlice}}, true, Notification{uint64_t(t), i, 0}));
        if (!h.ok()) {
          failures.fetch_add(1);
          continue;
        }
        hs.push_back(std::move(h).value());
      }
      for (auto& h : hs) {
        if (!h->Wait(Soon()).ok()) failures.fetch_add(1);
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(failures.load(), 0);
  for (int i = 0; i < kThreads * kPerThread; ++i) {
    Notification n;
    ASSERT_TRUE(notes_.Pop(&n, Soon())) << i;
  }
  EXPECT_EQ(0, std::memcmp(dst_.Read().data(), src_host_.data(), kThreads * kPerThread * kSlice));
}

TEST_P(TransportConformance, AllocatedMemoryMovesLikeRegistered) {
  OPEN_IN_PROCESS();
  auto a = writer_->Allocate(1 << 20);
  auto b = reader_->Allocate(1 << 20);
  if (a.status().code() == StatusCode::kNotSupported) GTEST_SKIP() << a.status().ToString();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto* s = static_cast<uint8_t*>((*a)->region().addr);
  auto* d = static_cast<uint8_t*>((*b)->region().addr);
  ASSERT_GE((*a)->region().length, size_t{1} << 20);
  std::vector<uint8_t> bytes(1 << 20, 0);
  CopyMemory(d, bytes.data(), bytes.size());  // zeroed
  test::FillPattern(bytes.data(), bytes.size(), 5);
  CopyMemory(s, bytes.data(), bytes.size());
  PeerDescriptor peer;
  peer.address = reader_->LocalAddress();
  peer.regions.push_back(RemoteRegion{reinterpret_cast<uint64_t>(d), 1 << 20, (*b)->RemoteKey()});
  auto ep = test::ConnectAdmitted(*writer_, *reader_, peer);
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  WriteRequest r;
  r.local = a->get();
  r.ops = {{0, 0, 1 << 20}};
  auto h = (*ep)->Write(r);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE((*h)->Wait(Soon()).ok());
  CopyMemory(bytes.data(), d, bytes.size());
  EXPECT_TRUE(test::CheckPattern(bytes.data(), 1 << 20, 5));
}

TEST_P(TransportConformance, HandlesOutliveEndpointAndTransport) {
  OPEN_IN_PROCESS();
  std::vector<std::unique_ptr<WriteHandle>> hs;
  for (int i = 0; i < 4; ++i) {
    auto h = ep_->Write(Request({{0, 0, kRegion}}));
    ASSERT_TRUE(h.ok());
    hs.push_back(std::move(h).value());
  }
  auto t0 = Clock::now();
  ep_.reset();  // bounded: flushes or cancels what is in flight
  EXPECT_LT(SecondsSince(t0), 5.0);
  for (auto& h : hs) {
    ASSERT_TRUE(h->Done()) << "endpoint destruction must finish every write through it";
    Status s = h->Wait(Clock::now());
    EXPECT_TRUE(s.ok() || s.code() == StatusCode::kCanceled) << s.ToString();
  }
  local_.reset();
  writer_.reset();
  for (auto& h : hs) EXPECT_TRUE(h->Done());
}

TEST_P(TransportConformance, DestroyedEndpointWritesNothingMore) {
  OPEN_IN_PROCESS();
  // After the endpoint is gone, the destination is never touched again.
  auto h = ep_->Write(Request({{0, 0, kRegion}}));
  ASSERT_TRUE(h.ok());
  ep_.reset();
  std::vector<uint8_t> snapshot = dst_.Read();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(snapshot, dst_.Read());
}

TEST_P(TransportConformance, CancelNotifiesExactlyTheWritesThatCompleted) {
  OPEN_IN_PROCESS();
  constexpr int kWrites = 24;
  constexpr size_t kSize = kRegion / kWrites / 4096 * 4096;
  std::vector<std::unique_ptr<WriteHandle>> hs;
  for (int i = 0; i < kWrites; ++i) {
    std::vector<CopyOp> ops;
    for (size_t off = 0; off < kSize; off += 8192) {  // every other 4 KiB block: many runs
      ops.push_back(CopyOp{i * kSize + off, i * kSize + off, 4096});
    }
    auto h = ep_->Write(Request(ops, true, Notification{77, i, 0}));
    ASSERT_TRUE(h.ok());
    hs.push_back(std::move(h).value());
  }
  for (int i = kWrites - 1; i >= 0; i -= 2) {
    const bool canceling = hs[i]->Cancel();
    // Cancel() may answer false where a backend cannot stop a posted write (transport.h): then
    // this case has nothing to check. The host backends must cancel.
    if (!canceling && P().memory != Memory::kHost) {
      for (auto& h : hs) (void)h->Wait(Soon());
      GTEST_SKIP() << P().backend << " cannot cancel a posted write (Cancel() false)";
    }
    EXPECT_TRUE(canceling);
  }
  int completed = 0;
  for (int i = 0; i < kWrites; ++i) {
    Status s = hs[i]->Wait(Soon());
    ASSERT_TRUE(s.ok() || s.code() == StatusCode::kCanceled) << s.ToString();
    if (i % 2 == 0) {
      EXPECT_TRUE(s.ok()) << "write " << i << " was not canceled";
    }
    completed += s.ok();
  }
  // A notification arrives for each write that completed OK, and for no other.
  std::vector<bool> notified(kWrites, false);
  for (int i = 0; i < completed; ++i) {
    Notification n;
    ASSERT_TRUE(notes_.Pop(&n, Soon()));
    notified[n.layer] = true;
  }
  Notification extra;
  EXPECT_FALSE(notes_.Pop(&extra, DeadlineAfterMs(200))) << "notified canceled write " << extra.layer;
  for (int i = 0; i < kWrites; ++i) {
    EXPECT_EQ(notified[i], hs[i]->Wait(Clock::now()).ok()) << i;
  }
  EXPECT_TRUE(ep_->status().ok());
}

}  // namespace kvstream::transport::conformance
