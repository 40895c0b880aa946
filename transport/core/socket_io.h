// Blocking-socket helpers the backends' control channels share (cuda_ipc's notification socket,
// nccl's control socket): whole writes, non-blocking drains and bounded waits for input. No
// framing: each backend's wire file says what the bytes are.
//
// Guarantees:
//  - SendAll never raises SIGPIPE (MSG_NOSIGNAL) and retries EINTR; on false errno says why.
//  - ReadAvailable never blocks.
//  - WaitReadable never waits past `deadline`, nor longer than `slice_ms` at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

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

}  // namespace kvstream::transport::core
