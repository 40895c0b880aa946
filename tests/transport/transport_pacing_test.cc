// Pacing (transport/pacing.h): the token bucket alone, then PacedEndpoint over every CPU backend
// built in (fake, ucx): achieved rate, burst, exact data and notifications, writers sharing one
// budget, deadlines, cancel, close, failures; then CreateTransport's options and the ITL formula.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <random>
#include <thread>
#include <vector>

#include "tests/transport/test_util.h"
#include "transport/pacing.h"
#include "transport/testing/fake_transport.h"
#include "transport/transport.h"

namespace kvstream::transport {
namespace {

using test::BackendConfig;
using test::NotificationQueue;

constexpr uint64_t kMiB = 1 << 20;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Measures how long this process was kept off the CPU: a thread sleeping 1 ms at a time adds up
// every wake-up that came more than 0.5 ms late. A shared machine's CPU quota or a busy neighbour
// can stall every thread for tens of ms, longer than a burst covers, and then no rate limiter
// can keep its rate; such an attempt says nothing about the pacing.
class StallMeter {
 public:
  StallMeter() : t_([this] {
    while (!stop_.load()) {
      const auto t0 = Clock::now();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      const double late = Seconds(Clock::now() - t0) - 1e-3;
      if (late > 0.5e-3) stalled_us_.fetch_add(int64_t(late * 1e6));
    }
  }) {}
  ~StallMeter() {
    stop_ = true;
    t_.join();
  }
  double stalled_s() const { return double(stalled_us_.load()) * 1e-6; }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> stalled_us_{0};
  std::thread t_;
};

// Timing on a loaded machine (CI runs tests in parallel on 2 cores): `attempt` checks what must
// hold under any load itself (data exact, never faster than the budget) and returns "" when its
// timing was also within tolerance, else what was off. An attempt that was off while the process
// was stalled for >= 20 ms is inconclusive and retried; one that was off without such a stall
// fails the test. Up to 5 attempts; if all were inconclusive, only the load-independent checks
// count (and the test says so).
template <typename F>
void WithinToleranceOnce(F attempt) {
  for (int i = 0; i < 5; ++i) {
    std::string why;
    double stalled = 0;
    {
      StallMeter meter;
      why = attempt();
      stalled = meter.stalled_s();
    }
    if (why.empty() || ::testing::Test::HasFailure()) return;
    if (stalled < 0.020) {
      ADD_FAILURE() << why << " (the process was not stalled: " << stalled * 1e3 << " ms)";
      return;
    }
    std::fprintf(stderr, "timing attempt %d inconclusive: %s while the process was stalled for %.0f ms\n",
                 i + 1, why.c_str(), stalled * 1e3);
  }
  std::fprintf(stderr, "timing inconclusive in every attempt (machine too loaded); only the "
                       "load-independent checks applied\n");
}

std::string Off(const char* what, double got, double lo, double hi) {
  if (got >= lo && got <= hi) return "";
  return std::string(what) + " " + std::to_string(got) + " not in [" + std::to_string(lo) + ", " +
         std::to_string(hi) + "]";
}

// ---- TokenBucket ---------------------------------------------------------------------------------

TEST(TokenBucket, UnlimitedReleasesAtOnce) {
  TokenBucket b(0, 0);
  EXPECT_TRUE(b.unlimited());
  const auto now = Clock::now();
  EXPECT_LE(b.Reserve(uint64_t(1) << 40), now + std::chrono::milliseconds(1));
}

TEST(TokenBucket, BurstAtOnceThenTheRate) {
  TokenBucket b(1e6, 100000);  // 1 MB/s, 100 kB burst
  const auto t0 = Clock::now();
  const auto r0 = b.Reserve(100000);
  EXPECT_LE(r0, Clock::now());  // the whole burst at once
  const auto r1 = b.Reserve(50000);            // then 50 ms for 50 kB
  EXPECT_NEAR(Seconds(r1 - t0), 0.050, 0.005);
  const auto r2 = b.Reserve(10000);            // in call order: after r1's bytes
  EXPECT_NEAR(Seconds(r2 - r1), 0.010, 0.002);
  EXPECT_EQ(b.reserved_bytes(), 160000u);
}

TEST(TokenBucket, RefundAndDeadline) {
  TokenBucket b(1e6, 100000);
  const auto t0 = Clock::now();
  EXPECT_FALSE(b.Acquire(1000000, DeadlineAfterMs(20)));  // needs ~0.9 s
  EXPECT_LT(Seconds(Clock::now() - t0), 0.010) << "a refused Acquire must not sleep";
  const auto r0 = b.Reserve(100000);
  EXPECT_LE(r0, Clock::now()) << "the refused bytes were given back";
  b.Refund(100000);
  EXPECT_TRUE(b.Acquire(100000, DeadlineAfterMs(10)));
  EXPECT_EQ(b.reserved_bytes(), 100000u);
}

TEST(TokenBucket, SetChangesTheRate) {
  TokenBucket b(1e6, 1000);
  b.Reserve(1000);
  b.Set(1e7, 1000);
  const auto t0 = Clock::now();
  EXPECT_NEAR(Seconds(b.Reserve(100000) - t0), 0.010, 0.002);
  EXPECT_DOUBLE_EQ(b.rate(), 1e7);
}

TEST(TokenBucket, ConcurrentAcquirersShareTheRate) {
  WithinToleranceOnce([]() -> std::string {
    const double rate = 20e6;
    const uint64_t burst = 128 << 10, chunk = 64 << 10;
    TokenBucket b(rate, burst);
    std::atomic<bool> stop{false};
    std::vector<uint64_t> got(4, 0);
    const auto t0 = Clock::now();
    std::vector<std::thread> ts;
    for (int i = 0; i < 4; ++i) {
      ts.emplace_back([&, i] {
        while (!stop.load()) {
          if (b.Acquire(chunk, DeadlineAfterMs(1000))) got[i] += chunk;
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    const double elapsed = Seconds(Clock::now() - t0);
    const uint64_t total_at_stop = b.reserved_bytes();
    stop = true;
    for (auto& t : ts) t.join();
    const double budget = double(burst) + rate * elapsed;
    // Reservations may run ahead of the clock by what the 4 waiting threads hold.
    EXPECT_LE(double(total_at_stop), budget + 4.0 * chunk) << "the shared rate was exceeded";
    uint64_t total = 0;
    for (uint64_t g : got) total += g;
    for (uint64_t g : got) {
      if (double(g) < 0.12 * double(total)) return "a writer got " + std::to_string(g) + " of " +
                                                    std::to_string(total) + " bytes";
    }
    return Off("bytes reserved / budget", double(total_at_stop) / budget, 0.9, 1.1);
  });
}

// ---- PacedEndpoint over every backend --------------------------------------------------------------

constexpr size_t kRegion = 32 * kMiB;
Deadline Soon() { return DeadlineAfterMs(10000); }

class Paced : public ::testing::TestWithParam<BackendConfig> {
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
    test::FillPattern(src_.data(), src_.size(), 5);
    dst_.assign(kRegion, 0);
    local_ = std::move(writer_->Register(MemoryRegion{src_.data(), src_.size()})).value();
    remote_ = std::move(reader_->Register(MemoryRegion{dst_.data(), dst_.size()})).value();
    peer_.address = reader_->LocalAddress();
    peer_.regions.push_back(RemoteRegion{reinterpret_cast<uint64_t>(dst_.data()), dst_.size(),
                                         remote_->RemoteKey()});
  }
  void TearDown() override {
    if (reader_) reader_->SetNotificationSink(nullptr);
  }

  // Notifications with flags == kCheck carry [layer * kMiB, +request_id MiB) as their range:
  // the sink records whether those bytes had all landed when it arrived.
  static constexpr int32_t kCheck = 1;
  void OnNotification(const Notification& n) {
    if (n.flags == kCheck) {
      const uint64_t off = uint64_t(n.layer) * kMiB, len = n.request_id * kMiB;
      if (std::memcmp(dst_.data() + off, src_.data() + off, len) != 0) early_.fetch_add(1);
    }
    notes_.Push(n);
  }

  std::unique_ptr<Endpoint> Connect(std::shared_ptr<TokenBucket> bucket, uint64_t chunk) {
    auto inner = test::ConnectAdmitted(*writer_, *reader_, peer_);
    // UCX over TCP sometimes refuses a connection on a heavily loaded machine ("Destination is
    // unreachable", a transport matter the transport tests cover); what is tested here starts
    // once connected, so a refused connection is tried again.
    for (int i = 0; i < 3 && !inner.ok() && inner.status().code() == StatusCode::kRemoteDisconnect; ++i) {
      std::fprintf(stderr, "connect refused (%s), retrying\n", inner.status().ToString().c_str());
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      inner = test::ConnectAdmitted(*writer_, *reader_, peer_);
    }
    EXPECT_TRUE(inner.ok()) << inner.status().ToString();
    if (!inner.ok()) return nullptr;
    // One empty write first, so that connection set-up (UCX wires up lazily) is not timed.
    WriteRequest warm;
    warm.local = local_.get();
    auto w = (*inner)->Write(warm);
    EXPECT_TRUE(w.ok() && (*w)->Wait(Soon()).ok());
    auto ep = PaceEndpoint(std::move(inner).value(), peer_, std::move(bucket), chunk);
    EXPECT_TRUE(ep.ok()) << ep.status().ToString();
    return ep.ok() ? std::move(ep).value() : nullptr;
  }

  // One contiguous write of `mib` MiB at `at_mib`, notified (checked on arrival).
  WriteRequest Span(uint64_t at_mib, uint64_t mib, bool notify = true) {
    WriteRequest r;
    r.local = local_.get();
    r.ops = {CopyOp{at_mib * kMiB, at_mib * kMiB, mib * kMiB}};
    r.notify = notify;
    r.notification = Notification{mib, int32_t(at_mib), kCheck};
    return r;
  }
  bool Landed(uint64_t at_mib, uint64_t mib) {
    return std::memcmp(dst_.data() + at_mib * kMiB, src_.data() + at_mib * kMiB, mib * kMiB) == 0;
  }

  std::unique_ptr<Transport> writer_, reader_;
  std::vector<uint8_t> src_, dst_;
  std::unique_ptr<Registration> local_, remote_;
  PeerDescriptor peer_;
  NotificationQueue notes_;
  std::atomic<int> early_{0};
};

TEST_P(Paced, AchievesTheSetRateWithExactDataAndOneNotification) {
  WithinToleranceOnce([this]() -> std::string {
    std::fill(dst_.begin(), dst_.end(), 0);
    const double rate = 96.0 * kMiB;
    const uint64_t burst = 4 * kMiB;  // absorbs ~40 ms of scheduling delay
    auto ep = Connect(std::make_shared<TokenBucket>(rate, burst), 256 << 10);
    if (!ep) return "no endpoint";
    const auto t0 = Clock::now();
    auto h = ep->Write(Span(0, 32));
    EXPECT_TRUE(h.ok()) << h.status().ToString();
    if (!h.ok()) return "";
    EXPECT_TRUE((*h)->Wait(Soon()).ok());
    const double elapsed = Seconds(Clock::now() - t0);
    const double paced = double(32 * kMiB - burst) / rate;  // what the budget allows: 292 ms
    EXPECT_GE(elapsed, 0.99 * paced) << "faster than the budget";
    EXPECT_EQ((*h)->bytes(), 32 * kMiB);
    EXPECT_EQ((*h)->transfers(), 128u);  // 32 MiB in 256 KiB pieces
    EXPECT_TRUE(Landed(0, 32));
    Notification n;
    EXPECT_TRUE(notes_.Pop(&n, Soon()));
    EXPECT_EQ(n.layer, 0);
    EXPECT_EQ(early_.load(), 0) << "notification before all chunks landed";
    EXPECT_FALSE(notes_.Pop(&n, DeadlineAfterMs(100))) << "one write, one notification";
    // Pacing must never exceed the set rate; below it, a loaded machine may simply not deliver
    // (UCX over loopback TCP shares CI's two cores with the pacer), so the floor is loose.
    return Off("achieved rate / set rate", paced / elapsed, 0.8, 1.01);
  });
}

TEST_P(Paced, BurstGoesAtOnceThenTheRate) {
  WithinToleranceOnce([this]() -> std::string {
    std::fill(dst_.begin(), dst_.end(), 0);
    const double rate = 8.0 * kMiB;
    auto ep = Connect(std::make_shared<TokenBucket>(rate, 4 * kMiB), 512 << 10);
    if (!ep) return "no endpoint";
    const auto t0 = Clock::now();
    auto a = ep->Write(Span(0, 4));  // the burst: 500 ms of the rate, goes at once
    auto b = ep->Write(Span(4, 2));  // then 250 ms at the rate
    EXPECT_TRUE(a.ok() && b.ok());
    if (!a.ok() || !b.ok()) return "";
    EXPECT_TRUE((*a)->Wait(Soon()).ok());
    const double burst_s = Seconds(Clock::now() - t0);
    EXPECT_TRUE((*b)->Wait(Soon()).ok());
    const double elapsed = Seconds(Clock::now() - t0);
    EXPECT_GE(elapsed, 0.99 * 0.25) << "faster than the budget after the burst";
    EXPECT_TRUE(Landed(0, 6));
    EXPECT_EQ(early_.load(), 0);
    // Held back, the burst would take 0.5 s; the bounds leave room for the backend's own time.
    std::string why = Off("burst seconds", burst_s, 0, 0.3);
    return why.empty() ? Off("seconds for burst + 2 MiB", elapsed, 0.2475, 0.25 * 1.1 + 0.04) : why;
  });
}

TEST_P(Paced, ScatteredOpsAcrossChunksLandExact) {
  // 1500 runs of 1-3 blocks of 4 KiB from random sources into distinct 16 KiB slots: some runs
  // coalesce, many cross the 64 KiB chunk boundaries.
  constexpr uint64_t kBlock = 4096, kSlot = 4 * kBlock, kSlots = kRegion / kSlot;
  std::vector<uint64_t> slots(kSlots);
  for (uint64_t i = 0; i < kSlots; ++i) slots[i] = i;
  std::mt19937_64 rng(11);
  std::shuffle(slots.begin(), slots.end(), rng);
  WriteRequest r;
  r.local = local_.get();
  std::vector<uint8_t> expect(kRegion, 0);
  for (size_t i = 0; i < 1500; ++i) {
    const uint64_t len = kBlock * (1 + i % 3);
    const uint64_t src = (rng() % (kRegion / kBlock - 3)) * kBlock;
    r.ops.push_back(CopyOp{src, slots[i] * kSlot, len});
    if (i % 5 == 0) {  // a neighbour continuing it on both sides: coalesces
      r.ops.push_back(CopyOp{src + len, slots[i] * kSlot + len, kSlot - len});
    }
  }
  for (const CopyOp& op : r.ops)
    std::memcpy(expect.data() + op.remote_offset, src_.data() + op.local_offset, op.length);
  r.notify = true;
  r.notification = Notification{0, 0, 0};
  auto ep = Connect(std::make_shared<TokenBucket>(200.0 * kMiB, 256 << 10), 64 << 10);
  ASSERT_NE(ep, nullptr);
  auto h = ep->Write(r);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_TRUE((*h)->Wait(Soon()).ok());
  EXPECT_EQ(dst_, expect);
  Notification n;
  ASSERT_TRUE(notes_.Pop(&n, Soon()));
  EXPECT_FALSE(notes_.Pop(&n, DeadlineAfterMs(50)));
}

TEST_P(Paced, OverlappingOpsInDifferentChunksKeepTheirOrder) {
  // Three ops onto the same 1 MiB destination, each in its own chunks: the last one wins.
  WriteRequest r;
  r.local = local_.get();
  for (uint64_t src : {2, 5, 9}) r.ops.push_back(CopyOp{src * kMiB, 0, kMiB});
  auto ep = Connect(std::make_shared<TokenBucket>(200.0 * kMiB, 512 << 10), 256 << 10);
  ASSERT_NE(ep, nullptr);
  auto h = ep->Write(r);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE((*h)->Wait(Soon()).ok());
  EXPECT_EQ(0, std::memcmp(dst_.data(), src_.data() + 9 * kMiB, kMiB));
}

TEST_P(Paced, ConcurrentWritersShareOneBudget) {
  WithinToleranceOnce([this]() -> std::string {
    std::fill(dst_.begin(), dst_.end(), 0);
    const double rate = 64.0 * kMiB;
    const uint64_t burst = 2 * kMiB;  // absorbs ~30 ms of scheduling delay
    auto bucket = std::make_shared<TokenBucket>(rate, burst);
    auto ep1 = Connect(bucket, 256 << 10);
    auto ep2 = Connect(bucket, 256 << 10);
    if (!ep1 || !ep2) return "no endpoint";
    // Endpoint 1 gets writes A then B (served in that order), endpoint 2 gets C, from another
    // thread; 8 MiB each. A and C share the rate (each alone would take 1/3 of the time).
    std::vector<double> done_at(3, 0);
    std::vector<Status> st(3);
    const auto t0 = Clock::now();
    auto post_and_wait = [&](Endpoint* ep, std::vector<int> which) {
      std::vector<std::unique_ptr<WriteHandle>> hs;
      for (int i : which) {
        auto h = ep->Write(Span(uint64_t(i) * 8, 8));
        if (!h.ok()) {
          st[i] = h.status();
          return;
        }
        hs.push_back(std::move(h).value());
      }
      for (size_t k = 0; k < hs.size(); ++k) {
        st[which[k]] = hs[k]->Wait(Soon());
        done_at[which[k]] = Seconds(Clock::now() - t0);
      }
    };
    std::thread t1(post_and_wait, ep1.get(), std::vector<int>{0, 1});
    std::thread t2(post_and_wait, ep2.get(), std::vector<int>{2});
    t1.join();
    t2.join();
    const double elapsed = Seconds(Clock::now() - t0);
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(st[i].ok()) << i << ": " << st[i].ToString();
    const double paced = double(24 * kMiB - burst) / rate;
    EXPECT_GE(elapsed, 0.99 * paced) << "the writers together exceeded the shared budget";
    EXPECT_LT(done_at[0], done_at[1]) << "one endpoint serves its writes in order";
    EXPECT_TRUE(Landed(0, 24));
    Notification n;
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(notes_.Pop(&n, Soon()));
    EXPECT_EQ(early_.load(), 0);
    std::string why = Off("achieved rate / set rate", paced / elapsed, 0.8, 1.01);
    if (why.empty()) why = Off("A's share (done at / total)", done_at[0] / elapsed, 0.42, 1);
    if (why.empty()) why = Off("C's share (done at / total)", done_at[2] / elapsed, 0.42, 1);
    return why;
  });
}

TEST_P(Paced, WaitKeepsItsDeadlineAndCancelStopsQuickly) {
  // Bounds are loose against scheduling delays on a loaded machine, tight against the 4 s the
  // budget would take.
  auto bucket = std::make_shared<TokenBucket>(4.0 * kMiB, 512 << 10);
  auto ep = Connect(bucket, 256 << 10);
  ASSERT_NE(ep, nullptr);
  auto h = ep->Write(Span(0, 16));  // 4 s at this rate
  ASSERT_TRUE(h.ok());
  auto t0 = Clock::now();
  EXPECT_EQ((*h)->Wait(DeadlineAfterMs(100)).code(), StatusCode::kTimeout);
  const double waited = Seconds(Clock::now() - t0);
  EXPECT_GE(waited, 0.095);
  EXPECT_LT(waited, 0.6);
  t0 = Clock::now();
  EXPECT_TRUE((*h)->Cancel());
  EXPECT_EQ((*h)->Wait(DeadlineAfterMs(3000)).code(), StatusCode::kCanceled);
  EXPECT_LT(Seconds(Clock::now() - t0), 1.0) << "cancel waited for the budget";
  EXPECT_FALSE(Landed(0, 16));
  Notification n;
  EXPECT_FALSE(notes_.Pop(&n, DeadlineAfterMs(200))) << "a cancelled write was notified";
  // The endpoint goes on: the next write is paced from what the bucket holds now (~0.25 s for
  // 1 MiB), not queued behind the cancelled one's 3.5 s.
  t0 = Clock::now();
  auto next = ep->Write(Span(20, 1));
  ASSERT_TRUE(next.ok());
  ASSERT_TRUE((*next)->Wait(Soon()).ok());
  EXPECT_LT(Seconds(Clock::now() - t0), 1.2);
  EXPECT_TRUE(Landed(20, 1));
  ASSERT_TRUE(notes_.Pop(&n, Soon()));
  EXPECT_EQ(n.layer, 20);
}

TEST_P(Paced, CancelAfterCompletionKeepsOk) {
  auto ep = Connect(std::make_shared<TokenBucket>(64.0 * kMiB, 2 * kMiB), 256 << 10);
  ASSERT_NE(ep, nullptr);
  auto h = ep->Write(Span(0, 1));
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE((*h)->Wait(Soon()).ok());
  (*h)->Cancel();
  EXPECT_TRUE((*h)->Wait(Clock::now()).ok());
}

TEST_P(Paced, BadInputIsRefusedAtWrite) {
  auto ep = Connect(std::make_shared<TokenBucket>(64.0 * kMiB, 2 * kMiB), 256 << 10);
  ASSERT_NE(ep, nullptr);
  WriteRequest r = Span(0, 1);
  r.ops.push_back(CopyOp{0, kRegion - 100, 4096});  // past the remote region
  auto a = ep->Write(r);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
  r = Span(0, 1);
  r.remote_region = 1;
  EXPECT_EQ(ep->Write(r).status().code(), StatusCode::kInvalidArgument);
  r = Span(0, 1);
  r.local = nullptr;
  EXPECT_EQ(ep->Write(r).status().code(), StatusCode::kInvalidArgument);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(std::all_of(dst_.begin(), dst_.end(), [](uint8_t x) { return x == 0; }))
      << "a refused write posted something";
  auto ok = ep->Write(Span(3, 1));
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE((*ok)->Wait(Soon()).ok());
  EXPECT_TRUE(ep->status().ok());
}

TEST_P(Paced, EmptyWriteStillNotifies) {
  auto ep = Connect(std::make_shared<TokenBucket>(64.0 * kMiB, 2 * kMiB), 256 << 10);
  ASSERT_NE(ep, nullptr);
  WriteRequest r;
  r.local = local_.get();
  r.notify = true;
  r.notification = Notification{7, 3, 0};
  auto h = ep->Write(r);
  ASSERT_TRUE(h.ok());
  EXPECT_TRUE((*h)->Wait(Soon()).ok());
  Notification n;
  ASSERT_TRUE(notes_.Pop(&n, Soon()));
  EXPECT_EQ(n.request_id, 7u);
}

TEST_P(Paced, ClosingTheEndpointMidWriteStopsItBounded) {
  auto ep = Connect(std::make_shared<TokenBucket>(4.0 * kMiB, 512 << 10), 256 << 10);
  ASSERT_NE(ep, nullptr);
  auto h = ep->Write(Span(0, 16));  // 4 s at this rate
  ASSERT_TRUE(h.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  const auto t0 = Clock::now();
  ep.reset();
  EXPECT_LT(Seconds(Clock::now() - t0), 3.0) << "close waited for the budget";
  ASSERT_TRUE((*h)->Done());
  EXPECT_EQ((*h)->Wait(Clock::now()).code(), StatusCode::kCanceled);
  const std::vector<uint8_t> snapshot = dst_;
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(snapshot, dst_) << "bytes landed after the paced endpoint was destroyed";
  Notification n;
  EXPECT_FALSE(notes_.Pop(&n, DeadlineAfterMs(50)));
}

TEST_P(Paced, UnlimitedBucketGivesBackTheInnerEndpoint) {
  auto inner = test::ConnectAdmitted(*writer_, *reader_, peer_);
  ASSERT_TRUE(inner.ok());
  Endpoint* raw = inner->get();
  auto ep = PaceEndpoint(std::move(inner).value(), peer_, std::make_shared<TokenBucket>(0, 0));
  ASSERT_TRUE(ep.ok());
  EXPECT_EQ(ep->get(), raw);
}

std::string ConfigName(const ::testing::TestParamInfo<BackendConfig>& info) {
  return info.param.label;
}
// Every CPU backend built in; the UCX ones on the loopback device, so that the pacing tests do
// not depend on the host's other interfaces (UCX's own device choice is covered by the
// transport conformance suite).
std::vector<BackendConfig> PacingConfigs() {
  std::vector<BackendConfig> out;
  for (BackendConfig c : test::AllConfigs()) {
    if (c.options.backend == "ucx") {
      if (c.options.ucx.tls.empty()) continue;
      c.options.ucx.net_devices = "lo";
      c.label += "_lo";
    }
    out.push_back(c);
  }
  return out;
}
INSTANTIATE_TEST_SUITE_P(Backends, Paced, ::testing::ValuesIn(PacingConfigs()), ConfigName);

// ---- chunk failures (fake backend's fault injection) -------------------------------------------------

TEST(PacedFaults, AFailedChunkFailsTheWriteAndStopsIt) {
  auto writer = testing::FakeTransport::Create();
  auto reader = testing::FakeTransport::Create();
  NotificationQueue notes;
  reader->SetNotificationSink([&](const Notification& n) { notes.Push(n); });
  std::vector<uint8_t> src(8 * kMiB, 1), dst(8 * kMiB, 0);
  auto local = std::move(writer->Register(MemoryRegion{src.data(), src.size()})).value();
  auto remote = std::move(reader->Register(MemoryRegion{dst.data(), dst.size()})).value();
  PeerDescriptor peer{reader->LocalAddress(),
                      {RemoteRegion{reinterpret_cast<uint64_t>(dst.data()), dst.size(),
                                    remote->RemoteKey()}},
                      /*host=*/""};
  // 8 chunks of 1 MiB, one every 125 ms: the failure of chunk 3 is seen long before chunk 4 is
  // due, unless the process stalls.
  auto ep = std::move(PaceEndpoint(std::move(writer->Connect(peer)).value(), peer,
                                   std::make_shared<TokenBucket>(8.0 * kMiB, 1 * kMiB), kMiB))
                .value();
  const uint64_t started = writer->writes_started();
  writer->FailNthWrite(3, DataLoss("injected"));
  WriteRequest r;
  r.local = local.get();
  r.ops = {CopyOp{0, 0, 8 * kMiB}};
  r.notify = true;
  auto h = ep->Write(r);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ((*h)->Wait(Soon()).code(), StatusCode::kDataLoss);
  const uint64_t posted = writer->writes_started() - started;
  EXPECT_GE(posted, 3u);
  EXPECT_LT(posted, 8u) << "the write went on to its end after a failed chunk";
  if (posted > 3) std::fprintf(stderr, "%llu chunks posted before the failure was seen\n",
                               (unsigned long long)posted);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(writer->writes_started() - started, posted) << "chunks were posted after the write failed";
  Notification n;
  EXPECT_FALSE(notes.Pop(&n, DeadlineAfterMs(50)));
  EXPECT_EQ(0, std::memcmp(dst.data(), src.data(), 2 * kMiB));
  EXPECT_TRUE(std::all_of(dst.begin() + 2 * kMiB, dst.begin() + 3 * kMiB, [](uint8_t x) { return x == 0; }))
      << "the failed chunk copied";
  EXPECT_TRUE(std::all_of(dst.begin() + posted * kMiB, dst.end(), [](uint8_t x) { return x == 0; }));
  reader->SetNotificationSink(nullptr);
}

// ---- options and the ITL formula -----------------------------------------------------------------

TEST(PacingOptions, CreateTransportPacesWhenAsked) {
  TransportOptions o = test::Options("fake");
  o.pacing.bytes_per_s = 16.0 * kMiB;
  o.pacing.burst_bytes = 512 << 10;
  auto w = CreateTransport(o);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  auto r = CreateTransport(test::Options("fake"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*w)->name(), "fake");
  std::vector<uint8_t> src(4 * kMiB, 2), dst(4 * kMiB, 0);
  auto local = std::move((*w)->Register(MemoryRegion{src.data(), src.size()})).value();
  auto remote = std::move((*r)->Register(MemoryRegion{dst.data(), dst.size()})).value();
  PeerDescriptor peer{(*r)->LocalAddress(),
                      {RemoteRegion{reinterpret_cast<uint64_t>(dst.data()), dst.size(),
                                    remote->RemoteKey()}},
                      /*host=*/""};
  auto ep = std::move((*w)->Connect(peer)).value();
  WriteRequest req;
  req.local = local.get();
  req.ops = {CopyOp{0, 0, 4 * kMiB}};
  WithinToleranceOnce([&]() -> std::string {
    std::fill(dst.begin(), dst.end(), 0);
    const auto t0 = Clock::now();
    auto h = ep->Write(req);
    EXPECT_TRUE(h.ok());
    if (!h.ok()) return "";
    EXPECT_TRUE((*h)->Wait(Soon()).ok());
    const double elapsed = Seconds(Clock::now() - t0);
    EXPECT_EQ(src, dst);
    // The first attempt starts with a full burst, later ones with what refilled meanwhile.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const double paced = double(4 * kMiB - (512 << 10)) / (16.0 * kMiB);  // 219 ms
    EXPECT_GE(elapsed, 0.99 * paced) << "faster than the budget";
    return Off("achieved rate / set rate", paced / elapsed, 0.87, 1.01);
  });
}

TEST(PacingOptions, BadOptionsAreRefused) {
  TransportOptions o = test::Options("fake");
  o.pacing.bytes_per_s = -1;
  EXPECT_EQ(CreateTransport(o).status().code(), StatusCode::kInvalidArgument);
  o.pacing.bytes_per_s = std::nan("");
  EXPECT_EQ(CreateTransport(o).status().code(), StatusCode::kInvalidArgument);
  o = test::Options("fake");
  o.pacing.itl_target_ms = 20;  // no step time, no bandwidth
  EXPECT_EQ(CreateTransport(o).status().code(), StatusCode::kInvalidArgument);
  o.pacing.itl_device_bw_bytes_per_s = 4e12;
  o.pacing.itl_idle_step_ms = 25;  // slower than the target already
  EXPECT_EQ(CreateTransport(o).status().code(), StatusCode::kFailedPrecondition);
  o.pacing.itl_idle_step_ms = 10;
  EXPECT_TRUE(CreateTransport(o).ok());
}

TEST(PacingOptions, ResolveFillsDefaults) {
  auto p = ResolvePacingDefaults(PacingOptions{100e9, 0, 0});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->chunk_bytes, uint64_t(64) << 20);  // 100 MB in 1 ms, capped at 64 MiB
  EXPECT_EQ(p->burst_bytes, 2 * p->chunk_bytes);
  p = ResolvePacingDefaults(PacingOptions{1e6, 0, 0});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->chunk_bytes, uint64_t(256) << 10);  // 1 kB in 1 ms, raised to 256 KiB
  TransportOptions o;
  o.pacing.itl_target_ms = 12;
  o.pacing.itl_idle_step_ms = 10;
  o.pacing.itl_device_bw_bytes_per_s = 4.2e12;
  auto r = ResolvePacing(o);
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->bytes_per_s, 4.2e12 * (1 - 10.0 / 12) / 2, 1e3);
  o.pacing.bytes_per_s = 5e9;  // an explicit rate wins
  EXPECT_DOUBLE_EQ(ResolvePacing(o).value().bytes_per_s, 5e9);
  EXPECT_DOUBLE_EQ(ResolvePacing(TransportOptions{}).value().bytes_per_s, 0);
}

TEST(ItlBudget, Formula) {
  ItlBudget b;
  b.itl_target_s = 1.2e-3;
  b.idle_step_s = 1e-3;
  b.device_bw_bytes_per_s = 4e12;
  b.hbm_bytes_per_byte = 2;
  auto r = PaceRateForItlTarget(b);
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(*r, 4e12 / 6 / 2, 1e3);
  // The model's own prediction at that rate: t0 * B / (B - k r) = the target.
  EXPECT_NEAR(b.idle_step_s * 4e12 / (4e12 - 2 * *r), b.itl_target_s, 1e-9);
  // From the step's bytes when the idle time is not measured: 4 GB at 4 TB/s = 1 ms.
  b.idle_step_s = 0;
  b.step_hbm_bytes = 4e9;
  b.hbm_bytes_per_byte = 1;
  EXPECT_NEAR(PaceRateForItlTarget(b).value(), 4e12 / 6, 1e3);
  b.itl_target_s = 0.5e-3;
  EXPECT_EQ(PaceRateForItlTarget(b).status().code(), StatusCode::kFailedPrecondition);
  b.itl_target_s = 0;
  EXPECT_EQ(PaceRateForItlTarget(b).status().code(), StatusCode::kInvalidArgument);
  b.itl_target_s = 1;
  b.device_bw_bytes_per_s = 0;
  EXPECT_EQ(PaceRateForItlTarget(b).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvstream::transport
