#include "transport/core/peer_process.h"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

namespace kvstream::transport::internal {

PeerProcess::PeerProcess(pid_t pid)
    : fd_(static_cast<int>(syscall(SYS_pidfd_open, pid, 0))), pid_(pid) {}

PeerProcess::~PeerProcess() {
  if (fd_ >= 0) close(fd_);
}

PeerProcess::PeerProcess(PeerProcess&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), pid_(std::exchange(other.pid_, 0)) {}

PeerProcess& PeerProcess::operator=(PeerProcess&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    pid_ = std::exchange(other.pid_, 0);
  }
  return *this;
}

bool PeerProcess::Exited() const {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

uint64_t ProcessStartTime(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return 0;
  size_t close_paren = line.rfind(')');  // the command name may hold spaces
  if (close_paren == std::string::npos) return 0;
  std::istringstream in(line.substr(close_paren + 2));
  std::string field;
  for (int i = 3; i <= 22 && (in >> field); ++i) {
    if (i == 22) return std::strtoull(field.c_str(), nullptr, 10);
  }
  return 0;
}

}  // namespace kvstream::transport::internal
