// Peer failure over UCX between two processes: SIGKILL the receiver mid-stream; the writer
// must see kRemoteDisconnect on pending or later writes and on the endpoint within a deadline,
// never hang, and keep working with another peer.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

#include "tests/transport/process_fixture.h"

namespace kvstream::transport {
namespace {

constexpr size_t kChunk = 4 << 20, kSlots = 8;

class KillPeer : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto t = CreateTransport(test::Options("ucx", GetParam().substr(0, GetParam().find('+'))));
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    t_ = std::move(t).value();
    src_.resize(kChunk * kSlots);
    for (size_t l = 0; l < kSlots; ++l) test::FillPattern(src_.data() + l * kChunk, kChunk, 50 + l);
    reg_ = std::move(t_->Register(MemoryRegion{src_.data(), src_.size()})).value();
  }
  WriteRequest Layer(size_t l) {
    WriteRequest r;
    r.local = reg_.get();
    r.ops = {CopyOp{(l % kSlots) * kChunk, (l % kSlots) * kChunk, kChunk}};
    r.notify = true;
    r.notification = Notification{50, static_cast<int32_t>(l % kSlots), 0};
    return r;
  }
  std::unique_ptr<Transport> t_;
  std::vector<uint8_t> src_;
  std::unique_ptr<Registration> reg_;
};

TEST_P(KillPeer, DisconnectSurfacesWithinDeadlineAndTheWriterKeepsWorking) {
  auto peer = test::StartPeer(GetParam(), kChunk * kSlots, kChunk);
  ASSERT_NE(peer, nullptr);
  auto ep = test::ConnectAdmitted(*t_, *peer, peer->descriptor);
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();

  // Stream with 4 writes outstanding; kill the peer after 6 confirmed layers.
  std::deque<std::unique_ptr<WriteHandle>> window;
  size_t next = 0;
  int notes = 0;
  while (notes < 6) {
    while (window.size() < 4) {
      auto h = (*ep)->Write(Layer(next++));
      ASSERT_TRUE(h.ok()) << h.status().ToString();
      window.push_back(std::move(h).value());
    }
    ASSERT_TRUE(window.front()->Wait(DeadlineAfterMs(10000)).ok());
    window.pop_front();
    std::string line;
    while (notes < 6 && peer->process.ReadLine(&line, Clock::now())) {
      EXPECT_NE(line.find(" OK"), std::string::npos) << line;
      ++notes;
    }
  }
  peer->process.Kill();
  auto killed_at = Clock::now();

  // Keep writing: every Wait returns by its deadline, and the failure shows within 10 s.
  Status failure;
  while (failure.ok() && SecondsSince(killed_at) < 10) {
    while (window.size() < 4 && failure.ok()) {
      auto h = (*ep)->Write(Layer(next++));
      if (!h.ok()) {
        failure = h.status();
        break;
      }
      window.push_back(std::move(h).value());
    }
    if (window.empty()) break;
    auto t0 = Clock::now();
    Status s = window.front()->Wait(DeadlineAfterMs(500));
    EXPECT_LT(SecondsSince(t0), 1.0) << "Wait overran its deadline";
    if (s.code() == StatusCode::kTimeout) continue;
    window.pop_front();
    if (!s.ok()) failure = s;
  }
  ASSERT_FALSE(failure.ok()) << "peer death not reported within 10 s";
  EXPECT_EQ(failure.code(), StatusCode::kRemoteDisconnect) << failure.ToString();
  double detect_s = SecondsSince(killed_at);
  // The endpoint reports it too (soon after the write did), and later writes fail with it.
  auto status_deadline = DeadlineAfterMs(5000);
  while ((*ep)->status().ok() && !Expired(status_deadline)) usleep(1000);
  EXPECT_EQ((*ep)->status().code(), StatusCode::kRemoteDisconnect);
  auto later = (*ep)->Write(Layer(0));
  ASSERT_FALSE(later.ok());
  EXPECT_EQ(later.status().code(), StatusCode::kRemoteDisconnect);
  // Pending writes end with an error, none hangs.
  for (auto& h : window) {
    Status s = h->Wait(DeadlineAfterMs(5000));
    EXPECT_NE(s.code(), StatusCode::kTimeout) << "a write stayed pending after the peer died";
  }
  auto t0 = Clock::now();
  ep->reset();
  EXPECT_LT(SecondsSince(t0), 3.0) << "closing an endpoint to a dead peer must be bounded";
  std::printf("peer death detected after %.3f s\n", detect_s);

  // The stable side keeps working: a new peer, same transport and registration.
  auto peer2 = test::StartPeer(GetParam(), kChunk * kSlots, kChunk);
  ASSERT_NE(peer2, nullptr);
  auto ep2 = test::ConnectAdmitted(*t_, *peer2, peer2->descriptor);
  ASSERT_TRUE(ep2.ok()) << ep2.status().ToString();
  for (size_t l = 0; l < kSlots; ++l) {
    auto h = (*ep2)->Write(Layer(l));
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    ASSERT_TRUE((*h)->Wait(DeadlineAfterMs(10000)).ok());
  }
  for (size_t l = 0; l < kSlots; ++l) {
    std::string line;
    ASSERT_TRUE(peer2->process.ReadLine(&line, DeadlineAfterMs(10000)));
    EXPECT_NE(line.find(" OK"), std::string::npos) << line;
  }
}

TEST_P(KillPeer, WriteToAPeerKilledBeforehandFailsFast) {
  auto peer = test::StartPeer(GetParam(), kChunk * kSlots, kChunk);
  ASSERT_NE(peer, nullptr);
  auto ep = test::ConnectAdmitted(*t_, *peer, peer->descriptor);
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  peer->process.Kill();
  auto t0 = Clock::now();
  Status failure;
  for (size_t l = 0; failure.ok() && SecondsSince(t0) < 10; ++l) {
    auto h = (*ep)->Write(Layer(l));
    if (!h.ok()) {
      failure = h.status();
      break;
    }
    Status s = (*h)->Wait(DeadlineAfterMs(2000));
    if (!s.ok() && s.code() != StatusCode::kTimeout) failure = s;
  }
  ASSERT_FALSE(failure.ok());
  EXPECT_EQ(failure.code(), StatusCode::kRemoteDisconnect) << failure.ToString();
  std::printf("dead peer detected after %.3f s\n", SecondsSince(t0));
}

// Over TCP a stopped peer acknowledges nothing, so writes cannot complete. (With same-host
// copies they do complete: the data lands in the stopped process's memory.)
using StalledPeer = KillPeer;

TEST_P(StalledPeer, WaitTimesOutAndClosingIsBounded) {
  auto peer = test::StartPeer(GetParam(), kChunk * kSlots, kChunk);
  ASSERT_NE(peer, nullptr);
  auto ep = test::ConnectAdmitted(*t_, *peer, peer->descriptor);
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  auto first = (*ep)->Write(Layer(0));
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE((*first)->Wait(DeadlineAfterMs(10000)).ok());

  peer->process.Signal(SIGSTOP);  // alive but silent: no acks, no progress
  std::vector<std::unique_ptr<WriteHandle>> hs;
  for (size_t l = 0; l < 2 * kSlots; ++l) {
    auto h = (*ep)->Write(Layer(l));
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    hs.push_back(std::move(h).value());
  }
  auto t0 = Clock::now();
  Status s = hs.back()->Wait(DeadlineAfterMs(300));
  double waited = SecondsSince(t0);
  EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.ToString();
  EXPECT_GE(waited, 0.29);
  EXPECT_LT(waited, 1.0) << "Wait overran its deadline";
  for (auto& h : hs) h->Cancel();
  t0 = Clock::now();
  ep->reset();
  double closing = SecondsSince(t0);
  EXPECT_LT(closing, 5.0) << "closing an endpoint to a stalled peer must be bounded";
  for (auto& h : hs) {
    ASSERT_TRUE(h->Done());
    Status hs_status = h->Wait(Clock::now());
    EXPECT_TRUE(hs_status.ok() || hs_status.code() == StatusCode::kCanceled) << hs_status.ToString();
  }
  std::printf("stalled peer: endpoint closed in %.3f s\n", closing);
  peer->process.Signal(SIGCONT);
}

std::string TlsName(const ::testing::TestParamInfo<std::string>& info) {
  if (info.param.empty()) return "default";
  std::string n = info.param;
  std::replace(n.begin(), n.end(), ',', '_');
  std::replace(n.begin(), n.end(), '+', '_');
  return n;
}

INSTANTIATE_TEST_SUITE_P(Ucx, KillPeer, ::testing::Values("tcp", "sm,tcp", "sm,tcp+alloc", ""), TlsName);
INSTANTIATE_TEST_SUITE_P(Ucx, StalledPeer, ::testing::Values("tcp"), TlsName);

}  // namespace
}  // namespace kvstream::transport
