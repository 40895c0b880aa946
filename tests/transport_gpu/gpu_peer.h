// Test support for the GPU transport tests: a peer process (this binary re-executed in a helper
// mode) spoken to over its stdin/stdout, and the deterministic block plans and byte patterns
// both processes derive from (request id, layer) so that the receiver can check what landed
// without being told.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/time.h"

namespace kvstream::testing {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Content of destination block `dst_block` for write (request, layer): 64-bit words.
inline void FillPattern(uint64_t request, int layer, uint64_t dst_block, uint64_t* words,
                        size_t nwords) {
  const uint64_t seed = SplitMix64(request * 131 + static_cast<uint64_t>(layer)) ^ (dst_block << 24);
  for (size_t i = 0; i < nwords; ++i) words[i] = SplitMix64(seed + i);
}

// `count` distinct destination blocks out of `pool_blocks`, random but fixed by (request, layer),
// taken only among blocks of class `phase` out of `classes` (groups of 8 neighbouring blocks
// take turns: class(b) = (b / 8) % classes), so that writes of different classes never touch
// each other's blocks. Every fourth pick is followed by its neighbour when that is free and of
// the same class, so that some runs are contiguous on both sides.
inline uint64_t BlockClass(uint64_t b, uint64_t classes) { return (b / 8) % classes; }
inline std::vector<uint64_t> PlanBlocks(uint64_t request, int layer, uint64_t pool_blocks,
                                        size_t count, uint64_t classes = 1, uint64_t phase = 0) {
  std::mt19937_64 rng(SplitMix64(request ^ (static_cast<uint64_t>(layer) << 40)));
  std::vector<uint64_t> ids;
  for (uint64_t i = 0; i < pool_blocks; ++i) {
    if (BlockClass(i, classes) == phase) ids.push_back(i);
  }
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<char> used(pool_blocks, 0);
  std::vector<uint64_t> out;
  for (size_t i = 0; i < ids.size() && out.size() < count; ++i) {
    uint64_t b = ids[i];
    if (used[b]) continue;
    used[b] = 1;
    out.push_back(b);
    const uint64_t next = b + 1;
    if (out.size() % 4 == 0 && next < pool_blocks && BlockClass(next, classes) == phase &&
        !used[next] && out.size() < count) {
      used[next] = 1;
      out.push_back(next);
    }
  }
  return out;
}

// A child process running this binary with extra arguments; its stdin and stdout are pipes.
class PeerProcess {
 public:
  PeerProcess() = default;
  ~PeerProcess() { Kill(); }
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;

  bool Start(const std::vector<std::string>& args) {
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) return false;
    pid_ = fork();
    if (pid_ < 0) return false;
    if (pid_ == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      std::vector<char*> argv;
      static char self[] = "/proc/self/exe";
      argv.push_back(self);
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv("/proc/self/exe", argv.data());
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_child_ = in[1];
    from_child_ = out[0];
    return true;
  }

  bool Send(const std::string& line) {
    std::string l = line + "\n";
    return write(to_child_, l.data(), l.size()) == static_cast<ssize_t>(l.size());
  }

  // Next line from the child's stdout; empty on EOF or deadline.
  std::string ReadLine(Deadline deadline) {
    for (;;) {
      size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return "";
      pollfd p{from_child_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char tmp[4096];
      ssize_t r = read(from_child_, tmp, sizeof(tmp));
      if (r <= 0) return "";
      buf_.append(tmp, static_cast<size_t>(r));
    }
  }

  void Kill() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
    CloseFds();
  }

  // Closes the child's stdin (its signal to exit) and reaps it; kills it after the deadline.
  int Finish(Deadline deadline) {
    if (to_child_ >= 0) {
      close(to_child_);
      to_child_ = -1;
    }
    int status = 0;
    while (pid_ > 0) {
      pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        break;
      }
      if (Expired(deadline)) {
        Kill();
        return -1;
      }
      usleep(10000);
    }
    CloseFds();
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  pid_t pid() const { return pid_; }

 private:
  void CloseFds() {
    if (to_child_ >= 0) close(to_child_);
    if (from_child_ >= 0) close(from_child_);
    to_child_ = from_child_ = -1;
  }
  pid_t pid_ = -1;
  int to_child_ = -1;
  int from_child_ = -1;
  std::string buf_;
};

inline std::string ToHex(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string out;
  out.reserve(s.size() * 2);
  for (unsigned char c : s) {
    out.push_back(d[c >> 4]);
    out.push_back(d[c & 15]);
  }
  return out;
}

inline std::string FromHex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  }
  return out;
}

}  // namespace kvstream::testing
