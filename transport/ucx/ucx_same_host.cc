#include "transport/ucx/ucx_same_host.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "transport/core/envelope.h"
#include "transport/core/private_socket.h"
#include "transport/core/socket_io.h"

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

bool SendMessage(int fd, const std::string& m, const std::vector<int>& fds = {}) {
  return core::SendWithFds(fd, m.data(), m.size(), fds);
}

void CloseAll(std::vector<int>* fds) {
  for (int f : *fds) close(f);
  fds->clear();
}

// One whole message (SOCK_SEQPACKET) and the descriptors that came with it (owned by the
// caller, close-on-exec). False on EOF, timeout, truncation or error; nothing is leaked.
bool ReceiveMessage(int fd, std::string* m, std::vector<int>* fds) {
  m->assign(kMaxMessage, '\0');
  bool truncated = false;
  const ssize_t n = core::RecvWithFds(fd, m->data(), m->size(), 0, fds, &truncated);
  if (n <= 0 || truncated || fds->size() > kMaxFds) {
    CloseAll(fds);
    return false;
  }
  m->resize(static_cast<size_t>(n));
  return true;
}

}  // namespace

Result<std::unique_ptr<SameHostGate>> SameHostGate::Create() {
  std::unique_ptr<SameHostGate> g(new SameHostGate());
  KV_ASSIGN_OR_RETURN(g->listener_,
                      core::PrivateListener::Create("kvstream-ucx", "gate", SOCK_SEQPACKET));
  g->listen_fd_ = g->listener_->fd();
  g->path_ = g->listener_->path();
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
  if (wake_fd_ >= 0) close(wake_fd_);
  // listener_ closes the socket and removes it and its directory.
}

void SameHostGate::Add(const void* key, uint64_t addr, uint64_t length, int memfd) {
  std::lock_guard<std::mutex> lock(mu_);
  ranges_[key] = Range{addr, length, memfd};
}

void SameHostGate::Remove(const void* key) {
  std::lock_guard<std::mutex> lock(mu_);
  ranges_.erase(key);
}

Result<GateToken> SameHostGate::Issue() {
  auto token = core::NewToken();
  if (!token.ok()) return token.status().WithContext("ucx same-host gate");
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  while (!issued_.empty() && (issued_.front().expires <= now || issued_.size() >= kMaxWaitingTokens))
    issued_.pop_front();
  issued_.push_back(Issued{token.value(), now + kTokenLifetime});
  return token.value();
}

bool SameHostGate::TakeToken(const uint8_t* token) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = issued_.begin(); it != issued_.end(); ++it) {
    if (!core::SameToken(token, it->token.data())) continue;
    const bool fresh = it->expires > now;
    issued_.erase(it);
    return fresh;
  }
  return false;
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
  auto peer = core::SameUserPeer(fd);
  if (!peer.ok()) {
    KV_LOG_WARN << "ucx same-host gate: refused a connection: " << peer.status().ToString();
    return;
  }
  const ucred cred = peer.value();
  std::string m;
  std::vector<int> stray;
  if (!ReceiveMessage(fd, &m, &stray)) return;
  CloseAll(&stray);  // a hello carries no descriptor
  auto e = internal::OpenEnvelope(kGateTag, m, "same-host hello");
  if (!e.ok() || e->type != kHello || e->payload.size() != sizeof(GateToken) ||
      !TakeToken(reinterpret_cast<const uint8_t*>(e->payload.data()))) {
    KV_LOG_WARN << "ucx same-host gate: refused pid " << cred.pid
                << " (no valid token: forged, used before or expired)";
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
  if (path.empty() || path[0] != '/') return Unavailable("no same-host socket");
  auto connected = core::ConnectPrivate(path, SOCK_SEQPACKET, DeadlineAfterMs(kIoTimeoutMs));
  if (!connected.ok()) return Unavailable(connected.status().message());
  struct Fd {
    int fd;
    ~Fd() {
      if (fd >= 0) close(fd);
    }
  } s{connected.value()};
  SetTimeouts(s.fd);
  auto peer = core::SameUserPeer(s.fd);
  if (!peer.ok()) return Unavailable(peer.status().message());
  const ucred cred = peer.value();
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
