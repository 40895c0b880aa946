// A real redis-server for the L4 tier's tests: a unix socket in a fresh temporary directory,
// --requirepass, no persistence. Kill/Stop/Cont/Restart for the fault tests.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace kvstream::kvcache::testing {

class RedisServer {
 public:
  // Starts and waits until it answers on its socket; aborts the test program if it cannot.
  // An empty password runs without requirepass; `extra` is appended to the command line.
  explicit RedisServer(std::string password = "kvstream-test-password",
                       std::vector<std::string> extra = {});
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  const std::string& socket() const { return socket_; }
  const std::string& dir() const { return dir_; }
  const std::string& password() const { return password_; }
  // A file (mode 0600) holding the password, or "user\npassword" when user is given.
  std::string AuthFile(const std::string& password, const std::string& user = "") const;
  void Kill();     // SIGKILL and reap
  void Restart();  // a new process on the same socket (the data is gone: no persistence)
  void Stop();     // SIGSTOP: the socket still accepts, nothing answers
  void Cont();
  // Runs one command with redis-cli (authenticated) and returns its output, trimmed.
  std::string Cli(const std::vector<std::string>& args) const;

 private:
  void Start();
  std::string dir_, socket_, password_;
  std::vector<std::string> extra_;
  pid_t pid_ = -1;
  bool stopped_ = false;
};

}  // namespace kvstream::kvcache::testing
