// Peer liveness on this host, shared by the backends that copy into a same-host peer's memory
// or hand memory to a same-host peer (not part of the public API).
#pragma once

#include <sys/types.h>

#include <cstdint>

namespace kvstream::transport::internal {

// A process on this host watched through a pidfd (closed on destruction). Invalid (and
// Exited() false) when the process cannot be opened: gone already, or pidfd_open unavailable.
class PeerProcess {
 public:
  PeerProcess() = default;
  explicit PeerProcess(pid_t pid);
  ~PeerProcess();
  PeerProcess(PeerProcess&& other) noexcept;
  PeerProcess& operator=(PeerProcess&& other) noexcept;
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;

  bool valid() const { return fd_ >= 0; }
  pid_t pid() const { return pid_; }
  // True once the process has exited (never blocks).
  bool Exited() const;

 private:
  int fd_ = -1;
  pid_t pid_ = 0;
};

// Field 22 of /proc/<pid>/stat (start time since boot, in clock ticks): tells a reused pid
// apart from the process that published it. 0 when unreadable.
uint64_t ProcessStartTime(pid_t pid);

}  // namespace kvstream::transport::internal
