// Fault: kvcache/redis_store.h when its servers fail: a redis-server killed mid-run (calls fail
// within the deadline; calls succeed again after a restart), a SIGSTOPped server (the deadline
// holds, later calls fail fast during the backoff), a fake server answering garbage, huge or
// trickled replies over a unix socket (a clean error, never an abort or a hang).
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "common/time.h"
#include "kvcache/redis_store.h"
#include "tests/kvcache/redis_server.h"

namespace kvstream::kvcache {
namespace {

using std::chrono::milliseconds;
using testing::RedisServer;

constexpr milliseconds kTimeout{300};
// What a call may take past its deadline here (a loaded 2-core CI machine, sanitizers).
constexpr milliseconds kSlack{1500};

RedisStoreOptions FaultOptions(const std::vector<std::string>& servers, std::string auth_file) {
  RedisStoreOptions o;
  o.servers = servers;
  o.auth_file = std::move(auth_file);
  o.insecure = o.auth_file.empty();
  o.timeout = kTimeout;
  o.backoff_min = milliseconds(50);
  o.backoff_max = milliseconds(200);
  o.max_value_bytes = size_t{1} << 20;
  return o;
}

// Runs fn, checks it returned by the deadline (plus slack), returns its status.
template <typename Fn>
Status Timed(Fn fn, milliseconds limit = kTimeout + kSlack) {
  const auto start = Clock::now();
  Status st = fn();
  const auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  EXPECT_LE(took.count(), limit.count()) << st.ToString();
  return st;
}

TEST(RedisFault, ServerKilledMidRunThenRestarted) {
  RedisServer a, b;
  auto store = RedisStore::Open(FaultOptions({"unix:" + a.socket(), "unix:" + b.socket()},
                                             a.AuthFile(a.password())))
                   .value();
  std::vector<std::string> keys;
  for (int i = 0; i < 64; ++i) {
    keys.push_back("k" + std::to_string(i));
    ASSERT_TRUE(store->Put(keys.back(), "v").ok());
  }
  a.Kill();
  // Calls for keys on the dead server fail by the deadline; the live server keeps serving.
  int on_dead = 0, on_live = 0;
  for (const std::string& k : keys) {
    const Status st = Timed([&] { return store->Get(k).status(); });
    const bool dead = store->ShardOf(k) == 0;
    ++(dead ? on_dead : on_live);
    EXPECT_EQ(st.ok(), !dead) << k << ": " << st.ToString();
  }
  EXPECT_GT(on_dead, 0);
  EXPECT_GT(on_live, 0);
  Status status;
  std::vector<bool> present;
  Timed([&] {
    present = store->Exists(keys, &status);
    return OkStatus();
  }).IgnoreError();
  EXPECT_FALSE(status.ok());
  for (size_t i = 0; i < keys.size(); ++i)
    EXPECT_EQ(present[i], store->ShardOf(keys[i]) == 1) << keys[i];
  EXPECT_GT(store->stats().errors + store->stats().connect_failures, 0u);

  a.Restart();  // empty: no persistence
  const Deadline until = DeadlineAfterMs(10000);
  Status put;
  do {
    put = store->Put(keys[0], "again");
    if (!put.ok()) std::this_thread::sleep_for(milliseconds(20));
  } while (!put.ok() && !Expired(until));
  ASSERT_TRUE(put.ok()) << put.ToString();
  auto got = store->Get(keys[0]);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ(**got, "again");
}

TEST(RedisFault, ConcurrentCallsWhileTheServerDies) {
  RedisServer server;
  auto store = RedisStore::Open(FaultOptions({"unix:" + server.socket()},
                                             server.AuthFile(server.password())))
                   .value();
  std::atomic<bool> stop{false};
  std::atomic<int> late{0}, ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; !stop; ++i) {
        const auto start = Clock::now();
        const std::string key = "t" + std::to_string(t) + "-" + std::to_string(i % 50);
        const bool good = (i % 2 ? store->Get(key).ok() : store->Put(key, "v").ok());
        if (good) ok++;
        if (Clock::now() - start > kTimeout + kSlack) late++;
      }
    });
  }
  std::this_thread::sleep_for(milliseconds(300));
  server.Kill();
  std::this_thread::sleep_for(milliseconds(500));
  server.Restart();
  std::this_thread::sleep_for(milliseconds(1500));
  const int before = ok.load();
  std::this_thread::sleep_for(milliseconds(300));
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(late.load(), 0);
  EXPECT_GT(ok.load(), before) << "no call succeeded after the restart";
}

TEST(RedisFault, StoppedServerFailsByTheDeadline) {
  RedisServer server;
  RedisStoreOptions o =
      FaultOptions({"unix:" + server.socket()}, server.AuthFile(server.password()));
  o.backoff_min = o.backoff_max = milliseconds(1500);
  auto store = RedisStore::Open(o).value();
  ASSERT_TRUE(store->Put("k", "v").ok());
  server.Stop();
  const Status first = Timed([&] { return store->Get("k").status(); });
  EXPECT_EQ(first.code(), StatusCode::kTimeout) << first.ToString();
  // During the backoff: at once, saying why.
  const Status next = Timed([&] { return store->Put("k", "w"); }, milliseconds(500));
  EXPECT_EQ(next.code(), StatusCode::kUnavailable) << next.ToString();
  EXPECT_NE(next.message().find("down"), std::string::npos);
  // A fresh connection to the stopped server: connect succeeds (the backlog), AUTH times out.
  std::this_thread::sleep_for(milliseconds(1600));
  const Status redial = Timed([&] { return store->Probe(); });
  EXPECT_FALSE(redial.ok());
  EXPECT_GE(store->stats().timeouts, 1u);
  server.Cont();
  const Deadline until = DeadlineAfterMs(10000);
  Status st;
  do {
    st = store->Put("k", "w");
    if (!st.ok()) std::this_thread::sleep_for(milliseconds(20));
  } while (!st.ok() && !Expired(until));
  EXPECT_TRUE(st.ok()) << st.ToString();
}

// Listens on a unix socket; each connection gets `answer` once a command has arrived, then is
// held open (or closed with close_after).
class FakeServer {
 public:
  FakeServer(std::string answer, bool close_after = false, milliseconds trickle = milliseconds(0))
      : answer_(std::move(answer)), close_after_(close_after), trickle_(trickle) {
    char tmpl[] = "/tmp/kvstream-fake-redis-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    path_ = dir_ + "/s.sock";
    fd_ = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path_.c_str());
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(::listen(fd_, 8), 0);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeServer() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
    for (int c : clients_) ::close(c);
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  std::string address() const { return "unix:" + path_; }

 private:
  void Serve() {
    while (!stop_) {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      char buf[4096];
      if (::recv(c, buf, sizeof buf, 0) <= 0) {
        ::close(c);
        continue;
      }
      if (trickle_.count() > 0) {
        for (char ch : answer_) {
          if (stop_ || ::send(c, &ch, 1, MSG_NOSIGNAL) != 1) break;
          std::this_thread::sleep_for(trickle_);
        }
      } else {
        for (size_t off = 0; off < answer_.size();) {
          const ssize_t n = ::send(c, answer_.data() + off, answer_.size() - off, MSG_NOSIGNAL);
          if (n <= 0) break;
          off += static_cast<size_t>(n);
        }
      }
      if (close_after_) {
        ::close(c);
      } else {
        clients_.push_back(c);
      }
    }
  }
  std::string answer_, dir_, path_;
  bool close_after_;
  milliseconds trickle_;
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::vector<int> clients_;
  std::thread thread_;
};

Status GetFrom(const FakeServer& fake) {
  auto store = RedisStore::Open(FaultOptions({fake.address()}, "")).value();
  return Timed([&] { return store->Get("k").status(); });
}

TEST(RedisFault, GarbageRepliesAreErrorsNotCrashes) {
  std::string random(200000, '\0');
  std::mt19937 rng(7);
  for (char& c : random) c = static_cast<char>(rng());
  std::string deep;
  for (int i = 0; i < 12; ++i) deep += "*1\r\n";
  deep += ":1\r\n";
  const std::pair<std::string, StatusCode> cases[] = {
      {"!garbage\r\n", StatusCode::kDataLoss},
      {"*2147483647\r\n", StatusCode::kDataLoss},             // refused before any allocation
      {"*-7\r\n", StatusCode::kDataLoss},
      {deep, StatusCode::kDataLoss},                           // deeper than hiredis reads
      {"$" + std::to_string(size_t{1} << 40) + "\r\nabc", StatusCode::kTimeout},  // never sent
      {"$3000000\r\n" + std::string(3000002, 'x'), StatusCode::kDataLoss},  // over the limit
      {":12\r\n", StatusCode::kDataLoss},                      // not a string
      {"-ERR nope\r\n", StatusCode::kFailedPrecondition},
      {"+OK\r\n+OK\r\n", StatusCode::kDataLoss},
      {"", StatusCode::kTimeout},                              // silence
  };
  for (const auto& [answer, code] : cases) {
    FakeServer fake(answer);
    const Status st = GetFrom(fake);
    EXPECT_EQ(st.code(), code) << answer.substr(0, 40) << ": " << st.ToString();
  }
  for (const std::string& answer : {std::string("*99999999999999\r\n"), random,
                                   std::string("$-5\r\n"), std::string(":abc\r\n")}) {
    FakeServer fake(answer);
    GetFrom(fake).IgnoreError();  // any outcome but an abort, a hang or a wrong hit
  }
  FakeServer closing("", /*close_after=*/true);
  EXPECT_EQ(GetFrom(closing).code(), StatusCode::kRemoteDisconnect);
}

TEST(RedisFault, TrickledReplyStillMeetsTheDeadline) {
  FakeServer slow("$20\r\n01234567890123456789\r\n", false, milliseconds(40));
  EXPECT_EQ(GetFrom(slow).code(), StatusCode::kTimeout);
}

TEST(RedisFault, PresenceFromAGarbageServerIsAbsent) {
  FakeServer fake(":1\r\n+junk\r\n");
  auto store = RedisStore::Open(FaultOptions({fake.address()}, "")).value();
  Status status;
  const std::vector<std::string> keys = {"a", "b", "c"};
  const std::vector<bool> present = store->Exists(keys, &status);
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(std::count(present.begin(), present.end(), true), 0);
}

}  // namespace
}  // namespace kvstream::kvcache
