// Limits of the daemons' gRPC servers, with real processes: one listener exactly where
// configured, a busy port refused, a connection flood survived, impossible sizes refused at
// once, log fields escaped, FIFO admission to the KV pool.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <fstream>
#include <future>
#include <set>
#include <sstream>
#include <thread>

#include "tests/daemons/disagg_fixture.h"
#include "tests/fault_record.h"

namespace kvstream::testing {
namespace {

namespace v1 = kvstream::v1;

const std::vector<std::string> kTiny = {"--model=tiny"};

// TCP sockets of process `pid` in the LISTEN state (IPv4 and IPv6; gRPC's and UCX's).
int ListeningSockets(pid_t pid, int except_port = 0) {
  std::set<std::string> inodes;
  const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* d = opendir(fd_dir.c_str())) {
    while (dirent* e = readdir(d)) {
      char target[256] = {};
      const std::string link = fd_dir + "/" + e->d_name;
      const ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
      const std::string t(target, n > 0 ? size_t(n) : 0);
      if (t.rfind("socket:[", 0) == 0) inodes.insert(t.substr(8, t.size() - 9));
    }
    closedir(d);
  }
  int count = 0;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      std::string sl, local, remote, state, queues, timer, retr, uid, timeout, inode;
      ls >> sl >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
      const size_t colon = local.rfind(':');
      const int port = colon == std::string::npos ? 0 : std::stoi(local.substr(colon + 1), nullptr, 16);
      if (state == "0A" && inodes.count(inode) && (except_port == 0 || port != except_port)) ++count;
    }
  }
  return count;
}

std::vector<std::string> Flags(std::vector<std::string> extra) {
  std::vector<std::string> f = DefaultDaemonFlags();
  f.insert(f.end(), kTiny.begin(), kTiny.end());
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}

GenerateResult GenerateTagged(const std::string& address, const std::vector<int32_t>& prompt,
                              int max_tokens, const std::string& tag, v1::LoadMode mode) {
  auto stub = DecodeStub(address);
  GenerateResult r;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::GenerateRequest req;
  *req.mutable_prompt_tokens() = {prompt.begin(), prompt.end()};
  req.set_max_tokens(max_tokens);
  req.set_load_mode(mode);
  req.set_client_request_tag(tag);
  const auto start = Clock::now();
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    r.tokens.push_back(msg.token_id());
    r.messages.push_back(msg);
  }
  r.status = reader->Finish();
  r.total_s = SecondsSince(start);
  return r;
}

TEST(DaemonLimits, HostNameListensOnOneAddressOnly) {
  TempDir dir;
  // gRPC alone opened a second listener on a port of its own (its SO_REUSEPORT clone of the
  // listener, bound to port 0 again). Besides gRPC's, the only listening TCP socket is the UCX
  // transport's listener (docs/security.md, "Listener admission"), whose port the daemon logs.
  DaemonProcess prefill("prefill", PrefillBin(),
                        Flags({"--listen=localhost:0", "--ucx_tls=sm,self"}), dir.path());
  ASSERT_TRUE(prefill.Start(DeadlineAfterMs(60000)).ok()) << prefill.Log();
  int ucx_port = 0;
  {
    const std::string log = prefill.Log(), marker = "writers connect to the listener at ";
    const size_t at = log.find(marker);
    if (at != std::string::npos) {
      const size_t end = log.find(' ', at + marker.size());
      const std::string where = log.substr(at + marker.size(), end - at - marker.size());
      ucx_port = std::atoi(where.substr(where.rfind(':') + 1).c_str());
    }
  }
  const int listening = ListeningSockets(prefill.pid(), ucx_port);
  EXPECT_EQ(listening, 1) << prefill.Log();
  auto stats = CallStats(*PrefillStub(prefill.address()));
  EXPECT_TRUE(stats.ok()) << stats.status().ToString();
  FaultOutcome o;
  o.aborts = prefill.Running() ? 0 : 1;
  o.outcome = std::to_string(listening) + " listening socket (gRPC alone opened 2)";
  RecordFault("limits.one_listener", "--listen localhost:0 (a host name and port 0)", o);
}

TEST(DaemonLimits, BusyPortIsRefusedAtStart) {
  TempDir dir;
  const int port = PickFreePort();
  const std::string listen = "--listen=127.0.0.1:" + std::to_string(port);
  DaemonProcess first("first", PrefillBin(), Flags({listen}), dir.path());
  ASSERT_TRUE(first.Start(DeadlineAfterMs(60000)).ok()) << first.Log();
  DaemonProcess second("second", PrefillBin(), Flags({listen}), dir.path());
  ASSERT_TRUE(second.Spawn().ok());
  const int rc = second.Wait(DeadlineAfterMs(60000));
  EXPECT_NE(rc, 0) << second.Log();
  EXPECT_NE(rc, -1) << "the second daemon serves on a port the first holds:\n" << second.Log();
  const std::string log = second.Log();
  EXPECT_NE(log.find("cannot listen on 127.0.0.1:" + std::to_string(port)), std::string::npos)
      << log;
  EXPECT_NE(log.find("Address already in use"), std::string::npos) << log;
  EXPECT_TRUE(first.Running());
  FaultOutcome o;
  o.aborts = first.Running() ? 0 : 1;
  o.outcome = "the second daemon exited " + std::to_string(rc) +
              " with 'Address already in use'; the first kept its port";
  RecordFault("limits.busy_port", "a second prefill started on the port a first one serves", o);
}

TEST(DaemonLimits, IdleConnectionsAreClosed) {
  TempDir dir;
  DaemonProcess prefill("prefill", PrefillBin(), Flags({"--max_connection_idle_ms=300"}),
                        dir.path());
  ASSERT_TRUE(prefill.Start(DeadlineAfterMs(60000)).ok()) << prefill.Log();
  auto channel = grpc::CreateChannel(prefill.address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Prefill::NewStub(channel);
  ASSERT_TRUE(CallStats(*stub).ok());
  EXPECT_EQ(channel->GetState(false), GRPC_CHANNEL_READY);
  // No call for a while: the daemon closes the connection (GOAWAY), the channel goes idle.
  const auto idle_from = Clock::now();
  bool closed = false;
  for (auto d = DeadlineAfterMs(10000); Clock::now() < d && !closed;) {
    closed = channel->GetState(false) == GRPC_CHANNEL_IDLE;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(closed) << "state " << channel->GetState(false);
  // gRPC 1.51 closes an idle connection after max(max_connection_idle_ms, ~5 s).
  EXPECT_LT(SecondsSince(idle_from), 8.0);
  EXPECT_TRUE(CallStats(*stub).ok());  // and a client simply connects again
}

TEST_F(DisaggTest, ConnectionFloodThenServesWithinSeconds) {
  DaemonPair pair;
  pair.common = kTiny;
  // 1024 descriptors for the decode; the flood below is three times that.
  pair.decode_prefix = {"prlimit", "--nofile=1024:1024", "--"};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  std::vector<int> fds;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(decode_->port()));
  for (int i = 0; i < 3000; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    ASSERT_GE(fd, 0) << "test process out of descriptors at " << i;
    connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    fds.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // the decode accepts what it can
  for (int fd : fds) close(fd);
  const auto start = Clock::now();
  auto prompt = MakePrompt(20, 512, 7);
  GenerateResult r = CallGenerate(*DecodeStub(decode_address()), prompt, 4,
                                  v1::LOAD_MODE_PIPELINED, 5000);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message() << "\n" << decode_->Log();
  const double served_after = SecondsSince(start);
  EXPECT_LT(served_after, 5.0);
  EXPECT_EQ(r.tokens, Colocated(kTiny, prompt, 4));
  EXPECT_TRUE(decode_->Running());
  FaultOutcome o;
  o.tries = 3000;
  o.requests = 1;
  o.lost = r.status.ok() ? 0 : 1;
  o.wrong_tokens = r.tokens == Colocated(kTiny, prompt, 4) ? 0 : 1;
  o.blocks_leaked = BlocksNotFree(decode_address(), true, DeadlineAfterMs(5000));
  o.aborts = decode_->Running() ? 0 : 1;
  char buf[96];
  std::snprintf(buf, sizeof(buf), "after the flood closed, the next request was served in %.2f s",
                served_after);
  o.outcome = buf;
  RecordFault("limits.connection_flood",
              "3000 idle TCP connections to a decode limited to 1024 descriptors, then closed", o);
}

TEST_F(DisaggTest, ConcurrentCallsPerConnectionAreBounded) {
  DaemonPair pair;
  pair.common = kTiny;
  pair.prefill = {"--fault_layer_delay_ms=1000"};
  pair.decode = {"--max_concurrent_streams=1"};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  // One stream in flight on stub_'s connection: a second call on it waits for a stream slot.
  auto stream = std::async(std::launch::async, [&] {
    return CallGenerate(*stub_, MakePrompt(20, 512, 3), 2, v1::LOAD_MODE_PIPELINED, 20000);
  });
  // A connection of its own (channels to one address otherwise share theirs).
  grpc::ChannelArguments own;
  own.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto other = v1::Decode::NewStub(
      grpc::CreateCustomChannel(decode_address(), grpc::InsecureChannelCredentials(), own));
  for (auto d = DeadlineAfterMs(10000); Clock::now() < d;) {
    auto st = CallStats(*other, 1000);
    if (st.ok() && st->requests_in_flight() > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto blocked = CallStats(*stub_, 500);
  EXPECT_FALSE(blocked.ok()) << "a second call ran beside the stream on one connection";
  EXPECT_TRUE(CallStats(*other, 500).ok());  // another connection is not held up
  GenerateResult r = stream.get();
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_TRUE(CallStats(*stub_, 2000).ok());
}

TEST_F(DisaggTest, ImpossibleMaxTokensIsInvalidArgumentAtOnce) {
  DaemonPair pair;
  pair.common = kTiny;
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  GenerateResult r =
      CallGenerate(*stub_, MakePrompt(10, 512, 1), INT_MAX, v1::LOAD_MODE_PIPELINED, 20000);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << r.status.error_message();
  EXPECT_NE(r.status.error_message().find("max_position"), std::string::npos)
      << r.status.error_message();
  EXPECT_LT(r.total_s, 1.0);
  const double refused_in = r.total_s;
  // The daemon still serves.
  r = CallGenerate(*stub_, MakePrompt(10, 512, 1), 2, v1::LOAD_MODE_PIPELINED, 20000);
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  FaultOutcome o;
  o.requests = 2;
  o.lost = r.status.ok() ? 0 : 1;
  o.blocks_leaked = BlocksNotFree(decode_address(), true, DeadlineAfterMs(5000));
  o.aborts = decode_->Running() ? 0 : 1;
  char buf[96];
  std::snprintf(buf, sizeof(buf), "INVALID_ARGUMENT in %.3f s; the next request served", refused_in);
  o.outcome = buf;
  RecordFault("limits.max_tokens_overflow", "Generate with max_tokens = 2^31-1", o);
}

TEST_F(DisaggTest, NewlineInRequestTagCannotForgeALogRecord) {
  DaemonPair pair;
  pair.common = kTiny;
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  const std::string forged = "2026-01-01T00:00:00.000Z E forged.cc:1 forged record";
  GenerateResult r = GenerateTagged(decode_address(), MakePrompt(5, 512, 2), 2,
                                    "tag-a\n" + forged, v1::LOAD_MODE_PIPELINED);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  const std::string log = decode_->Log();
  EXPECT_EQ(log.find("\n" + forged), std::string::npos) << log;
  EXPECT_NE(log.find("tag tag-a\\n" + forged), std::string::npos) << log;
  FaultOutcome o;
  o.requests = 1;
  o.lost = r.status.ok() ? 0 : 1;
  o.aborts = decode_->Running() ? 0 : 1;
  o.outcome = log.find("\n" + forged) == std::string::npos
                  ? "the newline logged escaped (\\n): no forged record"
                  : "a forged record appeared in the log";
  RecordFault("limits.newline_in_request_tag", "a newline and a fake log record in client_request_tag", o);
}

TEST_F(DisaggTest, AdmissionIsFirstComeFirstServed) {
  DaemonPair pair;
  pair.common = kTiny;
  pair.prefill = {"--fault_layer_delay_ms=600"};
  pair.decode = {"--pool_blocks=16"};  // 256 tokens
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  const std::string addr = decode_address();
  // A: 10 of the 16 blocks, held while the slowed prefill loads it.
  auto a = std::async(std::launch::async, [&] {
    return CallGenerate(*DecodeStub(addr), MakePrompt(100, 512, 1), 60, v1::LOAD_MODE_PIPELINED,
                        30000);
  });
  auto stub = DecodeStub(addr);
  for (auto d = DeadlineAfterMs(10000); Clock::now() < d;) {
    auto st = CallStats(*stub);
    if (st.ok() && st->pool().free_blocks() < 16) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // L: 12 blocks, more than the 6 free: it waits for A.
  auto large = std::async(std::launch::async, [&] {
    return CallGenerate(*DecodeStub(addr), MakePrompt(150, 512, 2), 40, v1::LOAD_MODE_LOCAL,
                        30000);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // S: 5 blocks each, which would fit at once; they came after L, so they wait behind it, and
  // once L holds its 12 blocks, the 4 left are too few for one of them until L is done.
  std::vector<std::future<GenerateResult>> small;
  for (int i = 0; i < 3; ++i)
    small.push_back(std::async(std::launch::async, [&, i] {
      return CallGenerate(*DecodeStub(addr), MakePrompt(60, 512, 10 + i), 10,
                          v1::LOAD_MODE_LOCAL, 30000);
    }));
  GenerateResult ra = a.get();
  GenerateResult rl = large.get();
  ASSERT_TRUE(ra.status.ok()) << ra.status.error_message();
  ASSERT_TRUE(rl.status.ok()) << rl.status.error_message();
  const int64_t large_last = rl.messages.back().server_time_us();
  int overtook = 0;
  for (auto& f : small) {
    GenerateResult rs = f.get();
    ASSERT_TRUE(rs.status.ok()) << rs.status.error_message();
    EXPECT_GT(rs.messages.front().server_time_us(), large_last)
        << "a small request that arrived after the large one took blocks before it";
    if (rs.messages.front().server_time_us() <= large_last) ++overtook;
  }
  FaultOutcome o;
  o.requests = 5;
  o.lost = 0;
  o.blocks_leaked = BlocksNotFree(decode_address(), true, DeadlineAfterMs(5000));
  o.aborts = decode_->Running() ? 0 : 1;
  o.outcome = std::to_string(overtook) + " of 3 later small requests overtook the queued large one";
  RecordFault("limits.fifo_admission",
              "a large prompt queued for KV blocks, then small ones that would fit at once", o);
}

}  // namespace
}  // namespace kvstream::testing
