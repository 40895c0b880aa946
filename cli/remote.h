// Client side of the daemons for the kvstream CLI (built with KVSTREAM_WITH_DAEMONS).
//   kvstream generate --decode HOST:PORT ...   generation through a decode daemon
//   kvstream bench ttft --decode ... --prefill ...   TTFT/ITL benchmark (see cmd_bench.cc)
#pragma once

#include <span>
#include <string>
#include <vector>

#include "cli/flags.h"

#if KVSTREAM_CLI_HAVE_DAEMONS
#include <chrono>
#include <cstdint>

#include <grpcpp/grpcpp.h>

#include "common/status.h"
#include "connector/grpc_status.h"
#include "proto/kvstream.grpc.pb.h"
#endif

namespace kvstream::cli {

// --tls-ca, --tls-cert, --tls-key, --token-file: how a remote command authenticates.
std::vector<FlagSpec> AuthFlagSpecs();

// True when args ask for remote generation (a --decode flag).
bool WantsRemoteGenerate(std::span<const std::string> args);
int RunRemoteGenerate(std::span<const std::string> args);

#if KVSTREAM_CLI_HAVE_DAEMONS
// A channel to `address` with the credentials AuthFlagSpecs' flags name (plaintext and no token
// when none is given); unreadable files are kInvalidArgument naming the flag.
Result<std::shared_ptr<grpc::Channel>> RemoteChannel(const Flags& flags, const std::string& address);

// A daemon's Stats through `stub` (Decode or Prefill), bounded by deadline_ms; a failed call is
// its gRPC status as a Status, with `context` in front.
template <typename Stub>
Result<kvstream::v1::StatsResponse> FetchStats(Stub& stub, int64_t deadline_ms,
                                               const std::string& context) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
  kvstream::v1::StatsResponse r;
  grpc::Status s = stub.Stats(&ctx, kvstream::v1::StatsRequest(), &r);
  if (!s.ok()) return connector::FromGrpc(s).WithContext(context);
  return r;
}
#endif

}  // namespace kvstream::cli
