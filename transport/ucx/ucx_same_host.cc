#include "transport/ucx/ucx_same_host.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "common/log.h"
#include "transport/core/envelope.h"

namespace kvstream::transport::ucx {
namespace {

using internal::PayloadReader;
using internal::PayloadWriter;

constexpr internal::WireTag kGateTag = {{'K', 'V', 'U', 'G'}, 1};
enum GateMessage : uint16_t { kHello = 1, kGrant = 2, kDone = 3 };
constexpr size_t kMaxRanges = 256;
constexpr size_t kMaxFds = 64;
constexpr size_t kMaxMessage = 64 + kMaxRanges * 32;
constexpr int kIoTimeoutMs = 1000;

struct RangeRecord {
  uint64_t addr;
  uint64_t length;
  int32_t fd_index;  // into the message's descriptors; -1 = none
  uint32_t reserved;
};
static_assert(sizeof(RangeRecord) == 24);

std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

void SetTimeouts(int fd) {
  timeval tv{kIoTimeoutMs / 1000, (kIoTimeoutMs % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

bool PeerCred(int fd, ucred* cred) {
  socklen_t len = sizeof(*cred);
  return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, cred, &len) == 0 && len == sizeof(*cred);
}

bool SendMessage(int fd, const std::string& m, const std::vector<int>& fds = {}) {
  iovec iov{const_cast<char*>(m.data()), m.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control;
  if (!fds.empty()) {
    control.resize(CMSG_SPACE(sizeof(int) * fds.size()));
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do {
    n = sendmsg(fd, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(m.size());
}

void CloseAll(std::vector<int>* fds) {
  for (int f : *fds) close(f);
  fds->clear();
}

// One whole message (SOCK_SEQPACKET) and the descriptors that came with it (owned by the
// caller, close-on-exec). False on EOF, timeout, truncation or error; nothing is leaked.
bool ReceiveMessage(int fd, std::string* m, std::vector<int>* fds) {
  m->assign(kMaxMessage, '\0');
  iovec iov{m->data(), m->size()};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * kMaxFds));
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  ssize_t n;
  do {
    n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n > 0) {
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int f;
        std::memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds->push_back(f);
      }
    }
  }
  if (n <= 0 || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) {
    CloseAll(fds);
    return false;
  }
  m->resize(static_cast<size_t>(n));
  return true;
}

bool SameToken(const uint8_t* a, const uint8_t* b) {
  uint8_t diff = 0;
  for (size_t i = 0; i < sizeof(GateToken); ++i) diff |= a[i] ^ b[i];
  return diff == 0;
}

// Gates of processes that died without cleaning up (SIGKILL) leave their directory behind.
// One is removed when it is ours (uid, mode 0700), its socket is older than a minute (so never
// one being set up) and nothing listens on it any more (ECONNREFUSED).
int RemoveStaleGates(const std::string& base) {
  constexpr int kMaxRemovals = 64;
  constexpr time_t kMinAgeS = 60;
  DIR* d = opendir(base.c_str());
  if (d == nullptr) return 0;
  int removed = 0;
  const time_t now = time(nullptr);
  while (dirent* e = readdir(d)) {
    if (removed == kMaxRemovals) break;
    if (std::strncmp(e->d_name, "kvstream-ucx-", 13) != 0) continue;
    const std::string dir = base + "/" + e->d_name, sock = dir + "/gate";
    struct stat ds {}, ss {};
    if (lstat(dir.c_str(), &ds) != 0 || !S_ISDIR(ds.st_mode) || ds.st_uid != geteuid() ||
        (ds.st_mode & 07777) != 0700 || lstat(sock.c_str(), &ss) != 0 || !S_ISSOCK(ss.st_mode) ||
        now - ss.st_mtime < kMinAgeS || sock.size() >= sizeof(sockaddr_un::sun_path)) {
      continue;
    }
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) break;
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::memcpy(sa.sun_path, sock.c_str(), sock.size() + 1);
    const bool dead = connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 &&
                      errno == ECONNREFUSED;
    close(fd);
    if (dead && unlink(sock.c_str()) == 0 && rmdir(dir.c_str()) == 0) ++removed;
  }
  closedir(d);
  return removed;
}

}  // namespace

Result<std::unique_ptr<SameHostGate>> SameHostGate::Create() {
  std::unique_ptr<SameHostGate> g(new SameHostGate());
  if (getrandom(g->token_.data(), g->token_.size(), 0) != static_cast<ssize_t>(g->token_.size())) {
    return Internal(Errno("ucx same-host gate: getrandom"));
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string base = tmp != nullptr && tmp[0] == '/' ? tmp : "/tmp";
  std::string templ = base + "/kvstream-ucx-XXXXXX";
  if (templ.size() + 6 >= sizeof(sockaddr_un::sun_path)) {
    base = "/tmp";
    templ = "/tmp/kvstream-ucx-XXXXXX";
  }
  if (int n = RemoveStaleGates(base); n > 0) {
    KV_LOG_INFO << "ucx same-host gate: removed " << n << " stale gate directories in " << base;
  }
  if (mkdtemp(templ.data()) == nullptr) return Internal(Errno("ucx same-host gate: mkdtemp"));
  g->dir_ = templ;  // mode 0700 (mkdtemp)
  g->path_ = g->dir_ + "/gate";
  g->listen_fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (g->listen_fd_ < 0) return Internal(Errno("ucx same-host gate: socket"));
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, g->path_.c_str(), g->path_.size() + 1);
  if (bind(g->listen_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      chmod(g->path_.c_str(), 0600) != 0 || listen(g->listen_fd_, 16) != 0) {
    return Internal(Errno("ucx same-host gate: bind/listen"));
  }
  g->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (g->wake_fd_ < 0) return Internal(Errno("ucx same-host gate: eventfd"));
  g->thread_ = std::thread([raw = g.get()] { raw->Loop(); });
  return g;
}

SameHostGate::~SameHostGate() {
  if (thread_.joinable()) {
    stopping_.store(true);
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
    thread_.join();
  }
  if (listen_fd_ >= 0) close(listen_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
  if (!path_.empty()) unlink(path_.c_str());
  if (!dir_.empty()) rmdir(dir_.c_str());
}

void SameHostGate::Add(const void* key, uint64_t addr, uint64_t length, int memfd) {
  std::lock_guard<std::mutex> lock(mu_);
  ranges_[key] = Range{addr, length, memfd};
}

void SameHostGate::Remove(const void* key) {
  std::lock_guard<std::mutex> lock(mu_);
  ranges_.erase(key);
}

void SameHostGate::Loop() {
  while (!stopping_.load()) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0 && errno != EINTR) break;
    if (stopping_.load()) break;
    if ((fds[0].revents & POLLIN) == 0) continue;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Serve(fd);
    close(fd);
  }
}

void SameHostGate::Serve(int fd) {
  SetTimeouts(fd);
  ucred cred{};
  if (!PeerCred(fd, &cred) || cred.uid != geteuid()) {
    KV_LOG_WARN << "ucx same-host gate: refused a connection from uid " << cred.uid;
    return;
  }
  std::string m;
  std::vector<int> stray;
  if (!ReceiveMessage(fd, &m, &stray)) return;
  CloseAll(&stray);  // a hello carries no descriptor
  auto e = internal::OpenEnvelope(kGateTag, m, "same-host hello");
  if (!e.ok() || e->type != kHello || e->payload.size() != sizeof(GateToken) ||
      !SameToken(reinterpret_cast<const uint8_t*>(e->payload.data()), token_.data())) {
    KV_LOG_WARN << "ucx same-host gate: refused pid " << cred.pid << " (no valid token)";
    return;
  }
  std::vector<int> fds;
  PayloadWriter grant;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<RangeRecord> records;
    for (const auto& [key, r] : ranges_) {
      if (records.size() == kMaxRanges) break;
      int32_t index = -1;
      if (r.memfd >= 0 && fds.size() < kMaxFds) {
        int d = fcntl(r.memfd, F_DUPFD_CLOEXEC, 0);
        if (d >= 0) {
          index = static_cast<int32_t>(fds.size());
          fds.push_back(d);
        }
      }
      records.push_back(RangeRecord{r.addr, r.length, index, 0});
    }
    grant.Record(static_cast<uint32_t>(records.size()));
    for (const RangeRecord& r : records) grant.Record(r);
  }
  const bool sent = SendMessage(fd, grant.Seal(kGateTag, kGrant), fds);
  for (int f : fds) close(f);
  if (!sent) return;
  // The writer says it holds a pidfd on us; answering proves we were alive after it opened it.
  if (!ReceiveMessage(fd, &m, &stray)) return;
  CloseAll(&stray);
  auto done = internal::OpenEnvelope(kGateTag, m, "same-host done");
  if (done.ok() && done->type == kDone) SendMessage(fd, internal::SealEnvelope(kGateTag, kDone, ""));
}

PeerGrant::PeerGrant(PeerGrant&& o) noexcept
    : pid(o.pid), process(std::move(o.process)), ranges(std::move(o.ranges)) {
  o.ranges.clear();
}

PeerGrant::~PeerGrant() {
  for (const GrantedRange& r : ranges) {
    if (r.fd >= 0) close(r.fd);
  }
}

const GrantedRange* PeerGrant::Covering(uint64_t addr, uint64_t length) const {
  for (const GrantedRange& r : ranges) {
    if (addr >= r.addr && length <= r.length && addr - r.addr <= r.length - length) return &r;
  }
  return nullptr;
}

Result<PeerGrant> JoinGate(const std::string& path, const GateToken& token) {
  sockaddr_un sa{};
  if (path.empty() || path.size() >= sizeof(sa.sun_path) || path[0] != '/') {
    return Unavailable("no same-host socket");
  }
  struct Fd {
    int fd;
    ~Fd() {
      if (fd >= 0) close(fd);
    }
  } s{socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0)};
  if (s.fd < 0) return Unavailable(Errno("socket"));
  SetTimeouts(s.fd);
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  if (connect(s.fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    return Unavailable(Errno("connecting to the peer's same-host socket"));
  }
  ucred cred{};
  if (!PeerCred(s.fd, &cred) || cred.pid <= 0) {
    return Unavailable("the kernel does not name the process behind the peer's socket");
  }
  if (cred.uid != geteuid()) return Unavailable("the peer's socket belongs to another user");
  std::string hello(reinterpret_cast<const char*>(token.data()), token.size());
  if (!SendMessage(s.fd, internal::SealEnvelope(kGateTag, kHello, hello))) {
    return Unavailable(Errno("sending to the peer's same-host socket"));
  }
  std::string m;
  std::vector<int> fds;
  if (!ReceiveMessage(s.fd, &m, &fds)) {
    return Unavailable("the peer's same-host socket granted nothing (wrong token?)");
  }
  PeerGrant grant;
  grant.pid = cred.pid;
  std::vector<bool> used(fds.size(), false);
  auto e = internal::OpenEnvelope(kGateTag, m, "same-host grant");
  uint32_t count = 0;
  bool ok = e.ok() && e->type == kGrant;
  PayloadReader in(ok ? e->payload : std::string_view());
  ok = ok && in.Record(&count) && count <= kMaxRanges;
  for (uint32_t i = 0; ok && i < count; ++i) {
    RangeRecord r;
    ok = in.Record(&r) && r.length > 0 && r.addr + r.length > r.addr &&
         r.fd_index >= -1 && (r.fd_index < 0 || static_cast<size_t>(r.fd_index) < fds.size());
    if (!ok) break;
    GrantedRange g{r.addr, r.length, -1};
    if (r.fd_index >= 0 && !used[r.fd_index]) {
      struct stat st {};
      const int f = fds[r.fd_index];
      if (fstat(f, &st) == 0 && S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) >= r.length) {
        g.fd = f;
        used[r.fd_index] = true;
      }
    }
    grant.ranges.push_back(g);
  }
  for (size_t i = 0; i < fds.size(); ++i) {
    if (!used[i]) close(fds[i]);
  }
  if (!ok || !in.done()) return Unavailable("the peer's same-host grant is malformed");
  grant.process = internal::PeerProcess(cred.pid);
  if (!grant.process.valid()) return Unavailable(Errno("pidfd_open on the peer"));
  // The peer answers only while alive: then the pidfd opened above is that process.
  std::vector<int> stray;
  const bool answered = SendMessage(s.fd, internal::SealEnvelope(kGateTag, kDone, "")) &&
                        ReceiveMessage(s.fd, &m, &stray) &&
                        internal::OpenEnvelope(kGateTag, m, "same-host done").ok();
  CloseAll(&stray);
  if (!answered) return Unavailable("the peer left during the same-host handshake");
  return grant;
}

}  // namespace kvstream::transport::ucx
