// The same suite over every backend built in (two transports in one process): data lands
// byte-exact, notifications only after their data, coalescing, bad input refused without
// disturbing other writes, deadlines respected, lifetimes.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "tests/transport/test_util.h"
#include "transport/transport.h"

namespace kvstream::transport {
namespace {

using test::BackendConfig;
using test::NotificationQueue;

constexpr size_t kRegion = 4 << 20;

class TransportConformance : public ::testing::TestWithParam<BackendConfig> {
 protected:
  void SetUp() override {
    auto a = CreateTransport(GetParam().options);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    auto b = CreateTransport(GetParam().options);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    writer_ = std::move(a).value();
    reader_ = std::move(b).value();
    reader_->SetNotificationSink([this](const Notification& n) { OnNotification(n); });

    src_.assign(kRegion, 0);
    test::FillPattern(src_.data(), src_.size(), 1);
    dst_.assign(kRegion, 0);
    auto ls = writer_->Register(MemoryRegion{src_.data(), src_.size()});
    ASSERT_TRUE(ls.ok()) << ls.status().ToString();
    local_ = std::move(ls).value();
    auto rd = reader_->Register(MemoryRegion{dst_.data(), dst_.size()});
    ASSERT_TRUE(rd.ok()) << rd.status().ToString();
    remote_ = std::move(rd).value();
    ep_ = Connect();
    ASSERT_NE(ep_, nullptr);
  }

  void TearDown() override {
    ep_.reset();
    if (reader_) reader_->SetNotificationSink(nullptr);
  }

  std::unique_ptr<Endpoint> Connect() {
    PeerDescriptor peer;
    peer.address = reader_->LocalAddress();
    peer.regions.push_back(RemoteRegion{reinterpret_cast<uint64_t>(dst_.data()), dst_.size(),
                                        remote_->RemoteKey()});
    auto ep = test::ConnectAdmitted(*writer_, *reader_, peer);
    EXPECT_TRUE(ep.ok()) << ep.status().ToString();
    return ep.ok() ? std::move(ep).value() : nullptr;
  }

  // Called on the reader's transport thread: records whether the write's data was already
  // complete when its notification arrived.
  virtual void OnNotification(const Notification& n) {
    if (n.flags == kCheckOnArrival) {
      uint64_t off = static_cast<uint64_t>(n.layer) * kChunk;
      bool ok = std::memcmp(dst_.data() + off, src_.data() + off, kChunk) == 0;
      if (!ok) data_missing_at_notification_.fetch_add(1);
    }
    notes_.Push(n);
  }

  static constexpr int32_t kCheckOnArrival = 1;
  static constexpr size_t kChunk = 256 << 10;

  WriteRequest Request(std::vector<CopyOp> ops, bool notify = false, Notification n = {}) {
    WriteRequest r;
    r.local = local_.get();
    r.remote_region = 0;
    r.ops = std::move(ops);
    r.notify = notify;
    r.notification = n;
    return r;
  }

  std::unique_ptr<Transport> writer_, reader_;
  std::vector<uint8_t> src_, dst_;
  std::unique_ptr<Registration> local_, remote_;
  std::unique_ptr<Endpoint> ep_;
  NotificationQueue notes_;
  std::atomic<int> data_missing_at_notification_{0};
};

Deadline Soon() { return DeadlineAfterMs(10000); }

TEST_P(TransportConformance, ReportsNameAndCapabilities) {
  EXPECT_EQ(writer_->name(), GetParam().options.backend);
  EXPECT_TRUE(writer_->capabilities().host_memory);
  EXPECT_TRUE(writer_->capabilities().notifications);
  EXPECT_FALSE(writer_->LocalAddress().empty());
  EXPECT_TRUE(ep_->status().ok());
}

TEST_P(TransportConformance, ScatteredOpsLandByteExact) {
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
    std::memcpy(expect.data() + op.remote_offset, src_.data() + op.local_offset, op.length);
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
  EXPECT_EQ(0, std::memcmp(dst_.data(), expect.data(), kRegion));
}

TEST_P(TransportConformance, NotificationOnlyAfterItsData) {
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
  EXPECT_EQ(0, std::memcmp(dst_.data(), src_.data(), 16 * kChunk));
}

TEST_P(TransportConformance, CoalescesAdjacentOps) {
  std::vector<CopyOp> adjacent;
  for (uint64_t i = 0; i < 32; ++i) adjacent.push_back(CopyOp{i * 1024, 8192 + i * 1024, 1024});
  auto h = ep_->Write(Request(adjacent));
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE((*h)->Wait(Soon()).ok());
  EXPECT_EQ((*h)->transfers(), 1u);
  EXPECT_EQ(0, std::memcmp(dst_.data() + 8192, src_.data(), 32 * 1024));

  // Contiguous locally but not remotely, and a gap: three runs.
  std::vector<CopyOp> mixed = {{0, 0, 100}, {100, 200, 100}, {200, 300, 100}, {1000, 1000, 5}};
  auto h2 = ep_->Write(Request(mixed));
  ASSERT_TRUE(h2.ok());
  ASSERT_TRUE((*h2)->Wait(Soon()).ok());
  EXPECT_EQ((*h2)->transfers(), 3u);
  EXPECT_EQ((*h2)->bytes(), 305u);
  EXPECT_EQ(0, std::memcmp(dst_.data() + 200, src_.data() + 100, 200));
}

TEST_P(TransportConformance, BadInputRefusedWithoutDisturbingOthers) {
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
  expect_invalid(foreign, "registration of another transport");

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
  EXPECT_EQ(0, std::memcmp(dst_.data(), src_.data(), kRegion));
  EXPECT_TRUE(ep_->status().ok());
  // And the endpoint still works afterwards.
  auto after = ep_->Write(Request({{0, 0, 4096}}));
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE((*after)->Wait(Soon()).ok());
}

TEST_P(TransportConformance, RefusesBadRegistrationAndPeerData) {
  EXPECT_EQ(writer_->Register(MemoryRegion{nullptr, 10}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(writer_->Register(MemoryRegion{src_.data(), 0}).status().code(),
            StatusCode::kInvalidArgument);
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
  EXPECT_EQ(0, std::memcmp(dst_.data(), src_.data(), kThreads * kPerThread * kSlice));
}

TEST_P(TransportConformance, AllocatedMemoryMovesLikeRegistered) {
  auto a = writer_->Allocate(1 << 20);
  auto b = reader_->Allocate(1 << 20);
  if (a.status().code() == StatusCode::kNotSupported) GTEST_SKIP() << a.status().ToString();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto* s = static_cast<uint8_t*>((*a)->region().addr);
  auto* d = static_cast<uint8_t*>((*b)->region().addr);
  ASSERT_GE((*a)->region().length, size_t{1} << 20);
  test::FillPattern(s, 1 << 20, 5);
  std::memset(d, 0, 1 << 20);
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
  EXPECT_TRUE(test::CheckPattern(d, 1 << 20, 5));
}

TEST_P(TransportConformance, HandlesOutliveEndpointAndTransport) {
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
  // After the endpoint is gone, the destination is never touched again.
  auto h = ep_->Write(Request({{0, 0, kRegion}}));
  ASSERT_TRUE(h.ok());
  ep_.reset();
  std::vector<uint8_t> snapshot = dst_;
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(snapshot, dst_);
}

TEST_P(TransportConformance, CancelNotifiesExactlyTheWritesThatCompleted) {
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
  for (int i = kWrites - 1; i >= 0; i -= 2) EXPECT_TRUE(hs[i]->Cancel());
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

std::string ConfigName(const ::testing::TestParamInfo<BackendConfig>& info) {
  return info.param.label;
}

INSTANTIATE_TEST_SUITE_P(Backends, TransportConformance, ::testing::ValuesIn(test::AllConfigs()),
                         ConfigName);

TEST(TransportRegistry, KnowsItsBackends) {
  auto built = AvailableBackends();
  EXPECT_NE(std::find(built.begin(), built.end(), "fake"), built.end());
  auto t = CreateTransport(test::Options("no-such-backend"));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotSupported);
}

}  // namespace
}  // namespace kvstream::transport
