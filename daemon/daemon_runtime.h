// What both daemons do around their service: parse the config, load the model and pool, create
// the transport, and run a gRPC server with the health service (signals: daemon/signals.h).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/status.h"
#include "daemon/daemon_config.h"
#include "model/backend.h"
#include "transport/transport.h"

namespace kvstream::daemon {

struct ServingModel {
  std::unique_ptr<model::ModelBackend> backend;
  std::unique_ptr<model::KvPool> pool;
};

model::ModelSpec ModelSpecFromConfig(const DaemonConfig& cfg);
Result<ServingModel> LoadServingModel(const DaemonConfig& cfg);
// With cfg.pool_gpu_fraction > 0 (cuda backend) the pool gets that fraction of the device's free
// memory, measured after the weights are loaded; kNotSupported in a build without CUDA.
Result<int> PoolBlocksFromGpuFraction(const DaemonConfig& cfg, const model::KvLayout& layout);
// The backend name CreateTransportFromConfig uses: cfg.transport, except "ucx" with a cuda
// backend, which becomes transport::ResolveBackend's choice for CUDA memory ("ucx" or
// "ucx_staged").
Result<std::string> ResolveTransportBackend(const DaemonConfig& cfg);

// The compute device's identity for the handshake: "GPU-<uuid>" of cfg.device for the cuda
// backend (the same string in every process that uses that GPU), empty for the CPU backend or
// when the device cannot be queried.
std::string ComputeDeviceId(const DaemonConfig& cfg);
// True when this process's contexts on cfg.device are shared through an MPS server (CUDA's
// cudaDevAttrMpsEnabled, attribute 133; false for the CPU backend, when the device cannot be
// queried, or when the driver does not know the attribute).
bool ComputeDeviceSharedViaMps(const DaemonConfig& cfg);
// role "prefill" (the writer) or "decode": on the decode itl_target_ms is the join budget
// (decode/join_budget.h), not a pacing rate, so it does not reach the transport there.
Result<std::unique_ptr<transport::Transport>> CreateTransportFromConfig(const DaemonConfig& cfg,
                                                                        const std::string& role);

// The start of a daemon's main(): parses argv for `role` ("prefill" or "decode"), prints --help
// (exit code 0) or the error and usage (exit code 2), applies log_level and logs the resolved
// config. Returns the config, or nullopt with *exit_code set.
std::optional<DaemonConfig> StartDaemon(int argc, char** argv, const std::string& role,
                                        int* exit_code);
// Logs a fatal start-up error as "kvstream-<role>: ..." and returns the process exit code
// (2 for kInvalidArgument, else 1).
int DaemonFailure(const std::string& role, const Status& status);

// Limits of a gRPC server (the DaemonConfig keys of the same names; 0 = gRPC's default).
struct ServerLimits {
  int max_concurrent_streams = 0;           // calls at once on one connection
  int64_t max_connection_idle_ms = 0;       // a connection without calls is closed after this
  int64_t connection_setup_timeout_ms = 0;  // a new connection's HTTP/2 (and TLS) setup
  int64_t max_connection_age_ms = 0;        // then GOAWAY (calls in flight go on); 0 = never
};
ServerLimits ServerLimitsFromConfig(const DaemonConfig& cfg);

// `listen` as the one address to bind: "host:port" with a host name becomes its first IPv4
// address (else its first address), so exactly one listener opens; numeric addresses, wildcards
// and URIs with a scheme ("unix:...") are returned unchanged. kInvalidArgument when the name
// does not resolve or the port is missing.
Result<std::string> ResolveListenAddress(const std::string& listen);

// Builds and starts a server with the standard gRPC health service enabled, listening on
// ResolveListenAddress(listen) only, without SO_REUSEPORT: a port another socket holds is
// refused (kUnavailable naming the address and the bind error). *port gets the bound port (the
// listen address may ask for port 0). With no `services` the server serves health alone.
// `credentials`: the listener's (Security::server_credentials, daemon/credentials.h); null =
// plaintext.
Result<std::unique_ptr<grpc::Server>> StartGrpcServer(
    const std::string& listen, const std::vector<grpc::Service*>& services, int* port,
    const ServerLimits& limits = ServerLimits(),
    std::shared_ptr<grpc::ServerCredentials> credentials = nullptr);
// Written atomically (temp file + rename) so a reader never sees a partial port.
Status WritePortFile(const std::string& path, int port);

}  // namespace kvstream::daemon
