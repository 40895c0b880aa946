// Same-host sockets only this user can reach (the UCX same-host gate, cuda_ipc's notification
// socket): a filesystem Unix socket, mode 0600, in a private directory of mode 0700 made by
// mkdtemp under $TMPDIR (else /tmp); never an abstract socket, which has no permissions. The
// kernel names each side to the other (SO_PEERCRED): a peer of another uid is refused.
//
// Guarantees:
//  - PrivateListener::Create removes first the directories of this prefix that this uid's
//    processes left behind when they died (socket over a minute old, nothing listening); the
//    listener's destructor closes the socket and removes the socket file and its directory.
//  - SameUserPeer fails for a peer of another uid and for a socket the kernel names no process
//    behind.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "common/time.h"

namespace kvstream::transport::core {

class PrivateListener {
 public:
  // `prefix`: the directory's name before mkdtemp's suffix ("kvstream-ucx"); `name`: the
  // socket file's in it; `type`: SOCK_STREAM or SOCK_SEQPACKET (close-on-exec is added, and
  // non-blocking where asked). The socket is listening when this returns.
  static Result<std::unique_ptr<PrivateListener>> Create(const std::string& prefix,
                                                         const std::string& name, int type,
                                                         bool nonblocking = false);
  ~PrivateListener();
  PrivateListener(const PrivateListener&) = delete;
  PrivateListener& operator=(const PrivateListener&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }  // the socket file

 private:
  PrivateListener() = default;
  std::string dir_, path_;
  int fd_ = -1;
};

// The process at the other end of a connected Unix socket, as the kernel reports it.
// kFailedPrecondition when it runs under another uid, kUnavailable when the kernel names none.
Result<ucred> SameUserPeer(int fd);

// Connects a socket of `type` to the filesystem socket `path` (absolute), whose listener must
// run under this uid (kFailedPrecondition otherwise). A full backlog is retried until `deadline`.
// Returns the connected descriptor (close-on-exec; the caller closes it).
Result<int> ConnectPrivate(const std::string& path, int type, Deadline deadline);

// A 128-bit random token (getrandom) and its constant-time comparison.
using Token = std::array<uint8_t, 16>;
Result<Token> NewToken();
bool SameToken(const uint8_t* a, const uint8_t* b);

}  // namespace kvstream::transport::core
