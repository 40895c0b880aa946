#include "tests/daemons/daemon_harness.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

extern char** environ;

namespace kvstream::testing {

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "kvstream-test-XXXXXX").string();
  char* p = mkdtemp(tmpl.data());
  path_ = p ? p : "/tmp";
}

TempDir::~TempDir() {
  if (std::getenv("KVSTREAM_KEEP_TEST_DIRS")) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

namespace {
// True if a TCP socket could bind 127.0.0.1:port just now (0: any port; *port gets it).
bool BindsNow(int* port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(*port));
  bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  socklen_t len = sizeof(addr);
  if (ok && getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) *port = ntohs(addr.sin_port);
  close(fd);
  return ok;
}
}  // namespace

int PickFreePort() {
  // Below the kernel's ephemeral range: a port from bind(0) or an outgoing connection (of any
  // daemon or test running beside this one) can never take it between now and the daemon's
  // bind; only another test's pick could, one in thousands.
  int lo = 32768;
  if (std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range"); range) range >> lo;
  if (lo > 11000) {
    std::mt19937 rng(static_cast<unsigned>(getpid()) * 2654435761u ^
                     static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
    std::uniform_int_distribution<int> pick(10000, lo - 1);
    for (int attempt = 0; attempt < 64; ++attempt) {
      int port = pick(rng);
      if (BindsNow(&port)) return port;
    }
  }
  int port = 0;
  BindsNow(&port);
  return port;
}

DaemonProcess::DaemonProcess(std::string name, std::string binary, std::vector<std::string> args,
                             std::string dir, std::vector<std::string> prefix)
    : name_(std::move(name)), binary_(std::move(binary)), dir_(std::move(dir)),
      args_(std::move(args)), prefix_(std::move(prefix)) {
  port_file_ = dir_ + "/" + name_ + ".port";
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0 && exit_code_ < 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

Status DaemonProcess::Start(Deadline ready_deadline) {
  KV_RETURN_IF_ERROR(Spawn());
  return WaitReady(ready_deadline);
}

Status DaemonProcess::Spawn() {
  std::filesystem::remove(port_file_);
  std::vector<std::string> argv_s = prefix_;
  argv_s.push_back(binary_);
  for (const auto& a : args_) argv_s.push_back(a);
  argv_s.push_back("--port_file=" + port_file_);
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::string log = dir_ + "/" + name_ + ".log";
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  exit_code_ = -1;
  int rc = posix_spawnp(&pid_, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return Internal("cannot spawn " + binary_ + ": " + std::to_string(rc));
  return OkStatus();
}

Status DaemonProcess::WaitReady(Deadline ready_deadline) {
  while (Clock::now() < ready_deadline) {
    std::ifstream in(port_file_);
    if (in >> port_) return OkStatus();
    if (!Running())
      return Unavailable(name_ + " exited with " + std::to_string(exit_code_) + " before serving:\n" + Log());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return Timeout(name_ + " did not start serving in time:\n" + Log());
}

void DaemonProcess::Signal(int sig) {
  if (pid_ > 0 && exit_code_ < 0) kill(pid_, sig);
}

bool DaemonProcess::Running() {
  if (pid_ <= 0 || exit_code_ >= 0) return false;
  int st = 0;
  pid_t r = waitpid(pid_, &st, WNOHANG);
  if (r == pid_) {
    exit_code_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return false;
  }
  return true;
}

int DaemonProcess::Wait(Deadline deadline) {
  while (Running()) {
    if (Clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return exit_code_;
}

std::string DaemonProcess::Log() const {
  std::ifstream in(dir_ + "/" + name_ + ".log");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

GenerateResult CallGenerate(kvstream::v1::Decode::Stub& stub, const std::vector<int32_t>& prompt,
                            int max_tokens, kvstream::v1::LoadMode mode, int deadline_ms) {
  kvstream::v1::GenerateRequest req;
  *req.mutable_prompt_tokens() = {prompt.begin(), prompt.end()};
  req.set_max_tokens(max_tokens);
  req.set_load_mode(mode);
  return CallGenerate(stub, req, deadline_ms);
}

GenerateResult CallGenerate(kvstream::v1::Decode::Stub& stub,
                            const kvstream::v1::GenerateRequest& req, int deadline_ms) {
  GenerateResult r;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
  auto start = Clock::now();
  auto reader = stub.Generate(&ctx, req);
  kvstream::v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    if (r.tokens.empty()) r.ttft_s = SecondsSince(start);
    r.tokens.push_back(msg.token_id());
    r.messages.push_back(msg);
  }
  r.status = reader->Finish();
  r.total_s = SecondsSince(start);
  return r;
}

std::unique_ptr<kvstream::v1::Decode::Stub> DecodeStub(const std::string& address) {
  return kvstream::v1::Decode::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

std::unique_ptr<kvstream::v1::Prefill::Stub> PrefillStub(const std::string& address) {
  return kvstream::v1::Prefill::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

Status WaitForAllBlocksFree(const std::string& address, bool decode, Deadline deadline) {
  auto dstub = DecodeStub(address);
  auto pstub = PrefillStub(address);
  std::string last = "no answer";
  while (Clock::now() < deadline) {
    auto st = decode ? CallStats(*dstub) : CallStats(*pstub);
    if (st.ok()) {
      if (st->pool().free_blocks() == st->pool().num_blocks() && st->requests_in_flight() == 0)
        return OkStatus();
      last = std::to_string(st->pool().free_blocks()) + "/" +
             std::to_string(st->pool().num_blocks()) + " free, " +
             std::to_string(st->requests_in_flight()) + " in flight";
    } else {
      last = st.status().ToString();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return Timeout(std::string(decode ? "decode" : "prefill") + " pool not fully free: " + last);
}

int BlocksNotFree(const std::string& address, bool decode, Deadline deadline) {
  if (WaitForAllBlocksFree(address, decode, deadline).ok()) return 0;
  auto dstub = DecodeStub(address);
  auto pstub = PrefillStub(address);
  auto st = decode ? CallStats(*dstub) : CallStats(*pstub);
  if (!st.ok()) return -1;
  return st->pool().num_blocks() - st->pool().free_blocks();
}

std::vector<int32_t> MakePrompt(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> p(n);
  for (auto& t : p) t = static_cast<int32_t>(rng() % vocab);
  return p;
}

}  // namespace kvstream::testing
