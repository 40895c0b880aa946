#include "transport/core/socket_io.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>

namespace kvstream::transport::core {

bool SendAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAvailable(int fd, std::string* buf) {
  char tmp[65536];
  for (;;) {
    ssize_t r = ::recv(fd, tmp, sizeof(tmp), MSG_DONTWAIT);
    if (r > 0) {
      buf->append(tmp, static_cast<size_t>(r));
      continue;
    }
    if (r == 0) return false;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
}

WaitResult WaitReadable(int fd, Deadline deadline, int64_t slice_ms) {
  const int64_t left_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left_ms <= 0) return WaitResult::kDeadline;
  pollfd p{fd, POLLIN, 0};
  const int rc = ::poll(&p, 1, static_cast<int>(std::min(left_ms, slice_ms)));
  if (rc < 0) return errno == EINTR ? WaitResult::kNotYet : WaitResult::kError;
  return rc > 0 ? WaitResult::kReadable : WaitResult::kNotYet;
}

}  // namespace kvstream::transport::core
