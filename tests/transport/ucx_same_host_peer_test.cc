// The UCX backend's same-host shortcut writes only into the process proven to be the other end
// and only into memory that process registered (issue 15, item 3). A handshake forged from a
// genuine receiver's address, naming a bystander process (its pid and start time where the
// address carried them) and a buffer in it, must write nothing into the bystander: the test
// owns the bystander (a child process) and checks its buffer byte by byte. (Before the fix the
// prefill copied 64 KiB into it with process_vm_writev.)
#include <sys/mman.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

#include "tests/transport/process_fixture.h"
#include "tests/transport/ucx_blob_util.h"
#include "tests/fault_record.h"
#include "transport/core/envelope.h"
#include "transport/core/peer_process.h"
#include "transport/ucx/ucx_same_host.h"
#include "transport/ucx/ucx_transport.h"
#include "transport/ucx/ucx_wire.h"

namespace kvstream::transport {
namespace {

using kvstream::testing::FaultOutcome;
using kvstream::testing::RecordFault;

constexpr size_t kBytes = 64 << 10;
constexpr uint8_t kFill = 0xAB;

// A child that holds kBytes of kFill and, on each byte received, answers how many of them
// changed. Forked before anything here needs memory from the child's side: it only reads,
// writes and counts.
class Bystander {
 public:
  Bystander() {
    int to[2], from[2];
    if (pipe(to) != 0 || pipe(from) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      close(to[1]);
      close(from[0]);
      void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) _exit(1);
      auto* b = static_cast<volatile uint8_t*>(p);
      for (size_t i = 0; i < kBytes; ++i) b[i] = kFill;
      uint64_t addr = reinterpret_cast<uint64_t>(p);
      if (write(from[1], &addr, sizeof(addr)) != sizeof(addr)) _exit(1);
      char c;
      while (read(to[0], &c, 1) == 1) {
        uint64_t changed = 0;
        for (size_t i = 0; i < kBytes; ++i) changed += b[i] != kFill;
        if (write(from[1], &changed, sizeof(changed)) != sizeof(changed)) _exit(1);
      }
      _exit(0);
    }
    close(to[0]);
    close(from[1]);
    to_ = to[1];
    from_ = from[0];
    if (read(from_, &addr_, sizeof(addr_)) != sizeof(addr_)) addr_ = 0;
  }
  ~Bystander() {
    if (to_ >= 0) close(to_);
    if (from_ >= 0) close(from_);
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }
  uint64_t addr() const { return addr_; }
  // How many bytes of its buffer are no longer kFill (UINT64_MAX if it cannot tell).
  uint64_t Changed() {
    char c = 'c';
    uint64_t n = UINT64_MAX;
    if (write(to_, &c, 1) != 1 || read(from_, &n, sizeof(n)) != sizeof(n)) return UINT64_MAX;
    return n;
  }

 private:
  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
  uint64_t addr_ = 0;
};

template <class T>
void ReplaceAll(std::string& s, T from, T to) {
  if (from == T{}) return;
  for (size_t o = 0; o + sizeof(T) <= s.size(); ++o) {
    if (std::memcmp(s.data() + o, &from, sizeof(T)) == 0) std::memcpy(s.data() + o, &to, sizeof(T));
  }
}

// The receiver's address with every copy of its pid (as 32 bits) and process start time (64
// bits) replaced by the bystander's, sealed again: what an attacker makes of a genuine address.
std::string NamingBystander(const std::string& address, pid_t receiver, pid_t bystander) {
  const internal::WireTag tag = test::TagOf(address);
  auto e = internal::OpenEnvelope(tag, address, "address");
  EXPECT_TRUE(e.ok());
  std::string payload(e->payload);
  ReplaceAll<uint64_t>(payload, internal::ProcessStartTime(receiver),
                       internal::ProcessStartTime(bystander));
  ReplaceAll<uint32_t>(payload, static_cast<uint32_t>(receiver), static_cast<uint32_t>(bystander));
  return internal::SealEnvelope(tag, e->type, payload);
}

// Writes kBytes from `reg` to the receiver's region 0 through `ep`, notified as `request`, and
// checks that the receiver saw them land intact (it checks the pattern seeded with `request`).
void ExpectLayerLands(Endpoint& ep, const Registration* reg, test::RemotePeer& receiver,
                      uint64_t request) {
  WriteRequest r;
  r.local = reg;
  r.ops.push_back(CopyOp{0, 0, kBytes});
  r.notify = true;
  r.notification = Notification{request, 0, 0};
  auto h = ep.Write(r);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_TRUE((*h)->Wait(DeadlineAfterMs(20000)).ok());
  std::string line;
  ASSERT_TRUE(receiver.process.ReadLine(&line, DeadlineAfterMs(10000)));
  EXPECT_EQ(line, "NOTE " + std::to_string(request) + " 0 OK");
}

class SameHostPeer : public ::testing::TestWithParam<std::string> {};

TEST_P(SameHostPeer, HandshakeNamingABystanderWritesNothingIntoIt) {
  Bystander bystander;
  ASSERT_GT(bystander.pid(), 0);
  ASSERT_NE(bystander.addr(), 0u);
  ASSERT_EQ(bystander.Changed(), 0u);
  auto receiver = test::StartPeer(GetParam(), kBytes, kBytes);
  ASSERT_NE(receiver, nullptr);

  auto t = CreateTransport(test::Options("ucx", GetParam().substr(0, GetParam().find('+'))));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  std::vector<uint8_t> src(kBytes);
  test::FillPattern(src.data(), kBytes, 5);
  auto reg = (*t)->Register(MemoryRegion{src.data(), kBytes});
  ASSERT_TRUE(reg.ok());

  PeerDescriptor forged = receiver->descriptor;
  forged.address = NamingBystander(forged.address, receiver->process.pid(), bystander.pid());
  forged.regions[0].addr = bystander.addr();
  auto ep = (*t)->Connect(forged);
  if (ep.ok()) {
    WriteRequest r;
    r.local = reg->get();
    r.ops.push_back(CopyOp{0, 0, kBytes});
    auto h = (*ep)->Write(r);
    if (h.ok()) (*h)->Wait(DeadlineAfterMs(10000)).IgnoreError();
    ep->reset();
  } else {
    std::printf("forged handshake refused: %s\n", ep.status().ToString().c_str());
  }
  const uint64_t changed = bystander.Changed();
  EXPECT_EQ(changed, 0u) << "bytes of the bystander's buffer were overwritten";
  {
    FaultOutcome o;
    o.bytes_outside = static_cast<long>(changed);
    o.aborts = 0;
    const std::string tls = GetParam().empty() ? "default" : GetParam();
    o.outcome = "UCX_TLS " + tls + ": " +
                (ep.ok() ? "connected, but nothing landed in the bystander"
                         : "Connect() refused the forged handshake");
    RecordFault("data.forged_peer_pid",
                "a handshake forged from a genuine same-host address naming a bystander "
                "process's pid and a buffer in it",
                o);
  }

  // The genuine receiver is still reached and its layer lands.
  auto good = test::ConnectAdmitted(**t, *receiver, receiver->descriptor);
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  ASSERT_NO_FATAL_FAILURE(ExpectLayerLands(**good, reg->get(), *receiver, 5));
}

// A region its owner keyed as CUDA memory is not the gate's to grant (the gate grants host
// memory only): a same-host writer connects without asking the gate about it and sends its
// bytes as data messages, which the receiver lands only inside what it registered. Here the
// region names a bystander's buffer: the connection is made, nothing lands in the bystander,
// and the receiver keeps serving. (Before the fix every same-host writer to CUDA memory was
// refused: "region 0 is not memory the peer registered".)
TEST_P(SameHostPeer, CudaKeyedRegionIsLeftToTheReceiversOwnRegistrations) {
  Bystander bystander;
  ASSERT_GT(bystander.pid(), 0);
  ASSERT_NE(bystander.addr(), 0u);
  auto receiver = test::StartPeer(GetParam(), kBytes, kBytes);
  ASSERT_NE(receiver, nullptr);
  auto t = CreateTransport(test::Options("ucx", GetParam().substr(0, GetParam().find('+'))));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  std::vector<uint8_t> src(kBytes);
  test::FillPattern(src.data(), kBytes, 7);
  auto reg = (*t)->Register(MemoryRegion{src.data(), kBytes});
  ASSERT_TRUE(reg.ok());

  PeerDescriptor cuda = receiver->descriptor;
  auto key = ucx::DecodeKey(cuda.regions[0].key, "key");
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  cuda.regions[0].key = ucx::EncodeKey(key->rkey.data(), key->rkey.size(), true);
  cuda.regions[0].addr = bystander.addr();
  {
    auto ep = test::ConnectAdmitted(**t, *receiver, cuda);
    ASSERT_TRUE(ep.ok()) << ep.status().ToString();
    WriteRequest r;
    r.local = reg->get();
    r.ops.push_back(CopyOp{0, 0, kBytes});
    auto h = (*ep)->Write(r);
    if (h.ok()) (*h)->Wait(DeadlineAfterMs(10000)).IgnoreError();
  }
  EXPECT_EQ(bystander.Changed(), 0u) << "bytes of the bystander's buffer were overwritten";

  test::FillPattern(src.data(), kBytes, 8);
  auto good = test::ConnectAdmitted(**t, *receiver, receiver->descriptor);
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  ASSERT_NO_FATAL_FAILURE(ExpectLayerLands(**good, reg->get(), *receiver, 8));
}

// The gate is a filesystem socket (never abstract) of mode 0600 in a directory of mode 0700, and
// a writer that presents another token gets no shortcut: its writes go through UCX and land.
TEST_P(SameHostPeer, GateIsPrivateAndWantsTheToken) {
  auto receiver = test::StartPeer(GetParam(), kBytes, kBytes);
  ASSERT_NE(receiver, nullptr);
  auto a = ucx::DecodeAddress(receiver->descriptor.address);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  const std::string path = a->identity.gate_path;
  ASSERT_FALSE(path.empty());
  ASSERT_EQ(path[0], '/');
  struct stat sock {}, dir {};
  ASSERT_EQ(stat(path.c_str(), &sock), 0);
  EXPECT_TRUE(S_ISSOCK(sock.st_mode));
  EXPECT_EQ(sock.st_mode & 07777, 0600u);
  ASSERT_EQ(stat(path.substr(0, path.rfind('/')).c_str(), &dir), 0);
  EXPECT_EQ(dir.st_mode & 07777, 0700u);

  ucx::HostIdentity wrong = a->identity;
  wrong.gate_token[0] ^= 1;
  PeerDescriptor d = receiver->descriptor;
  d.address = ucx::EncodeAddress(wrong, a->listener);
  auto t = CreateTransport(test::Options("ucx", GetParam().substr(0, GetParam().find('+'))));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  std::vector<uint8_t> src(kBytes);
  test::FillPattern(src.data(), kBytes, 6);
  auto reg = (*t)->Register(MemoryRegion{src.data(), kBytes});
  ASSERT_TRUE(reg.ok());
  auto ep = test::ConnectAdmitted(**t, *receiver, d);
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  ASSERT_NO_FATAL_FAILURE(ExpectLayerLands(**ep, reg->get(), *receiver, 6));
  if (GetParam().find("alloc") != std::string::npos) {
    EXPECT_EQ(ucx::MapPeerRegion(**ep, 0).status().code(), StatusCode::kNotSupported)
        << "a writer without the token mapped the peer's memory";
  }
}

// An address's gate token is good for one writer: a second writer given the same address (a
// replay by whoever saw the handshake) gets no shortcut, and its writes still land through UCX.
TEST_P(SameHostPeer, AnAddressGivesTheShortcutToOneWriter) {
  auto receiver = test::StartPeer(GetParam(), kBytes, kBytes);
  ASSERT_NE(receiver, nullptr);
  const bool memfd = GetParam().find("alloc") != std::string::npos;
  std::vector<uint8_t> src(kBytes);
  for (int writer = 0; writer < 2; ++writer) {
    test::FillPattern(src.data(), kBytes, 20 + writer);  // what the peer checks for request 20 + writer
    auto t = CreateTransport(test::Options("ucx", GetParam().substr(0, GetParam().find('+'))));
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    auto reg = (*t)->Register(MemoryRegion{src.data(), kBytes});
    ASSERT_TRUE(reg.ok());
    auto ep = test::ConnectAdmitted(**t, *receiver, receiver->descriptor);
    ASSERT_TRUE(ep.ok()) << ep.status().ToString();
    if (memfd) {
      EXPECT_EQ(ucx::MapPeerRegion(**ep, 0).ok(), writer == 0)
          << (writer == 0 ? "the first writer got no shortcut" : "a replayed address mapped the peer's memory");
    }
    ASSERT_NO_FATAL_FAILURE(ExpectLayerLands(**ep, reg->get(), *receiver, 20 + writer));
  }
}

// The gate's tokens: each is taken once; issuing past kMaxWaitingTokens retires the oldest; a
// token it never issued is refused.
TEST(SameHostGate, TokensAreOneShotAndBounded) {
  auto gate = ucx::SameHostGate::Create();
  ASSERT_TRUE(gate.ok()) << gate.status().ToString();
  const std::string path = (*gate)->path();
  auto t1 = (*gate)->Issue();
  ASSERT_TRUE(t1.ok());
  EXPECT_TRUE(ucx::JoinGate(path, *t1).ok());
  EXPECT_EQ(ucx::JoinGate(path, *t1).status().code(), StatusCode::kUnavailable) << "a token was taken twice";
  ucx::GateToken forged = *t1;
  forged[3] ^= 0x5a;
  EXPECT_FALSE(ucx::JoinGate(path, forged).ok());
  auto oldest = (*gate)->Issue();
  ASSERT_TRUE(oldest.ok());
  Result<ucx::GateToken> last = oldest;
  for (size_t i = 0; i < ucx::SameHostGate::kMaxWaitingTokens; ++i) last = (*gate)->Issue();
  ASSERT_TRUE(last.ok());
  EXPECT_FALSE(ucx::JoinGate(path, *oldest).ok()) << "the oldest waiting token outlived the bound";
  EXPECT_TRUE(ucx::JoinGate(path, *last).ok());
}

// A gate socket at `dir`/gate that nobody listens on (bound, then closed), its time set
// `age_s` seconds back.
void DeadGate(const std::string& dir, int age_s) {
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(chmod(dir.c_str(), 0700), 0);
  int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  const std::string path = dir + "/gate";
  std::strcpy(sa.sun_path, path.c_str());
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  close(fd);
  timespec t[2];
  clock_gettime(CLOCK_REALTIME, &t[0]);
  t[0].tv_sec -= age_s;
  t[1] = t[0];
  ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), t, AT_SYMLINK_NOFOLLOW), 0);
}

bool Exists(const std::string& path) {
  struct stat st {};
  return lstat(path.c_str(), &st) == 0;
}

// A gate left behind by a process that died (SIGKILL) is removed by the next transport made
// in that directory; a young one (perhaps being set up) and a live one stay.
TEST(SameHostGate, StaleGatesAreRemovedLiveAndYoungOnesKept) {
  char tmpl[] = "/tmp/kvs-gate-test-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string base = tmpl;
  const char* old_tmp = std::getenv("TMPDIR");
  const std::string saved = old_tmp ? old_tmp : "";
  setenv("TMPDIR", base.c_str(), 1);
  {
    auto live = CreateTransport(test::Options("ucx", "sm,tcp"));
    ASSERT_TRUE(live.ok()) << live.status().ToString();
    auto a = ucx::DecodeAddress((*live)->LocalAddress());
    ASSERT_TRUE(a.ok());
    const std::string live_gate = a->identity.gate_path;
    ASSERT_EQ(live_gate.rfind(base, 0), 0u) << live_gate;
    timespec t[2];
    clock_gettime(CLOCK_REALTIME, &t[0]);
    t[0].tv_sec -= 600;
    t[1] = t[0];
    ASSERT_EQ(utimensat(AT_FDCWD, live_gate.c_str(), t, AT_SYMLINK_NOFOLLOW), 0);
    ASSERT_NO_FATAL_FAILURE(DeadGate(base + "/kvstream-ucx-stale1", 600));
    ASSERT_NO_FATAL_FAILURE(DeadGate(base + "/kvstream-ucx-young1", 5));
    ASSERT_NO_FATAL_FAILURE(DeadGate(base + "/other-stale", 600));

    auto next = CreateTransport(test::Options("ucx", "sm,tcp"));
    ASSERT_TRUE(next.ok()) << next.status().ToString();
    EXPECT_FALSE(Exists(base + "/kvstream-ucx-stale1")) << "a dead gate was kept";
    EXPECT_TRUE(Exists(base + "/kvstream-ucx-young1/gate")) << "a young gate was removed";
    EXPECT_TRUE(Exists(base + "/other-stale/gate")) << "something not a gate was removed";
    EXPECT_TRUE(Exists(live_gate)) << "a live gate was removed";
  }
  if (saved.empty()) {
    unsetenv("TMPDIR");
  } else {
    setenv("TMPDIR", saved.c_str(), 1);
  }
  for (const char* d : {"/kvstream-ucx-young1", "/other-stale"}) {
    unlink((base + d + "/gate").c_str());
    rmdir((base + d).c_str());
  }
  EXPECT_EQ(rmdir(base.c_str()), 0) << "the transports left something behind in " << base;
}

INSTANTIATE_TEST_SUITE_P(Ucx, SameHostPeer, ::testing::Values("sm,tcp", "sm,tcp+alloc", ""),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param.empty() ? std::string("default")
                                  : info.param == "sm,tcp" ? std::string("sm_tcp")
                                                           : std::string("sm_tcp_alloc");
                         });

}  // namespace
}  // namespace kvstream::transport
