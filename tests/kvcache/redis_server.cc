#include "tests/kvcache/redis_server.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

extern char** environ;

namespace kvstream::kvcache::testing {
namespace {

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "redis test server: %s\n", why.c_str());
  std::abort();
}

bool Answers(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

RedisServer::RedisServer(std::string password, std::vector<std::string> extra)
    : password_(std::move(password)), extra_(std::move(extra)) {
  char tmpl[] = "/tmp/kvstream-redis-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) Die("mkdtemp failed");
  dir_ = tmpl;
  socket_ = dir_ + "/redis.sock";
  Start();
}

RedisServer::~RedisServer() {
  Kill();
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

void RedisServer::Start() {
  std::vector<std::string> args = {"redis-server", "--port", "0", "--unixsocket", socket_,
                                   "--unixsocketperm", "700", "--save", "", "--appendonly", "no",
                                   "--dir", dir_, "--daemonize", "no", "--loglevel", "warning"};
  if (!password_.empty()) args.insert(args.end(), {"--requirepass", password_});
  args.insert(args.end(), extra_.begin(), extra_.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string log = dir_ + "/redis.log";
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  const int rc = posix_spawnp(&pid_, "redis-server", &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0)
    Die(std::string("cannot run redis-server (scripts/install-deps.sh installs it): ") +
        std::strerror(rc));
  stopped_ = false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!Answers(socket_)) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      std::ifstream in(log);
      std::string text((std::istreambuf_iterator<char>(in)), {});
      Die("redis-server exited at start: " + text);
    }
    if (std::chrono::steady_clock::now() > until) Die("redis-server did not open " + socket_);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string RedisServer::AuthFile(const std::string& password, const std::string& user) const {
  static int n = 0;
  const std::string path = dir_ + "/auth" + std::to_string(n++);
  std::ofstream(path) << (user.empty() ? "" : user + "\n") << password << "\n";
  ::chmod(path.c_str(), 0600);
  return path;
}

void RedisServer::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  ::unlink(socket_.c_str());
}

void RedisServer::Restart() {
  Kill();
  Start();
}

void RedisServer::Stop() {
  if (pid_ > 0) ::kill(pid_, SIGSTOP);
  stopped_ = true;
}

void RedisServer::Cont() {
  if (pid_ > 0) ::kill(pid_, SIGCONT);
  stopped_ = false;
}

std::string RedisServer::Cli(const std::vector<std::string>& args) const {
  std::string cmd = "redis-cli --no-auth-warning -s '" + socket_ + "'";
  if (!password_.empty()) cmd += " -a '" + password_ + "'";
  for (const auto& a : args) cmd += " '" + a + "'";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) Die("popen redis-cli");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

}  // namespace kvstream::kvcache::testing
