// The UCX backend's same-host gate (transport/ucx/): how a writer on this host proves which
// process the receiver is and learns which memory that process registered, before it copies
// into that memory directly (process_vm_writev, or stores into the receiver's memfd).
//
// The receiver listens on a filesystem Unix socket in a private directory (mode 0700, the
// socket 0600; never an abstract socket, which has no permissions) and publishes its path and a
// random 128-bit token in its transport address, a new token for each address it hands out
// (each handshake). A writer connects, the kernel tells each side who the other is
// (SO_PEERCRED), and:
//  - the receiver answers only a process of its own uid that presents a token it issued and
//    that nobody presented before (so only the writer that got the address through that
//    handshake, once; a token never presented expires after 10 minutes, and at most 256 wait:
//    issuing one more retires the oldest), with the ranges it registered (host
//    memory only) and, for ranges backed by a memfd, the memfd itself (SCM_RIGHTS): the
//    descriptor is the capability, nothing is opened by name;
//  - the writer takes the receiver's pid from the kernel, never from a message, and holds a
//    pidfd on it that it opened while the connection was still up (so a pid reused after the
//    receiver exited is never written to).
// Anything else (no socket, another uid, a wrong token, a malformed answer) means no shortcut:
// the writer falls back to UCX puts. Every socket call is bounded (1 s).
#pragma once

#include <sys/types.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "transport/core/peer_process.h"
#include "transport/core/private_socket.h"

namespace kvstream::transport::ucx {

using GateToken = core::Token;

// Receiver side: the socket, its accept thread and the registry of what may be granted.
class SameHostGate {
 public:
  // Creates the private directory and socket under $TMPDIR (else /tmp) and starts serving.
  // Removes first the gate directories there of this uid's processes that died without removing
  // theirs (socket over a minute old, nothing listening).
  static Result<std::unique_ptr<SameHostGate>> Create();
  ~SameHostGate();  // stops serving, removes the socket and its directory
  SameHostGate(const SameHostGate&) = delete;
  SameHostGate& operator=(const SameHostGate&) = delete;

  const std::string& path() const { return path_; }
  // A new token for one writer: good for one hello within `kTokenLifetime`.
  Result<GateToken> Issue();
  static constexpr std::chrono::minutes kTokenLifetime{10};
  static constexpr size_t kMaxWaitingTokens = 256;
  // Registered host memory a writer may be granted (`memfd` < 0: none; not owned: the caller
  // keeps it open until Remove(key) has returned).
  void Add(const void* key, uint64_t addr, uint64_t length, int memfd);
  void Remove(const void* key);

 private:
  SameHostGate() = default;
  void Loop();
  void Serve(int fd);
  // True when `token` was issued, unused and unexpired; it is used up either way.
  bool TakeToken(const uint8_t* token);

  std::unique_ptr<core::PrivateListener> listener_;
  std::string path_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
  struct Range {
    uint64_t addr, length;
    int memfd;
  };
  std::mutex mu_;
  std::map<const void*, Range> ranges_;
  struct Issued {
    GateToken token;
    std::chrono::steady_clock::time_point expires;
  };
  std::deque<Issued> issued_;  // oldest first
};

// Writer side: what a receiver proved and granted.
struct GrantedRange {
  uint64_t addr = 0;
  uint64_t length = 0;
  int fd = -1;  // owned by the PeerGrant; -1 = registered memory without a memfd
};
struct PeerGrant {
  pid_t pid = 0;                        // from SO_PEERCRED
  internal::PeerProcess process;        // a pidfd on it, opened while it was connected
  std::vector<GrantedRange> ranges;
  PeerGrant() = default;
  PeerGrant(PeerGrant&&) noexcept;
  PeerGrant& operator=(PeerGrant&&) = delete;
  ~PeerGrant();
  // The range that holds [addr, addr + length), or nullptr.
  const GrantedRange* Covering(uint64_t addr, uint64_t length) const;
};

// Connects to the gate at `path` and presents `token`. kUnavailable (with why) when there is no
// shortcut to that receiver; never throws, never blocks past ~2 s.
Result<PeerGrant> JoinGate(const std::string& path, const GateToken& token);

}  // namespace kvstream::transport::ucx
