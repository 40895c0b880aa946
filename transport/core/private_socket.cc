#include "transport/core/private_socket.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <thread>

#include "common/log.h"

namespace kvstream::transport::core {
namespace {

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

bool ToSockaddr(const std::string& path, sockaddr_un* sa) {
  if (path.empty() || path[0] != '/' || path.size() >= sizeof(sa->sun_path)) return false;
  *sa = sockaddr_un{};
  sa->sun_family = AF_UNIX;
  std::memcpy(sa->sun_path, path.c_str(), path.size() + 1);
  return true;
}

// Directories of processes that died without cleaning up (SIGKILL) stay behind. One is removed
// when it is ours (uid, mode 0700), its socket is older than a minute (so never one being set
// up) and nothing listens on it any more (ECONNREFUSED).
int RemoveStale(const std::string& base, const std::string& prefix, const std::string& name,
                int type) {
  constexpr int kMaxRemovals = 64;
  constexpr time_t kMinAgeS = 60;
  DIR* d = opendir(base.c_str());
  if (d == nullptr) return 0;
  int removed = 0;
  const time_t now = time(nullptr);
  const std::string start = prefix + "-";
  while (dirent* e = readdir(d)) {
    if (removed == kMaxRemovals) break;
    if (std::strncmp(e->d_name, start.c_str(), start.size()) != 0) continue;
    const std::string dir = base + "/" + e->d_name, sock = dir + "/" + name;
    struct stat ds {}, ss {};
    sockaddr_un sa;
    if (lstat(dir.c_str(), &ds) != 0 || !S_ISDIR(ds.st_mode) || ds.st_uid != geteuid() ||
        (ds.st_mode & 07777) != 0700 || lstat(sock.c_str(), &ss) != 0 || !S_ISSOCK(ss.st_mode) ||
        now - ss.st_mtime < kMinAgeS || !ToSockaddr(sock, &sa)) {
      continue;
    }
    int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
    if (fd < 0) break;
    const bool dead = connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 &&
                      errno == ECONNREFUSED;
    close(fd);
    if (dead && unlink(sock.c_str()) == 0 && rmdir(dir.c_str()) == 0) ++removed;
  }
  closedir(d);
  return removed;
}

}  // namespace

Result<std::unique_ptr<PrivateListener>> PrivateListener::Create(const std::string& prefix,
                                                                 const std::string& name,
                                                                 int type, bool nonblocking) {
  std::unique_ptr<PrivateListener> l(new PrivateListener());
  const char* tmp = std::getenv("TMPDIR");
  std::string base = tmp != nullptr && tmp[0] == '/' ? tmp : "/tmp";
  std::string templ = base + "/" + prefix + "-XXXXXX";
  if (templ.size() + 1 + name.size() >= sizeof(sockaddr_un::sun_path)) {
    base = "/tmp";
    templ = base + "/" + prefix + "-XXXXXX";
  }
  if (int n = RemoveStale(base, prefix, name, type); n > 0) {
    KV_LOG_INFO << prefix << ": removed " << n << " stale socket directories in " << base;
  }
  if (mkdtemp(templ.data()) == nullptr) return Internal(Errno(prefix + ": mkdtemp"));
  l->dir_ = templ;  // mode 0700 (mkdtemp); from here on the destructor removes it
  sockaddr_un sa;
  if (!ToSockaddr(l->dir_ + "/" + name, &sa)) return Internal(prefix + ": socket path too long");
  l->fd_ = socket(AF_UNIX, type | SOCK_CLOEXEC | (nonblocking ? SOCK_NONBLOCK : 0), 0);
  if (l->fd_ < 0) return Internal(Errno(prefix + ": socket"));
  if (bind(l->fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    return Internal(Errno(prefix + ": bind"));
  }
  l->path_ = l->dir_ + "/" + name;
  if (chmod(l->path_.c_str(), 0600) != 0 || listen(l->fd_, 64) != 0) {
    return Internal(Errno(prefix + ": chmod/listen"));
  }
  return l;
}

PrivateListener::~PrivateListener() {
  if (fd_ >= 0) close(fd_);
  if (!path_.empty()) unlink(path_.c_str());
  if (!dir_.empty()) rmdir(dir_.c_str());
}

Result<ucred> SameUserPeer(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof(cred) ||
      cred.pid <= 0) {
    return Unavailable("the kernel does not name the process behind the socket");
  }
  if (cred.uid != geteuid()) {
    return FailedPrecondition("the process behind the socket (pid " + std::to_string(cred.pid) +
                            ") runs as uid " + std::to_string(cred.uid) + ", not as this user");
  }
  return cred;
}

Result<int> ConnectPrivate(const std::string& path, int type, Deadline deadline) {
  sockaddr_un sa;
  if (!ToSockaddr(path, &sa)) {
    return InvalidArgument("'" + path + "' is not an absolute socket path (abstract sockets are refused)");
  }
  int fd = -1;
  for (;;) {
    fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
    if (fd < 0) return Unavailable(Errno("socket"));
    if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0) break;
    const int err = errno;
    close(fd);
    // A listener's backlog can be momentarily full; anything else is final.
    if ((err != EAGAIN && err != EINTR) || Expired(deadline)) {
      errno = err;
      return Unavailable(Errno("connect " + path));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  auto peer = SameUserPeer(fd);
  if (!peer.ok()) {
    close(fd);
    return peer.status().WithContext(path);
  }
  return fd;
}

Result<Token> NewToken() {
  Token t;
  if (getrandom(t.data(), t.size(), 0) != static_cast<ssize_t>(t.size())) {
    return Internal(Errno("getrandom"));
  }
  return t;
}

bool SameToken(const uint8_t* a, const uint8_t* b) {
  uint8_t diff = 0;
  for (size_t i = 0; i < sizeof(Token); ++i) diff |= a[i] ^ b[i];
  return diff == 0;
}

}  // namespace kvstream::transport::core
