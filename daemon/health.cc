#include "daemon/health.h"

#include <grpcpp/health_check_service_interface.h>

#include "common/log.h"
#include "common/time.h"
#include "daemon/signals.h"

namespace kvstream::daemon {

Health::~Health() { Shutdown(); }

void Health::Attach(grpc::Server* server) {
  std::lock_guard<std::mutex> lock(mu_);
  servers_.push_back(server);
  PublishLocked();
}

Status Health::StartListener(const std::string& listen, const ServerLimits& limits, int* port) {
  *port = 0;
  if (listen.empty()) return OkStatus();
  // A server with no service of its own: the default health check service alone.
  KV_ASSIGN_OR_RETURN(std::unique_ptr<grpc::Server> server, StartGrpcServer(listen, {}, port, limits));
  std::lock_guard<std::mutex> lock(mu_);
  listener_ = std::move(server);
  servers_.push_back(listener_.get());
  PublishLocked();
  return OkStatus();
}

void Health::SetReady(bool ready) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ready == ready_) return;
  ready_ = ready;
  if (!draining_) {
    KV_LOG_INFO << "health: " << service_ << (ready ? " SERVING" : " NOT_SERVING");
  }
  PublishLocked();
}

void Health::Draining() {
  std::lock_guard<std::mutex> lock(mu_);
  draining_ = true;
  PublishLocked();
}

bool Health::serving() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ready_ && !draining_;
}

void Health::PublishLocked() {
  for (grpc::Server* s : servers_) {
    grpc::HealthCheckServiceInterface* h = s->GetHealthCheckService();
    if (h == nullptr) continue;
    h->SetServingStatus("", true);
    h->SetServingStatus(service_, ready_ && !draining_);
  }
}

void Health::Shutdown() {
  std::unique_ptr<grpc::Server> listener;
  {
    std::lock_guard<std::mutex> lock(mu_);
    servers_.clear();
    listener = std::move(listener_);
  }
  if (listener) {
    listener->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    listener->Wait();
  }
}

Status StartHealth(const DaemonConfig& cfg, grpc::Server* server, Health* health) {
  health->Attach(server);
  int port = 0;
  KV_RETURN_IF_ERROR(health->StartListener(cfg.health_listen, ServerLimitsFromConfig(cfg), &port)
                         .WithContext("health_listen"));
  if (port != 0) {
    KV_LOG_INFO << "health-only listener (grpc.health.v1, plaintext) on port " << port;
  }
  return WritePortFile(cfg.health_port_file, port);
}

bool Drain(const std::string& role, Health* health, const DrainSteps& steps) {
  health->Draining();
  KV_LOG_INFO << "kvstream-" << role << " draining: NOT_SERVING; admitting for another "
              << steps.delay_ms << " ms, then up to " << steps.grace_ms
              << " ms for the requests in flight (a second signal stops at once)";
  if (int sig = WaitForTerminationSignalFor(steps.delay_ms); sig != 0) {
    KV_LOG_WARN << "signal " << sig << " while draining: stopping at once";
    return false;
  }
  steps.stop_admitting();
  const Deadline grace = DeadlineAfterMs(steps.grace_ms);
  int left = steps.in_flight();
  KV_LOG_INFO << "not admitting any more; " << left << " in flight";
  while (left > 0) {
    if (Clock::now() >= grace) {
      KV_LOG_WARN << "drain grace period (" << steps.grace_ms << " ms) over with " << left
                  << " in flight: cancelling them";
      return false;
    }
    const int64_t wait_ms = std::min<int64_t>(
        20, std::chrono::duration_cast<std::chrono::milliseconds>(grace - Clock::now()).count() + 1);
    if (int sig = WaitForTerminationSignalFor(wait_ms); sig != 0) {
      KV_LOG_WARN << "signal " << sig << " while draining: cancelling " << left
                  << " in flight at once";
      return false;
    }
    left = steps.in_flight();
  }
  KV_LOG_INFO << "drained: nothing in flight";
  return true;
}

}  // namespace kvstream::daemon
