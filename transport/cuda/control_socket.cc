#include "transport/cuda/control_socket.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "common/log.h"
#include "transport/core/private_socket.h"
#include "transport/core/socket_io.h"

namespace kvstream::transport::cuda {
namespace {

constexpr char kMagic[8] = {'K', 'V', 'I', 'P', 'C', 'N', '0', '1'};
// 3: frames carry the notification's MAC; the hello, the token of the listener's address.
// 4: memory requests, answered with the memory's descriptor (cuda_ipc's keys hold no handle).
constexpr uint32_t kVersion = 4;
constexpr char kTokenKey[] = "?token=";
constexpr char kGrantMagic[8] = {'K', 'V', 'I', 'P', 'C', 'G', '0', '1'};
constexpr uint32_t kMaxGrantKeyBytes = 4096;
constexpr char kMemoryMagic[8] = {'K', 'V', 'I', 'P', 'C', 'M', '0', '1'};

struct Hello {
  char magic[8];
  uint32_t version;
  uint32_t pid;
  uint8_t token[sizeof(core::Token)];  // the one in the listener's address
};
struct Frame {
  uint64_t request_id;
  int32_t layer;
  int32_t flags;
  uint8_t mac[kNotificationMacBytes];
};
struct EarlyTail {
  uint32_t seq;
  uint32_t reserved;
};
struct GrantHeader {
  char magic[8];
  uint32_t granted;
  uint32_t slot;
  uint32_t first_seq;
  uint32_t key_bytes;
};
struct MemoryHeader {
  char magic[8];
  uint32_t granted;
  int32_t code;  // StatusCode of a refusal
  uint32_t info_bytes;
  uint32_t reserved;
};
static_assert(sizeof(Hello) == 32 && sizeof(Frame) == 32 && sizeof(EarlyTail) == 8 &&
              sizeof(GrantHeader) == 24 && sizeof(MemoryHeader) == 24);

Frame ToFrame(const Notification& n, int32_t flags) {
  Frame f{n.request_id, n.layer, flags, {}};
  std::memcpy(f.mac, n.mac.data(), sizeof(f.mac));
  return f;
}

Notification FromFrame(const Frame& f, int32_t flags) {
  Notification n{f.request_id, f.layer, flags};
  std::memcpy(n.mac.data(), f.mac, sizeof(f.mac));
  return n;
}

Status Errno(std::string_view what) {
  return Unavailable(std::string(what) + ": " + std::strerror(errno));
}

struct ParsedAddress {
  std::string path;
  core::Token token{};
};

// "unix:<absolute path>?token=<32 hex digits>", optionally followed by "#..." (ignored here).
Result<ParsedAddress> ParseAddress(const std::string& address) {
  constexpr std::string_view kPrefix = "unix:";
  std::string rest = address;
  if (const size_t hash = rest.find('#'); hash != std::string::npos) rest.resize(hash);
  if (rest.compare(0, kPrefix.size(), kPrefix) != 0) {
    return InvalidArgument("cuda_ipc address must be unix:/path?token=..., got '" + address + "'");
  }
  rest = rest.substr(kPrefix.size());
  ParsedAddress a;
  const size_t q = rest.find(kTokenKey);
  a.path = rest.substr(0, q);
  if (a.path.empty() || a.path[0] != '/' || a.path.size() >= sizeof(sockaddr_un::sun_path)) {
    return InvalidArgument("cuda_ipc address does not name a filesystem socket (abstract sockets "
                           "are refused): '" + address + "'");
  }
  const std::string hex = q == std::string::npos ? "" : rest.substr(q + sizeof(kTokenKey) - 1);
  if (hex.size() != 2 * a.token.size()) {
    return InvalidArgument("cuda_ipc address has no token of 32 hex digits: '" + address + "'");
  }
  for (size_t i = 0; i < a.token.size(); ++i) {
    unsigned v = 0;
    for (char c : hex.substr(2 * i, 2)) {
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (d < 0) return InvalidArgument("cuda_ipc address token is not lowercase hex: '" + address + "'");
      v = v * 16 + unsigned(d);
    }
    a.token[i] = uint8_t(v);
  }
  return a;
}

std::string Hex(const core::Token& t) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (uint8_t b : t) {
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

}  // namespace

bool AddressWantsLandedFlags(const std::string& address) {
  const std::string_view a(address), s(kLandedFlagsSuffix);
  return a.size() >= s.size() && a.substr(a.size() - s.size()) == s;
}

Result<std::unique_ptr<NotificationListener>> NotificationListener::Start(
    const std::string& prefix, Callback on_notification, FlagRequestCallback on_flag_request,
    ClosedCallback on_closed, MemoryRequestCallback on_memory_request) {
  std::unique_ptr<NotificationListener> l(new NotificationListener());
  l->on_memory_request_ = std::move(on_memory_request);
  l->callback_ = std::move(on_notification);
  l->on_flag_request_ = std::move(on_flag_request);
  l->on_closed_ = std::move(on_closed);
  KV_ASSIGN_OR_RETURN(l->token_, core::NewToken());
  KV_ASSIGN_OR_RETURN(l->socket_, core::PrivateListener::Create(prefix, "sock", SOCK_STREAM,
                                                                /*nonblocking=*/true));
  l->listen_fd_ = l->socket_->fd();
  l->address_ = "unix:" + l->socket_->path() + kTokenKey + Hex(l->token_);
  l->wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (l->wake_fd_ < 0) return Errno("eventfd");
  l->thread_ = std::thread([p = l.get()] { p->Run(); });
  return l;
}

void NotificationListener::Drop(uint32_t conn) {
  {
    std::lock_guard<std::mutex> lock(drop_mu_);
    drops_.push_back(conn);
  }
  uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
}

NotificationListener::~NotificationListener() {
  if (thread_.joinable()) {
    stop_.store(true);
    uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
    thread_.join();
  }
  if (wake_fd_ >= 0) ::close(wake_fd_);  // socket_ closes and removes the listening socket
}

void NotificationListener::Run() {
  struct Conn {
    std::string buf;
    bool hello_done = false;
    uint32_t id = 0;
    uint32_t pid = 0;
    bool asked = false;    // sent its flag request
    bool granted = false;  // got a flag: its early frames are delivered
  };
  std::map<int, Conn> conns;
  uint32_t next_id = 0;
  auto close_conn = [&](std::map<int, Conn>::iterator it) {
    if (it->second.granted && on_closed_) on_closed_(it->second.id);
    ::close(it->first);
    conns.erase(it);
  };
  for (;;) {
    std::vector<pollfd> fds;
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    for (auto& [fd, c] : conns) fds.push_back({fd, POLLIN, 0});
    int rc = ::poll(fds.data(), fds.size(), 1000);
    if (rc < 0) {
      if (errno == EINTR) continue;
      KV_LOG_ERROR << "cuda_ipc listener poll: " << std::strerror(errno);
      break;
    }
    if (fds[0].revents) {
      if (stop_.load()) break;  // shutdown
      uint64_t v;
      (void)!::read(wake_fd_, &v, sizeof(v));
      std::vector<uint32_t> drops;
      {
        std::lock_guard<std::mutex> lock(drop_mu_);
        drops.swap(drops_);
      }
      for (uint32_t id : drops) {
        for (auto it = conns.begin(); it != conns.end(); ++it) {
          if (it->second.id != id) continue;
          KV_LOG_WARN << "cuda_ipc listener: dropping writer connection " << id;
          close_conn(it);
          break;
        }
      }
      continue;  // the poll set may name closed fds
    }
    if (fds[1].revents & POLLIN) {
      for (;;) {
        int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) break;
        // Only this user's processes (the 0700 directory keeps others out already).
        if (auto peer = core::SameUserPeer(fd); !peer.ok()) {
          Refused("a connection: " + peer.status().ToString());
          ::close(fd);
          continue;
        }
        Conn c;
        next_id = next_id % static_cast<uint32_t>(kLandedConnMask) + 1;  // 1..kLandedConnMask
        c.id = next_id;
        conns.emplace(fd, std::move(c));
      }
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      int fd = fds[i].fd;
      auto cit = conns.find(fd);
      if (cit == conns.end()) continue;
      Conn& c = cit->second;
      bool close_it = false;
      char tmp[4096];
      for (;;) {
        ssize_t r = ::recv(fd, tmp, sizeof(tmp), 0);
        if (r > 0) {
          c.buf.append(tmp, static_cast<size_t>(r));
          continue;
        }
        if (r == 0) close_it = true;  // writer closed (endpoint destroyed or process died)
        else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) close_it = true;
        break;
      }
      size_t pos = 0;
      if (!c.hello_done && c.buf.size() >= sizeof(Hello)) {
        Hello h;
        std::memcpy(&h, c.buf.data(), sizeof(h));
        if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0 || h.version != kVersion) {
          Refused("a bad hello (magic/version mismatch)");
          close_it = true;
          c.buf.clear();
        } else if (!core::SameToken(h.token, token_.data())) {
          // Not a writer that got our address from the (authenticated) handshake.
          Refused("writer pid " + std::to_string(h.pid) + ": its hello lacks this socket's token");
          close_it = true;
          c.buf.clear();
        } else {
          c.hello_done = true;
          c.pid = h.pid;
          pos = sizeof(Hello);
        }
      }
      // Frames that arrived with the EOF are still delivered; a protocol error stops here.
      bool bad = false;
      while (c.hello_done && !bad && c.buf.size() - pos >= sizeof(Frame)) {
        Frame f;
        std::memcpy(&f, c.buf.data() + pos, sizeof(f));
        if (f.flags == kFrameFlagRequest && f.layer == kMemoryRequestLayer) {
          pos += sizeof(f);
          if (!AnswerMemoryRequest(fd, c.id, c.pid, f.request_id)) {
            bad = true;
            break;
          }
          continue;
        }
        if (f.flags == kFrameFlagRequest) {
          pos += sizeof(f);
          GrantHeader g{};
          std::memcpy(g.magic, kGrantMagic, sizeof(kGrantMagic));
          std::string key;
          if (!c.asked && on_flag_request_) {
            Result<FlagGrant> r = on_flag_request_(c.id, c.pid);
            if (r.ok()) {
              g.granted = 1;
              g.slot = r.value().slot;
              g.first_seq = r.value().first_seq;
              key = r.value().key;
              g.key_bytes = static_cast<uint32_t>(key.size());
            } else {
              KV_LOG_WARN << "cuda_ipc listener: no landed flag for writer pid " << c.pid << ": "
                          << r.status().ToString();
            }
          }
          c.asked = true;
          c.granted = g.granted != 0;  // from here on its close is reported
          std::string msg(reinterpret_cast<const char*>(&g), sizeof(g));
          msg += key;
          // A fresh socket's buffer takes these few hundred bytes at once; anything less is a
          // broken peer.
          if (key.size() > kMaxGrantKeyBytes || !core::SendAll(fd, msg.data(), msg.size())) {
            bad = true;
            break;
          }
          continue;
        }
        if (f.flags == kNotificationLandedOnEvent) {
          if (!c.granted) {
            KV_LOG_WARN << "cuda_ipc listener: early frame from writer pid " << c.pid
                        << " without a landed flag, closing";
            bad = true;
            break;
          }
          if (c.buf.size() - pos < sizeof(Frame) + sizeof(EarlyTail)) break;  // tail on its way
          EarlyTail t;
          std::memcpy(&t, c.buf.data() + pos + sizeof(Frame), sizeof(t));
          pos += sizeof(Frame) + sizeof(EarlyTail);
          Notification n = FromFrame(f, kNotificationLandedOnEvent | static_cast<int32_t>(c.id));
          n.landed_seq = t.seq;
          if (callback_) callback_(n);
          continue;
        }
        pos += sizeof(f);
        if (callback_) callback_(FromFrame(f, f.flags));
      }
      if (close_it || bad) {
        close_conn(cit);
      } else {
        c.buf.erase(0, pos);
      }
    }
  }
  for (auto& [fd, c] : conns) ::close(fd);
}

bool NotificationListener::AnswerMemoryRequest(int fd, uint32_t conn, uint32_t pid, uint64_t id) {
  MemoryHeader h{};
  std::memcpy(h.magic, kMemoryMagic, sizeof(kMemoryMagic));
  std::string info;
  std::vector<int> fds;
  Result<MemoryGrant> r = on_memory_request_
                              ? on_memory_request_(conn, id)
                              : Result<MemoryGrant>(NotSupported("this listener grants no memory"));
  if (r.ok() && r.value().fd >= 0) {
    h.granted = 1;
    info = r.value().info;
    fds.push_back(r.value().fd);
    ++memory_granted_;
  } else {
    const Status st = r.ok() ? Internal("memory grant without a descriptor") : r.status();
    if (r.ok() && r.value().fd >= 0) ::close(r.value().fd);
    h.code = static_cast<int32_t>(st.code());
    info = st.message();
    const uint64_t n = ++memory_refused_;
    if (n <= 10 || (n & (n - 1)) == 0) {
      KV_LOG_WARN << "cuda_ipc listener: refused writer pid " << pid << " memory " << id << ": "
                  << st.ToString() << " (" << n << " refused so far)";
    }
  }
  if (info.size() > kMaxGrantKeyBytes) info.resize(kMaxGrantKeyBytes);
  h.info_bytes = static_cast<uint32_t>(info.size());
  std::string msg(reinterpret_cast<const char*>(&h), sizeof(h));
  msg += info;
  // A fresh socket's buffer takes this small message at once; anything less is a broken peer.
  const bool sent = core::SendWithFds(fd, msg.data(), msg.size(), fds);
  for (int f : fds) ::close(f);
  return sent;
}

void NotificationListener::Refused(const std::string& what) {
  const uint64_t n = ++refused_;
  if (n <= 10 || (n & (n - 1)) == 0) {
    KV_LOG_WARN << "cuda_ipc listener: refused " << what << " (" << n << " refused so far)";
  }
}

Result<std::unique_ptr<NotificationChannel>> NotificationChannel::Connect(
    const std::string& address, Deadline deadline) {
  KV_ASSIGN_OR_RETURN(ParsedAddress a, ParseAddress(address));
  std::unique_ptr<NotificationChannel> ch(new NotificationChannel());
  // Also checks that the listener runs under this uid (SO_PEERCRED).
  auto fd = core::ConnectPrivate(a.path, SOCK_STREAM, deadline);
  if (!fd.ok()) return fd.status().WithContext("cuda_ipc notification socket");
  ch->fd_ = fd.value();
  timeval tv{5, 0};
  (void)::setsockopt(ch->fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  Hello h{};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.version = kVersion;
  h.pid = static_cast<uint32_t>(::getpid());
  std::memcpy(h.token, a.token.data(), sizeof(h.token));
  if (!core::SendAll(ch->fd_, &h, sizeof(h))) return RemoteDisconnect("cuda_ipc: sending hello to " + address);
  return ch;
}

NotificationChannel::~NotificationChannel() {
  if (fd_ >= 0) ::close(fd_);
}

Status NotificationChannel::Send(const Notification& n) {
  Frame f = ToFrame(n, n.flags);
  std::lock_guard<std::mutex> lock(send_mu_);
  if (!core::SendAll(fd_, &f, sizeof(f))) {
    return RemoteDisconnect(std::string("cuda_ipc: notification socket: ") + std::strerror(errno));
  }
  return OkStatus();
}

Status NotificationChannel::SendBatch(const Notification* n, size_t count) {
  constexpr size_t kFramesPerWrite = 64;
  Frame frames[kFramesPerWrite];
  std::lock_guard<std::mutex> lock(send_mu_);
  for (size_t done = 0; done < count;) {
    const size_t k = std::min(kFramesPerWrite, count - done);
    for (size_t i = 0; i < k; ++i) {
      frames[i] = ToFrame(n[done + i], n[done + i].flags);
    }
    if (!core::SendAll(fd_, frames, k * sizeof(Frame))) {
      return RemoteDisconnect(std::string("cuda_ipc: notification socket: ") + std::strerror(errno));
    }
    done += k;
  }
  return OkStatus();
}

Status NotificationChannel::ReadAnswer(void* out, size_t n, Deadline deadline, std::vector<int>* fds,
                                       const char* what) {
  char* p = static_cast<char*>(out);
  while (n > 0) {
    const core::WaitResult w = core::WaitReadable(fd_, deadline, 1000);
    if (w == core::WaitResult::kDeadline) {
      return Timeout(std::string("cuda_ipc: no answer to the ") + what);
    }
    if (w == core::WaitResult::kError) return Errno("poll");
    if (w == core::WaitResult::kNotYet) continue;
    bool truncated = false;
    ssize_t r = core::RecvWithFds(fd_, p, n, MSG_DONTWAIT, fds, &truncated);
    if (r == 0) return RemoteDisconnect(std::string("cuda_ipc: receiver closed during the ") + what);
    if (r < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      return RemoteDisconnect(std::string("cuda_ipc: ") + what + ": " + std::strerror(errno));
    }
    if (truncated) return Internal(std::string("cuda_ipc: ") + what + ": too many descriptors");
    p += r;
    n -= static_cast<size_t>(r);
  }
  return OkStatus();
}

Result<FlagGrant> NotificationChannel::RequestLandedFlag(Deadline deadline) {
  {
    Frame f{0, 0, kFrameFlagRequest, {}};
    std::lock_guard<std::mutex> lock(send_mu_);
    if (!core::SendAll(fd_, &f, sizeof(f))) {
      return RemoteDisconnect(std::string("cuda_ipc: landed-flag request: ") + std::strerror(errno));
    }
  }
  std::vector<int> fds;  // none expected
  struct CloseFds {
    std::vector<int>* v;
    ~CloseFds() { for (int f : *v) ::close(f); }
  } close_fds{&fds};
  GrantHeader g;
  KV_RETURN_IF_ERROR(ReadAnswer(&g, sizeof(g), deadline, &fds, "landed-flag request"));
  if (std::memcmp(g.magic, kGrantMagic, sizeof(kGrantMagic)) != 0 || g.key_bytes > kMaxGrantKeyBytes) {
    return Internal("cuda_ipc: malformed landed-flag answer");
  }
  FlagGrant grant;
  grant.key.resize(g.key_bytes);
  if (g.key_bytes > 0) {
    KV_RETURN_IF_ERROR(ReadAnswer(grant.key.data(), g.key_bytes, deadline, &fds, "landed-flag request"));
  }
  if (g.granted == 0) return NotSupported("cuda_ipc: the receiver has no landed flag for this writer");
  grant.slot = g.slot;
  grant.first_seq = g.first_seq;
  return grant;
}

Result<MemoryGrant> NotificationChannel::RequestMemory(uint64_t id, Deadline deadline) {
  {
    Frame f{id, kMemoryRequestLayer, kFrameFlagRequest, {}};
    std::lock_guard<std::mutex> lock(send_mu_);
    if (!core::SendAll(fd_, &f, sizeof(f))) {
      return RemoteDisconnect(std::string("cuda_ipc: memory request: ") + std::strerror(errno));
    }
  }
  std::vector<int> fds;
  struct CloseFds {
    std::vector<int>* v;
    ~CloseFds() { for (int f : *v) ::close(f); }
  } close_fds{&fds};
  MemoryHeader h;
  KV_RETURN_IF_ERROR(ReadAnswer(&h, sizeof(h), deadline, &fds, "memory request"));
  if (std::memcmp(h.magic, kMemoryMagic, sizeof(kMemoryMagic)) != 0 || h.info_bytes > kMaxGrantKeyBytes) {
    return Internal("cuda_ipc: malformed answer to a memory request");
  }
  MemoryGrant grant;
  grant.info.resize(h.info_bytes);
  if (h.info_bytes > 0) {
    KV_RETURN_IF_ERROR(ReadAnswer(grant.info.data(), h.info_bytes, deadline, &fds, "memory request"));
  }
  if (h.granted == 0) {
    const StatusCode code = h.code == 0 ? StatusCode::kInternal : static_cast<StatusCode>(h.code);
    return Status(code, "cuda_ipc: the receiver refused memory " + std::to_string(id) + ": " + grant.info);
  }
  if (fds.size() != 1) {
    return Internal("cuda_ipc: a memory grant came with " + std::to_string(fds.size()) +
                    " descriptors, expected 1");
  }
  grant.fd = fds.back();
  fds.clear();
  return grant;
}

Status NotificationChannel::SendEarly(const Notification& n, uint32_t seq) {
  char msg[sizeof(Frame) + sizeof(EarlyTail)];
  Frame f = ToFrame(n, kNotificationLandedOnEvent);
  EarlyTail t{seq, 0};
  std::memcpy(msg, &f, sizeof(f));
  std::memcpy(msg + sizeof(f), &t, sizeof(t));
  std::lock_guard<std::mutex> lock(send_mu_);
  if (!core::SendAll(fd_, msg, sizeof(msg))) {
    return RemoteDisconnect(std::string("cuda_ipc: notification socket: ") + std::strerror(errno));
  }
  return OkStatus();
}

bool NotificationChannel::PeerClosed(int64_t timeout_us) const {
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  timespec ts{static_cast<time_t>(timeout_us / 1000000), static_cast<long>((timeout_us % 1000000) * 1000)};
  int rc = ::ppoll(&p, 1, &ts, nullptr);
  // The receiver never sends on this socket: readable means EOF or error.
  return rc > 0 && (p.revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace kvstream::transport::cuda
