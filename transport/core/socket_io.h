// Blocking-socket helpers the backends' control channels share (cuda_ipc's notification socket,
// nccl's control socket, the UCX same-host gate): whole writes, non-blocking drains, bounded
// waits for input, and descriptors passed over Unix sockets (SCM_RIGHTS). No framing: each
// backend's wire file says what the bytes are.
//
// Guarantees:
//  - SendAll never raises SIGPIPE (MSG_NOSIGNAL) and retries EINTR; on false errno says why.
//  - ReadAvailable never blocks.
//  - WaitReadable never waits past `deadline`, nor longer than `slice_ms` at a time.
//  - RecvWithFds never leaks a descriptor: every one that arrived is in `fds` (close-on-exec),
//    also when it reports truncation or an error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/time.h"

namespace kvstream::transport::core {

// Writes all `n` bytes; false on a socket error (the peer is gone or the send timed out).
bool SendAll(int fd, const void* data, size_t n);
inline bool SendAll(int fd, const std::string& data) { return SendAll(fd, data.data(), data.size()); }

// Appends whatever can be read now without blocking. False once the peer closed (EOF) or the
// socket failed; true while it is open (whether or not anything arrived).
bool ReadAvailable(int fd, std::string* buf);

enum class WaitResult {
  kReadable,  // input (or EOF) is there
  kNotYet,    // the slice passed: ask again (the caller may check other things between)
  kDeadline,  // `deadline` passed before anything arrived
  kError,     // poll failed (errno says why)
};
// Waits for `fd` to become readable for at most min(slice_ms, time left before `deadline`).
WaitResult WaitReadable(int fd, Deadline deadline, int64_t slice_ms);

// One sendmsg of `n` bytes with `fds` attached (SCM_RIGHTS; none when empty), EINTR retried,
// never SIGPIPE. True only when all `n` bytes went (a message of a SOCK_SEQPACKET socket, or a
// small one of a stream socket: the descriptors travel with its first byte).
bool SendWithFds(int fd, const void* data, size_t n, const std::vector<int>& fds);

// One recvmsg of at most `n` bytes (`flags` as for recvmsg, e.g. MSG_DONTWAIT); appends the
// descriptors that came with them to `fds` (at most 64 per call; more is truncation).
// `*truncated`: the message or its descriptors did not fit. Returns recvmsg's result (EINTR
// retried).
ssize_t RecvWithFds(int fd, void* buf, size_t n, int flags, std::vector<int>* fds, bool* truncated);

}  // namespace kvstream::transport::core
