// CPU-only pieces of the GPU backends (no GPU needed, runs in CI): the cuda_ipc notification
// socket and the scatter-copy run splitting.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "transport/cuda_ipc/control_socket.h"
#include "transport/cuda_ipc/scatter_copy.h"

namespace kvstream::transport::cuda {
namespace {

template <typename Pred>
bool WaitFor(Pred p, int ms = 5000) {
  auto deadline = DeadlineAfterMs(ms);
  while (!p()) {
    if (Expired(deadline)) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST(NotificationSocket, DeliversFramesInOrderAndSeesPeerClose) {
  std::mutex mu;
  std::vector<Notification> got;
  auto l = NotificationListener::Start("kvstream-test", [&](const Notification& n) {
    std::lock_guard<std::mutex> lock(mu);
    got.push_back(n);
  });
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  auto ch = NotificationChannel::Connect(l.value()->address(), DeadlineAfterMs(1000));
  ASSERT_TRUE(ch.ok()) << ch.status().ToString();
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(ch.value()->Send({uint64_t(i) << 32 | 7, i, -i}).ok());
  }
  ASSERT_TRUE(WaitFor([&] {
    std::lock_guard<std::mutex> lock(mu);
    return got.size() == 1000;
  }));
  for (int i = 0; i < 1000; ++i) {
    EXPECT_EQ(got[i].request_id, uint64_t(i) << 32 | 7);
    EXPECT_EQ(got[i].layer, i);
    EXPECT_EQ(got[i].flags, -i);
  }
  EXPECT_FALSE(ch.value()->PeerClosed(0));
  l.value().reset();  // the receiver goes away
  EXPECT_TRUE(ch.value()->PeerClosed(2000000));
  Status s;
  for (int i = 0; i < 100 && s.ok(); ++i) s = ch.value()->Send({1, 1, 1});
  EXPECT_EQ(s.code(), StatusCode::kRemoteDisconnect);
}

TEST(NotificationSocket, RefusesBadAddressesAndNobodyListening) {
  EXPECT_EQ(NotificationChannel::Connect("tcp://x", DeadlineAfterMs(100)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(NotificationChannel::Connect("unix:", DeadlineAfterMs(100)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(NotificationChannel::Connect("unix:@" + std::string(200, 'x'), DeadlineAfterMs(100))
                .status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(NotificationChannel::Connect("unix:@kvstream-nobody-here", DeadlineAfterMs(100))
                .status().code(),
            StatusCode::kUnavailable);
}

TEST(NotificationSocket, ManyWritersOneListener) {
  std::atomic<int> count{0};
  auto l = NotificationListener::Start("kvstream-test", [&](const Notification&) { count++; });
  ASSERT_TRUE(l.ok());
  std::vector<std::thread> ts;
  for (int w = 0; w < 8; ++w) {
    ts.emplace_back([&] {
      auto ch = NotificationChannel::Connect(l.value()->address(), DeadlineAfterMs(1000));
      ASSERT_TRUE(ch.ok());
      for (int i = 0; i < 100; ++i) ASSERT_TRUE(ch.value()->Send({1, i, 0}).ok());
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_TRUE(WaitFor([&] { return count.load() == 800; }));
}

// Early notifications' plumbing: each writer's event table reaches the events callback with
// that connection's id, its early frames carry the id and their slot, other frames pass
// unchanged, and a closing connection that had a table is reported once.
TEST(NotificationSocket, EventTablesAndEarlyFramesCarryTheirConnection) {
  std::mutex mu;
  std::vector<Notification> got;
  std::vector<std::pair<uint32_t, std::string>> tables;
  auto l = NotificationListener::Start(
      "kvstream-test",
      [&](const Notification& n) {
        std::lock_guard<std::mutex> lock(mu);
        got.push_back(n);
      },
      [&](uint32_t conn, const std::string& t) {
        std::lock_guard<std::mutex> lock(mu);
        tables.push_back({conn, t});
      });
  ASSERT_TRUE(l.ok());
  EXPECT_FALSE(AddressWantsLandedEvents(l.value()->address()));
  const std::string ev_addr = l.value()->address() + kLandedEventsSuffix;
  EXPECT_TRUE(AddressWantsLandedEvents(ev_addr));
  auto a = NotificationChannel::Connect(ev_addr, DeadlineAfterMs(1000));
  auto b = NotificationChannel::Connect(ev_addr, DeadlineAfterMs(1000));
  auto plain = NotificationChannel::Connect(l.value()->address(), DeadlineAfterMs(1000));
  ASSERT_TRUE(a.ok() && b.ok() && plain.ok());
  const std::string ta(3 * kEventHandleBytes, 'a'), tb(5 * kEventHandleBytes, 'b');
  ASSERT_TRUE(a.value()->SendEventTable(ta).ok());
  ASSERT_TRUE(b.value()->SendEventTable(tb).ok());
  EXPECT_EQ(a.value()->SendEventTable(std::string(10, 'x')).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(a.value()->Send({11, 1, kNotificationLandedOnEvent | 2}).ok());
  ASSERT_TRUE(b.value()->Send({22, 2, kNotificationLandedOnEvent | 4}).ok());
  ASSERT_TRUE(a.value()->Send({33, 3, 0}).ok());
  ASSERT_TRUE(plain.value()->Send({44, 4, kNotificationLandedOnEvent | 5}).ok());
  ASSERT_TRUE(WaitFor([&] {
    std::lock_guard<std::mutex> lock(mu);
    return got.size() == 4 && tables.size() == 2;
  }));
  std::lock_guard<std::mutex> lock(mu);
  uint32_t ida = 0, idb = 0;
  for (auto& [id, t] : tables) (t == ta ? ida : idb) = id;
  ASSERT_NE(ida, 0u);
  ASSERT_NE(idb, 0u);
  EXPECT_NE(ida, idb);
  for (const Notification& n : got) {
    const uint32_t conn = uint32_t(n.flags >> kLandedConnShift) & kLandedConnMask;
    if (n.request_id == 11) {
      EXPECT_EQ(conn, ida);
      EXPECT_EQ(n.flags & kLandedSlotMask, 2);
      EXPECT_NE(n.flags & kNotificationLandedOnEvent, 0);
    } else if (n.request_id == 22) {
      EXPECT_EQ(conn, idb);
      EXPECT_EQ(n.flags & kLandedSlotMask, 4);
    } else if (n.request_id == 33) {
      EXPECT_EQ(n.flags, 0);
    } else {
      EXPECT_EQ(n.flags, kNotificationLandedOnEvent | 5);  // no table: passed as sent
    }
  }
  mu.unlock();
  a.value().reset();
  plain.value().reset();
  EXPECT_TRUE(WaitFor([&] {
    std::lock_guard<std::mutex> l2(mu);
    return tables.size() == 3;
  }));
  mu.lock();
  EXPECT_EQ(tables.back().first, ida);
  EXPECT_TRUE(tables.back().second.empty());
}

TEST(ScatterCopy, SplitsLongRunsIntoPieces) {
  std::vector<CopyRun> runs = {{0, 1000, 16}, {100, 0, 3 * kScatterPieceBytes + 32}, {7, 9, 0}};
  size_t n = ScatterTableEntries(runs.data(), runs.size());
  ASSERT_EQ(n, 1u + 4u);
  std::vector<CopyRun> table(n);
  ASSERT_EQ(SplitRuns(runs.data(), runs.size(), table.data()), n);
  EXPECT_EQ(table[0].src, 0u);
  EXPECT_EQ(table[0].length, 16u);
  uint64_t total = 0;
  for (size_t i = 1; i < n; ++i) {
    EXPECT_EQ(table[i].src, 100 + total);
    EXPECT_EQ(table[i].dst, total);
    EXPECT_LE(table[i].length, kScatterPieceBytes);
    total += table[i].length;
  }
  EXPECT_EQ(total, 3 * kScatterPieceBytes + 32);
}

}  // namespace
}  // namespace kvstream::transport::cuda
