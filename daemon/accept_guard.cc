#include "daemon/accept_guard.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <mutex>

#include "common/log.h"

namespace kvstream::daemon {
namespace {

std::atomic<int> g_bound{0};  // 0: the guard is off (accept4 as libc's)
std::atomic<uint64_t> g_refused{0};
std::mutex g_spare_mu;
int g_spare = -1;  // a descriptor given up to accept (and close) one connection on EMFILE

using Accept4Fn = int (*)(int, sockaddr*, socklen_t*, int);

Accept4Fn RealAccept4() {
  static Accept4Fn real = reinterpret_cast<Accept4Fn>(dlsym(RTLD_NEXT, "accept4"));
  return real;
}

void NoteRefused(int fd_number) {
  const uint64_t n = ++g_refused;
  if (n == 1 || n % 1000 == 0) {
    KV_LOG_WARN << "connection refused: " << fd_number << "+ descriptors open (max_open_fds "
                << g_bound.load() << "); " << n << " refused so far";
  }
}

}  // namespace

int InstallAcceptGuard(int max_open_fds) {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    rlim_t want = rl.rlim_max == RLIM_INFINITY ? rlim_t(1) << 20 : rl.rlim_max;
    if (want > rl.rlim_cur) {
      rlimit raised{want, rl.rlim_max};
      if (setrlimit(RLIMIT_NOFILE, &raised) == 0) rl.rlim_cur = want;
    }
  }
  const int limit = static_cast<int>(std::min<rlim_t>(rl.rlim_cur, rlim_t(1) << 30));
  int bound = max_open_fds > 0 ? std::min(max_open_fds, limit) : limit - 256;
  bound = std::max(bound, 16);
  {
    std::lock_guard<std::mutex> lock(g_spare_mu);
    if (g_spare < 0) g_spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  RealAccept4();
  g_bound = bound;
  KV_LOG_INFO << "descriptor limit " << limit << "; connections accepted below " << bound
              << " open descriptors";
  return bound;
}

uint64_t AcceptGuardRefused() { return g_refused.load(); }

}  // namespace kvstream::daemon

// The guard itself (see the header): this definition in the executable interposes libc's for
// every caller in the process, gRPC's listeners included.
extern "C" int accept4(int fd, sockaddr* addr, socklen_t* len, int flags) {
  using namespace kvstream::daemon;
  const Accept4Fn real = RealAccept4();
  if (real == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  while (true) {
    const int c = real(fd, addr, len, flags);
    const int bound = g_bound.load(std::memory_order_relaxed);
    if (bound <= 0) return c;
    if (c >= 0) {
      if (c < bound) return c;
      close(c);
      NoteRefused(c);
      continue;  // until the backlog is empty (EAGAIN)
    }
    if (errno != EMFILE && errno != ENFILE) return c;
    std::lock_guard<std::mutex> lock(g_spare_mu);
    if (g_spare < 0) {
      errno = EAGAIN;  // nothing to accept with: the listener waits for the next connection
      return -1;
    }
    close(g_spare);
    const int one = real(fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (one >= 0) {
      close(one);
      NoteRefused(bound);
    }
    g_spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (one < 0) {
      errno = EAGAIN;
      return -1;
    }
  }
}
