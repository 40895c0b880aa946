// Health of a daemon per gRPC service name, on its gRPC server and on an optional plaintext
// health-only listener (config health_listen), and the drain that follows SIGTERM.
//
// Statuses (grpc.health.v1, the default health check service of each server):
//  - "" (the process): SERVING as long as the server serves - a liveness probe;
//  - the daemon's service ("kvstream.v1.Decode" / "kvstream.v1.Prefill"): SERVING only while
//    the daemon says it is ready (SetReady) and it is not draining - a readiness probe;
//  - any other name: NOT_FOUND.
// The health-only listener serves grpc.health.v1 and nothing else, without credentials, so that
// probes which cannot present a client certificate (Kubernetes' grpc probe) can ask it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/status.h"
#include "daemon/daemon_runtime.h"

namespace kvstream::daemon {

class Health {
 public:
  explicit Health(std::string service) : service_(std::move(service)) {}
  ~Health();

  // Publishes the statuses on `server`'s health service (the daemon's main server).
  void Attach(grpc::Server* server);
  // Starts the health-only listener on `listen` (ResolveListenAddress rules; empty = none);
  // *port gets its port (0 when there is none).
  Status StartListener(const std::string& listen, const ServerLimits& limits, int* port);
  // The service name's status; ignored once Draining() was called.
  void SetReady(bool ready);
  // The service name is NOT_SERVING from now on ("" stays SERVING).
  void Draining();
  bool serving() const;
  // Stops the health-only listener (its probes then fail to connect).
  void Shutdown();

 private:
  void PublishLocked();

  const std::string service_;
  mutable std::mutex mu_;
  bool ready_ = false;
  bool draining_ = false;
  std::vector<grpc::Server*> servers_;
  std::unique_ptr<grpc::Server> listener_;
};

// health->Attach(server), then the health-only listener of cfg.health_listen (its port written
// to cfg.health_port_file).
Status StartHealth(const DaemonConfig& cfg, grpc::Server* server, Health* health);

// What a daemon does between the first termination signal and its stop:
//   1. health.Draining() (readiness NOT_SERVING) and go on admitting for delay_ms, while load
//      balancers and endpoint lists notice;
//   2. stop_admitting(): new calls are refused with UNAVAILABLE;
//   3. wait until in_flight() is 0, for at most grace_ms.
// A second termination signal at any point ends the drain at once. Returns true when the drain
// ran to its end (nothing left in flight), false when the grace period passed or a second signal
// cut it short; the caller then cancels what is left.
struct DrainSteps {
  int64_t delay_ms = 0;
  int64_t grace_ms = 0;
  std::function<void()> stop_admitting;
  std::function<int()> in_flight;
};
bool Drain(const std::string& role, Health* health, const DrainSteps& steps);

}  // namespace kvstream::daemon
