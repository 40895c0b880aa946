// Test harness: spawns the real kvstream-prefill / kvstream-decode binaries as child processes
// on loopback, waits for their port files, talks to them over real gRPC.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/status.h"
#include "common/time.h"
#include "proto/kvstream.grpc.pb.h"

namespace kvstream::testing {

// A scratch directory removed with its contents at destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A TCP port that was free a moment ago (for daemons that must come back on the same port),
// picked below the kernel's ephemeral port range so no bind(0) or outgoing connection on the
// host takes it before the daemon binds it.
int PickFreePort();

class DaemonProcess {
 public:
  // `binary` with `args`; stderr+stdout go to <dir>/<name>.log. `prefix` (e.g. {"ip", "netns",
  // "exec", "ns1"}) is prepended to the command line.
  DaemonProcess(std::string name, std::string binary, std::vector<std::string> args,
                std::string dir, std::vector<std::string> prefix = {});
  ~DaemonProcess();  // SIGKILL if still running

  Status Start(Deadline ready_deadline);  // Spawn() + WaitReady()
  Status Spawn();
  Status WaitReady(Deadline ready_deadline);  // waits for the port file
  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  pid_t pid() const { return pid_; }
  void Signal(int sig);
  // Waits for exit; returns the exit code (128 + signal if killed), or -1 at the deadline.
  int Wait(Deadline deadline);
  bool Running();
  std::string Log() const;

 private:
  std::string name_, binary_, dir_;
  std::vector<std::string> args_, prefix_;
  std::string port_file_;
  pid_t pid_ = -1;
  int port_ = 0;
  int exit_code_ = -1;
};

// A client of both daemons.
struct GenerateResult {
  grpc::Status status;
  std::vector<int32_t> tokens;
  std::vector<kvstream::v1::GenerateResponse> messages;
  double ttft_s = 0;
  double total_s = 0;
};

GenerateResult CallGenerate(kvstream::v1::Decode::Stub& stub, const std::vector<int32_t>& prompt,
                            int max_tokens, kvstream::v1::LoadMode mode, int deadline_ms);
GenerateResult CallGenerate(kvstream::v1::Decode::Stub& stub,
                            const kvstream::v1::GenerateRequest& req, int deadline_ms);

template <typename Stub>
Result<kvstream::v1::StatsResponse> CallStats(Stub& stub, int deadline_ms = 5000) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
  kvstream::v1::StatsResponse resp;
  grpc::Status s = stub.Stats(&ctx, kvstream::v1::StatsRequest(), &resp);
  if (!s.ok()) return Unavailable("Stats: " + s.error_message());
  return resp;
}

std::unique_ptr<kvstream::v1::Decode::Stub> DecodeStub(const std::string& address);
std::unique_ptr<kvstream::v1::Prefill::Stub> PrefillStub(const std::string& address);

// Polls Stats until every block of the pool is free (and nothing is in flight).
Status WaitForAllBlocksFree(const std::string& address, bool decode, Deadline deadline);
// WaitForAllBlocksFree, then the pool's blocks still not free (0 when all came back; -1 when
// the daemon did not answer Stats).
int BlocksNotFree(const std::string& address, bool decode, Deadline deadline);

// Deterministic prompt of n token ids in [0, vocab).
std::vector<int32_t> MakePrompt(int n, int vocab, uint64_t seed);

}  // namespace kvstream::testing
