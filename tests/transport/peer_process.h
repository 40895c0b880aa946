// A child process running tests/transport/transport_peer.cc (fork + exec), talked to over
// its stdin / stdout with line-based messages, every read bounded by a deadline.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/time.h"

namespace kvstream::transport::test {

class PeerProcess {
 public:
  // argv[0] is the program path.
  bool Start(const std::vector<std::string>& argv) {
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) return false;
    pid_ = fork();
    if (pid_ < 0) return false;
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
      dup2(in[0], 0);
      dup2(out[1], 1);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_child_ = in[1];
    from_child_ = out[0];
    return true;
  }

  ~PeerProcess() {
    if (to_child_ >= 0) close(to_child_);  // EOF on stdin: the peer exits
    if (pid_ > 0 && !reaped_) {
      auto deadline = DeadlineAfterMs(3000);
      while (!Expired(deadline) && !TryReap()) usleep(10000);
      if (!reaped_) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
      }
    }
    if (from_child_ >= 0) close(from_child_);
  }

  // Next line from the child, without the newline; false at EOF or deadline.
  bool ReadLine(std::string* line, Deadline deadline) {
    for (;;) {
      size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        *line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return true;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      pollfd p{from_child_, POLLIN, 0};
      int r = poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
      if (r <= 0) {
        if (Expired(deadline)) return false;
        continue;
      }
      char tmp[4096];
      ssize_t n = read(from_child_, tmp, sizeof(tmp));
      if (n <= 0) return false;
      buf_.append(tmp, static_cast<size_t>(n));
    }
  }

  bool WriteLine(const std::string& line) {
    std::string s = line + "\n";
    return write(to_child_, s.data(), s.size()) == static_cast<ssize_t>(s.size());
  }

  void Kill() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      reaped_ = true;
    }
  }
  void Signal(int sig) {
    if (pid_ > 0 && !reaped_) kill(pid_, sig);
  }
  pid_t pid() const { return pid_; }

 private:
  bool TryReap() {
    if (waitpid(pid_, nullptr, WNOHANG) == pid_) reaped_ = true;
    return reaped_;
  }
  pid_t pid_ = -1;
  bool reaped_ = false;
  int to_child_ = -1;
  int from_child_ = -1;
  std::string buf_;
};

}  // namespace kvstream::transport::test
