// CPU-only pieces of transport/cuda (no GPU needed, runs in CI): the notification
// socket and the scatter-copy run splitting.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "transport/cuda/control_socket.h"
#include "transport/cuda/copy_plan.h"
#include "transport/cuda/landed_flags.h"

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

// The right path with a wrong token (its last hex digit changed).
std::string WithWrongToken(std::string address) {
  address.back() = address.back() == '0' ? '1' : '0';
  return address;
}

// Runs `child` in a forked process as uid and gid 65534 (only root can become them) and returns
// whether it exited 0 (`child` returns the exit code; 2: the process could not change its uid).
bool ExitsZeroAsAnotherUid(const std::function<int()>& child) {
  pid_t pid = ::fork();
  if (pid < 0) return false;
  if (pid == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
    ::_exit(child());
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return false;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
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
  const std::string token = "?token=" + std::string(32, '0');
  EXPECT_EQ(NotificationChannel::Connect("unix:/" + std::string(200, 'x') + token, DeadlineAfterMs(100))
                .status().code(),
            StatusCode::kInvalidArgument);
  // Abstract sockets have no permissions: refused, whatever listens there.
  EXPECT_EQ(NotificationChannel::Connect("unix:@kvstream-nobody-here" + token, DeadlineAfterMs(100))
                .status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(NotificationChannel::Connect("unix:/tmp/kvstream-nobody-here/sock", DeadlineAfterMs(100))
                .status().code(),
            StatusCode::kInvalidArgument);  // no token
  EXPECT_EQ(NotificationChannel::Connect("unix:/tmp/kvstream-nobody-here/sock" + token,
                                         DeadlineAfterMs(100)).status().code(),
            StatusCode::kUnavailable);
}

// The listener is a filesystem socket only this user reaches (issue 15, item 3): 0600 in a
// 0700 directory, removed with the listener; a same-user process without the address's token
// is refused (counted, nothing delivered); another uid is refused by the kernel or the
// SO_PEERCRED check.
TEST(NotificationSocket, OnlyTheTokenHolderOfThisUserGetsIn) {
  std::atomic<int> got{0};
  auto l = NotificationListener::Start("kvstream-test", [&](const Notification&) { got++; });
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  const std::string address = l.value()->address();
  ASSERT_EQ(address.rfind("unix:/", 0), 0u) << address;
  const std::string path = address.substr(5, address.find('?') - 5);
  const std::string dir = path.substr(0, path.rfind('/'));
  struct stat ss {}, ds {};
  ASSERT_EQ(::stat(path.c_str(), &ss), 0);
  ASSERT_EQ(::stat(dir.c_str(), &ds), 0);
  EXPECT_TRUE(S_ISSOCK(ss.st_mode));
  EXPECT_EQ(ss.st_mode & 0777, 0600u);
  EXPECT_EQ(ds.st_mode & 0777, 0700u);

  // The right path with a wrong token: connected, then closed without delivering anything.
  auto ch = NotificationChannel::Connect(WithWrongToken(address), DeadlineAfterMs(1000));
  ASSERT_TRUE(ch.ok()) << ch.status().ToString();
  (void)ch.value()->Send({1, 2, 0});
  EXPECT_TRUE(ch.value()->PeerClosed(2000000));
  EXPECT_TRUE(WaitFor([&] { return l.value()->refused() == 1; }));

  // Another uid (only where this test runs as root, which can become one).
  if (::geteuid() == 0) {
    EXPECT_TRUE(ExitsZeroAsAnotherUid([&] {
      auto c = NotificationChannel::Connect(address, DeadlineAfterMs(1000));
      if (!c.ok()) return 0;  // refused (the 0700 directory)
      (void)c.value()->Send({9, 9, 0});
      return c.value()->PeerClosed(2000000) ? 0 : 1;
    })) << "another uid got in";
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(got.load(), 0);

  // The genuine writer still gets in.
  auto good = NotificationChannel::Connect(address, DeadlineAfterMs(1000));
  ASSERT_TRUE(good.ok());
  ASSERT_TRUE(good.value()->Send({3, 4, 0}).ok());
  EXPECT_TRUE(WaitFor([&] { return got.load() == 1; }));
  l.value().reset();
  EXPECT_NE(::stat(path.c_str(), &ss), 0) << "the socket outlived its listener";
  EXPECT_NE(::stat(dir.c_str(), &ds), 0) << "the socket's directory outlived its listener";
}

int OpenFds() {
  int n = 0;
  for (int fd = 0; fd < 4096; ++fd) n += ::fcntl(fd, F_GETFD) >= 0 ? 1 : 0;
  return n;
}

// Memory leaves the listener only as a descriptor (SCM_RIGHTS), only to a connection that
// passed the hello (this uid, the address's token), only for an id the backend grants; every
// descriptor is closed on every path (issue 15: cuda_ipc's cuMem descriptors travel this way).
TEST(NotificationSocket, MemoryGoesOnlyAsADescriptorToTheTokenHolder) {
  const int fds_before = OpenFds();
  {
    const int memfd = ::memfd_create("kvstream-test-grant", MFD_CLOEXEC);
    ASSERT_GE(memfd, 0);
    ASSERT_EQ(::pwrite(memfd, "payload", 7, 0), 7);
    std::atomic<int> asked{0};
    auto l = NotificationListener::Start(
        "kvstream-test", [](const Notification&) {}, nullptr, nullptr,
        [&](uint32_t, uint64_t id) -> Result<MemoryGrant> {
          asked++;
          if (id != 42) return NotFound("no registration has that grant id");
          MemoryGrant g;
          g.info = "region info";
          g.fd = ::fcntl(memfd, F_DUPFD_CLOEXEC, 0);
          return g;
        });
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    const std::string address = l.value()->address();

    // The token holder gets the descriptor of a granted id, and a refusal naming why otherwise.
    auto good = NotificationChannel::Connect(address, DeadlineAfterMs(1000));
    ASSERT_TRUE(good.ok()) << good.status().ToString();
    for (int round = 0; round < 20; ++round) {
      auto g = good.value()->RequestMemory(42, DeadlineAfterMs(2000));
      ASSERT_TRUE(g.ok()) << g.status().ToString();
      EXPECT_EQ(g.value().info, "region info");
      char buf[8] = {};
      ASSERT_EQ(::pread(g.value().fd, buf, 7, 0), 7);
      EXPECT_STREQ(buf, "payload") << "the descriptor is the granted memory";
      ::close(g.value().fd);
    }
    auto forged = good.value()->RequestMemory(7, DeadlineAfterMs(2000));
    ASSERT_FALSE(forged.ok());
    EXPECT_EQ(forged.status().code(), StatusCode::kNotFound) << forged.status().ToString();
    EXPECT_NE(forged.status().message().find("grant id"), std::string::npos);
    // Notifications still flow on the same connection afterwards.
    EXPECT_TRUE(good.value()->Send({1, 2, 0}).ok());
    EXPECT_EQ(l.value()->memory_granted(), 20u);
    EXPECT_EQ(l.value()->memory_refused(), 1u);

    // A process with the path but not the token: closed at its hello, never asked about.
    auto thief = NotificationChannel::Connect(WithWrongToken(address), DeadlineAfterMs(1000));
    ASSERT_TRUE(thief.ok()) << thief.status().ToString();
    auto stolen = thief.value()->RequestMemory(42, DeadlineAfterMs(2000));
    ASSERT_FALSE(stolen.ok());
    EXPECT_EQ(stolen.status().code(), StatusCode::kRemoteDisconnect) << stolen.status().ToString();
    EXPECT_EQ(asked.load(), 21) << "a connection without the token reached the grant callback";
    EXPECT_EQ(l.value()->memory_granted(), 20u);

    // Another uid (only where this test runs as root, which can become one): no descriptor.
    if (::geteuid() == 0) {
      EXPECT_TRUE(ExitsZeroAsAnotherUid([&] {
        auto c = NotificationChannel::Connect(address, DeadlineAfterMs(1000));
        if (!c.ok()) return 0;  // refused (the 0700 directory)
        return c.value()->RequestMemory(42, DeadlineAfterMs(2000)).ok() ? 1 : 0;
      })) << "another uid got a descriptor";
    }
    EXPECT_EQ(l.value()->memory_granted(), 20u);
    thief.value().reset();
    good.value().reset();
    l.value().reset();
    ::close(memfd);
  }
  EXPECT_TRUE(WaitFor([&] { return OpenFds() == fds_before; })) << OpenFds() << " descriptors open, "
                                                                 << fds_before << " before";
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

// Landed flags' plumbing (gpu_landed_wait): a writer that asks gets the listener's grant (or
// kNotSupported when it has none to give), its early frames arrive with its connection id and
// sequence number, other frames pass unchanged, a frame with the transport's bits from a
// connection without a grant closes it, and the closing of a granted connection (by the
// writer or by Drop) is reported once with its id.
TEST(NotificationSocket, LandedFlagGrantsAndEarlyFramesCarryTheirConnection) {
  std::mutex mu;
  std::vector<Notification> got;
  std::vector<uint32_t> granted, closed;
  auto l = NotificationListener::Start(
      "kvstream-test",
      [&](const Notification& n) {
        std::lock_guard<std::mutex> lock(mu);
        got.push_back(n);
      },
      [&](uint32_t conn, uint32_t pid) -> Result<FlagGrant> {
        EXPECT_EQ(pid, static_cast<uint32_t>(::getpid()));
        std::lock_guard<std::mutex> lock(mu);
        if (granted.size() == 2) return ResourceExhausted("two is enough");
        granted.push_back(conn);
        return FlagGrant{conn * 10, 1000 + conn, "key-of-" + std::to_string(conn)};
      },
      [&](uint32_t conn) {
        std::lock_guard<std::mutex> lock(mu);
        closed.push_back(conn);
      });
  ASSERT_TRUE(l.ok());
  EXPECT_FALSE(AddressWantsLandedFlags(l.value()->address()));
  const std::string lf_addr = l.value()->address() + kLandedFlagsSuffix;
  EXPECT_TRUE(AddressWantsLandedFlags(lf_addr));
  auto a = NotificationChannel::Connect(lf_addr, DeadlineAfterMs(1000));
  auto b = NotificationChannel::Connect(lf_addr, DeadlineAfterMs(1000));
  auto c = NotificationChannel::Connect(lf_addr, DeadlineAfterMs(1000));
  auto plain = NotificationChannel::Connect(l.value()->address(), DeadlineAfterMs(1000));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok() && plain.ok());
  auto ga = a.value()->RequestLandedFlag(DeadlineAfterMs(2000));
  auto gb = b.value()->RequestLandedFlag(DeadlineAfterMs(2000));
  auto gc = c.value()->RequestLandedFlag(DeadlineAfterMs(2000));
  ASSERT_TRUE(ga.ok()) << ga.status().ToString();
  ASSERT_TRUE(gb.ok()) << gb.status().ToString();
  EXPECT_EQ(gc.status().code(), StatusCode::kNotSupported) << gc.status().ToString();
  uint32_t ida = 0, idb = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_EQ(granted.size(), 2u);
    ida = granted[0];
    idb = granted[1];
  }
  EXPECT_NE(ida, idb);
  EXPECT_EQ(ga.value().slot, ida * 10);
  EXPECT_EQ(ga.value().first_seq, 1000 + ida);
  EXPECT_EQ(ga.value().key, "key-of-" + std::to_string(ida));
  EXPECT_EQ(gb.value().key, "key-of-" + std::to_string(idb));
  ASSERT_TRUE(a.value()->SendEarly({11, 1, 0}, 0xFFFFFFFFu).ok());
  ASSERT_TRUE(b.value()->SendEarly({22, 2, 0}, 7).ok());
  ASSERT_TRUE(a.value()->Send({33, 3, 0}).ok());
  ASSERT_TRUE(plain.value()->Send({44, 4, 5}).ok());
  ASSERT_TRUE(WaitFor([&] {
    std::lock_guard<std::mutex> lock(mu);
    return got.size() == 4;
  }));
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const Notification& n : got) {
      if (n.request_id == 11) {
        EXPECT_EQ(n.flags, kNotificationLandedOnEvent | static_cast<int32_t>(ida));
        EXPECT_EQ(n.layer, 1);
        EXPECT_EQ(n.landed_seq, 0xFFFFFFFFu);
      } else if (n.request_id == 22) {
        EXPECT_EQ(n.flags, kNotificationLandedOnEvent | static_cast<int32_t>(idb));
        EXPECT_EQ(n.landed_seq, 7u);
      } else if (n.request_id == 33) {
        EXPECT_EQ(n.flags, 0);
        EXPECT_EQ(n.landed_seq, 0u);
      } else {
        EXPECT_EQ(n.flags, 5);
      }
    }
  }
  // An early frame from a connection without a grant is a protocol error: closed, not
  // delivered, and not reported as a granted connection's close.
  ASSERT_TRUE(plain.value()->SendEarly({55, 5, 0}, 1).ok());
  EXPECT_TRUE(plain.value()->PeerClosed(2000000));
  a.value().reset();
  l.value()->Drop(idb);
  EXPECT_TRUE(b.value()->PeerClosed(2000000));
  EXPECT_TRUE(WaitFor([&] {
    std::lock_guard<std::mutex> lock(mu);
    return closed.size() == 2;
  }));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(got.size(), 4u);
  ASSERT_EQ(closed.size(), 2u);
  EXPECT_TRUE((closed[0] == ida && closed[1] == idb) || (closed[0] == idb && closed[1] == ida));
}

Notification Tagged(uint64_t request, int32_t layer, uint8_t seed) {
  Notification n{request, layer, 0};
  for (size_t i = 0; i < n.mac.size(); ++i) n.mac[i] = uint8_t(seed + 17 * i);
  return n;
}

// Notification MACs (issue 15, item 2): every kind of frame delivers the writer's tag unchanged.
TEST(NotificationSocket, FramesCarryTheNotificationMac) {
  std::mutex mu;
  std::vector<Notification> got;
  auto l = NotificationListener::Start(
      "kvstream-test",
      [&](const Notification& n) {
        std::lock_guard<std::mutex> lock(mu);
        got.push_back(n);
      },
      [&](uint32_t conn, uint32_t) -> Result<FlagGrant> { return FlagGrant{conn, 1, "k"}; });
  ASSERT_TRUE(l.ok());
  auto ch = NotificationChannel::Connect(l.value()->address() + kLandedFlagsSuffix,
                                         DeadlineAfterMs(1000));
  ASSERT_TRUE(ch.ok());
  ASSERT_TRUE(ch.value()->RequestLandedFlag(DeadlineAfterMs(2000)).ok());
  ASSERT_TRUE(ch.value()->Send(Tagged(1, 1, 3)).ok());
  std::vector<Notification> batch;
  for (int i = 0; i < 70; ++i) batch.push_back(Tagged(100 + i, i, uint8_t(i)));
  ASSERT_TRUE(ch.value()->SendBatch(batch.data(), batch.size()).ok());
  ASSERT_TRUE(ch.value()->SendEarly(Tagged(2, 2, 9), 5).ok());
  ASSERT_TRUE(WaitFor([&] {
    std::lock_guard<std::mutex> lock(mu);
    return got.size() == 72;
  }));
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(got[0].mac, Tagged(1, 1, 3).mac);
  for (int i = 0; i < 70; ++i) {
    EXPECT_EQ(got[1 + i].request_id, uint64_t(100 + i));
    EXPECT_EQ(got[1 + i].mac, Tagged(0, 0, uint8_t(i)).mac) << i;
  }
  EXPECT_EQ(got[71].landed_seq, 5u);
  EXPECT_EQ(got[71].mac, Tagged(2, 2, 9).mac);
}

// The landed flags' comparison is CU_STREAM_WAIT_VALUE_GEQ's: (int32_t)(value - seq) >= 0, so
// sequence numbers may wrap.
TEST(LandedFlags, SequenceComparisonWraps) {
  EXPECT_TRUE(SeqReached(5, 5));
  EXPECT_TRUE(SeqReached(6, 5));
  EXPECT_FALSE(SeqReached(4, 5));
  EXPECT_TRUE(SeqReached(2, 0xFFFFFFFEu));   // wrapped past it
  EXPECT_FALSE(SeqReached(0xFFFFFFFEu, 2));  // not yet wrapped to it
  EXPECT_FALSE(SeqReached(0, 1024));         // a fresh flag holds a connection's first write
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
