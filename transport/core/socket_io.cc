#include "transport/core/socket_io.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

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

namespace {
constexpr size_t kMaxFdsPerMessage = 64;
}  // namespace

bool SendWithFds(int fd, const void* data, size_t n, const std::vector<int>& fds) {
  if (fds.size() > kMaxFdsPerMessage) return false;
  iovec iov{const_cast<void*>(data), n};
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
  ssize_t w;
  do {
    w = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
  } while (w < 0 && errno == EINTR);
  return w == static_cast<ssize_t>(n);
}

ssize_t RecvWithFds(int fd, void* buf, size_t n, int flags, std::vector<int>* fds, bool* truncated) {
  iovec iov{buf, n};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t r;
  do {
    r = ::recvmsg(fd, &msg, flags | MSG_CMSG_CLOEXEC);
  } while (r < 0 && errno == EINTR);
  *truncated = false;
  if (r < 0) return r;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int f;
      std::memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds->push_back(f);
    }
  }
  *truncated = (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0;
  return r;
}

}  // namespace kvstream::transport::core
