// Fault injection of the fake backend (what the daemons' logic tests rely on).
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "tests/transport/test_util.h"
#include "transport/testing/fake_transport.h"

namespace kvstream::transport::testing {
namespace {

class FakeFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    writer_ = FakeTransport::Create();
    reader_ = FakeTransport::Create();
    reader_->SetNotificationSink([this](const Notification& n) { notes_.Push(n); });
    src_.assign(1 << 16, 0);
    test::FillPattern(src_.data(), src_.size(), 3);
    dst_.assign(1 << 16, 0);
    local_ = std::move(writer_->Register(MemoryRegion{src_.data(), src_.size()})).value();
    remote_ = std::move(reader_->Register(MemoryRegion{dst_.data(), dst_.size()})).value();
    PeerDescriptor peer{reader_->LocalAddress(),
                        {RemoteRegion{reinterpret_cast<uint64_t>(dst_.data()), dst_.size(),
                                      remote_->RemoteKey()}},
                        /*host=*/""};
    ep_ = std::move(writer_->Connect(peer)).value();
  }
  WriteRequest Req(uint64_t off, uint64_t len, int layer) {
    WriteRequest r;
    r.local = local_.get();
    r.ops = {{off, off, len}};
    r.notify = true;
    r.notification = Notification{1, layer, 0};
    return r;
  }

  std::unique_ptr<FakeTransport> writer_, reader_;
  std::vector<uint8_t> src_, dst_;
  std::unique_ptr<Registration> local_, remote_;
  std::unique_ptr<Endpoint> ep_;
  test::NotificationQueue notes_;
};

TEST_F(FakeFaults, FailsExactlyTheNthWrite) {
  writer_->FailNthWrite(2, DataLoss("injected"));
  auto a = ep_->Write(Req(0, 1024, 0));
  auto b = ep_->Write(Req(1024, 1024, 1));
  auto c = ep_->Write(Req(2048, 1024, 2));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_TRUE((*a)->Wait(DeadlineAfterMs(5000)).ok());
  EXPECT_EQ((*b)->Wait(DeadlineAfterMs(5000)).code(), StatusCode::kDataLoss);
  EXPECT_TRUE((*c)->Wait(DeadlineAfterMs(5000)).ok());
  EXPECT_EQ(0, std::memcmp(dst_.data(), src_.data(), 1024));
  EXPECT_TRUE(std::all_of(dst_.begin() + 1024, dst_.begin() + 2048, [](uint8_t x) { return x == 0; }))
      << "a failed write must not copy";
  Notification n;
  ASSERT_TRUE(notes_.Pop(&n, DeadlineAfterMs(5000)));
  EXPECT_EQ(n.layer, 0);
  ASSERT_TRUE(notes_.Pop(&n, DeadlineAfterMs(5000)));
  EXPECT_EQ(n.layer, 2);
  EXPECT_EQ(writer_->writes_started(), 3u);
}

TEST_F(FakeFaults, DelayMakesWaitTimeOutThenComplete) {
  writer_->SetWriteDelay(std::chrono::milliseconds(300));
  auto h = ep_->Write(Req(0, 4096, 0));
  ASSERT_TRUE(h.ok());
  auto t0 = Clock::now();
  EXPECT_EQ((*h)->Wait(DeadlineAfterMs(30)).code(), StatusCode::kTimeout);
  EXPECT_LT(SecondsSince(t0), 0.2);
  EXPECT_FALSE((*h)->Done());
  EXPECT_TRUE((*h)->Wait(DeadlineAfterMs(5000)).ok());
}

TEST_F(FakeFaults, CancelBeforeTheCopyLeavesTheDestinationAlone) {
  writer_->SetWriteDelay(std::chrono::milliseconds(100));
  auto h = ep_->Write(Req(0, 4096, 0));
  ASSERT_TRUE(h.ok());
  EXPECT_TRUE((*h)->Cancel());
  EXPECT_EQ((*h)->Wait(DeadlineAfterMs(5000)).code(), StatusCode::kCanceled);
  EXPECT_TRUE(std::all_of(dst_.begin(), dst_.end(), [](uint8_t x) { return x == 0; }));
  Notification n;
  EXPECT_FALSE(notes_.Pop(&n, DeadlineAfterMs(50)));
  // Cancel after completion changes nothing.
  writer_->SetWriteDelay(std::chrono::microseconds(0));
  auto done = ep_->Write(Req(0, 4096, 1));
  ASSERT_TRUE((*done)->Wait(DeadlineAfterMs(5000)).ok());
  (*done)->Cancel();
  EXPECT_TRUE((*done)->Wait(Clock::now()).ok());
}

TEST_F(FakeFaults, DisconnectFailsPendingAndLaterWrites) {
  writer_->SetWriteDelay(std::chrono::milliseconds(100));
  auto pending = ep_->Write(Req(0, 4096, 0));
  ASSERT_TRUE(pending.ok());
  reader_->Disconnect();
  EXPECT_EQ((*pending)->Wait(DeadlineAfterMs(5000)).code(), StatusCode::kRemoteDisconnect);
  EXPECT_EQ(ep_->status().code(), StatusCode::kRemoteDisconnect);
  auto later = ep_->Write(Req(0, 4096, 1));
  ASSERT_FALSE(later.ok());
  EXPECT_EQ(later.status().code(), StatusCode::kRemoteDisconnect);
  EXPECT_TRUE(std::all_of(dst_.begin(), dst_.end(), [](uint8_t x) { return x == 0; }));
  EXPECT_EQ(notes_.size(), 0u);
}

TEST_F(FakeFaults, PeerDestroyedIsRemoteDisconnect) {
  remote_.reset();
  reader_.reset();
  EXPECT_EQ(ep_->status().code(), StatusCode::kRemoteDisconnect);
  auto w = ep_->Write(Req(0, 16, 0));
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kRemoteDisconnect);
}

TEST_F(FakeFaults, EndpointDestroyedCancelsQueuedWrites) {
  writer_->SetWriteDelay(std::chrono::milliseconds(50));
  std::vector<std::unique_ptr<WriteHandle>> hs;
  for (int i = 0; i < 5; ++i) hs.push_back(std::move(ep_->Write(Req(i * 1024, 1024, i))).value());
  ep_.reset();
  std::vector<uint8_t> snapshot = dst_;
  for (auto& h : hs) {
    Status s = h->Wait(DeadlineAfterMs(5000));
    EXPECT_TRUE(s.ok() || s.code() == StatusCode::kCanceled) << s.ToString();
  }
  EXPECT_EQ(snapshot, dst_) << "nothing may land after the endpoint is destroyed";
}

}  // namespace
}  // namespace kvstream::transport::testing
