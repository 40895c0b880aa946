// kvstream-prefill: computes prompts' KV and pushes it, layer by layer, into decode daemons' pools.
#include <cstdio>

#include "common/log.h"
#include "common/version.h"
#include "daemon/credentials.h"
#include "daemon/daemon_runtime.h"
#include "daemon/health.h"
#include "daemon/metrics.h"
#include "daemon/reflection.h"
#include "daemon/signals.h"
#include "connector/handshake.h"
#include "daemon/pool_tier.h"
#include "prefill/kv_tiers.h"
#include "prefill/prefill_server.h"

using namespace kvstream;

namespace {
int Fail(const Status& s) { return daemon::DaemonFailure("prefill", s); }
}  // namespace

int main(int argc, char** argv) {
  if (PrintVersionIfAsked(argc, argv, "kvstream-prefill")) return 0;
  daemon::BlockTerminationSignals();
  int exit_code = 0;
  auto cfg = daemon::StartDaemon(argc, argv, "prefill", &exit_code);
  if (!cfg) return exit_code;
  auto security = daemon::SecurityFromConfig(*cfg, "prefill");
  if (!security.ok()) return Fail(security.status());

  auto model = daemon::LoadServingModel(*cfg);
  if (!model.ok()) return Fail(model.status().WithContext("loading the model"));
  auto transport = daemon::CreateTransportFromConfig(*cfg, "prefill");
  if (!transport.ok()) return Fail(transport.status().WithContext("creating the transport"));
  auto conn = connector::PrefillConnector::Create(
      std::move(transport).value(), model->pool.get(),
      connector::MakeLayoutDescriptor(model->backend->config(), cfg->block_size));
  if (!conn.ok()) return Fail(conn.status().WithContext("creating the connector"));

  daemon::Health health("kvstream.v1.Prefill");
  prefill::PrefillServer service(*cfg, model->backend.get(), model->pool.get(), conn->get());
  service.set_authorizer(security->authorizer);
  auto pool_tier = daemon::CreatePoolTier(*cfg, model->pool.get());
  if (!pool_tier.ok()) return Fail(pool_tier.status().WithContext("opening the KV tiers"));
  // Below a GPU pool the disk and store tiers are staged through the pinned tier.
  auto tiers = prefill::CreateKvTiers(*cfg, model->backend->config(), model->pool.get(),
                                      pool_tier->get());
  if (!tiers.ok()) return Fail(tiers.status().WithContext("opening the KV tiers"));
  service.set_kv_tiers(std::move(tiers).value());
  service.set_pool_tier(std::move(pool_tier).value());
  auto registry = std::make_shared<daemon::MetricsRegistry>();
  if (!cfg->metrics.empty()) service.EnableMetrics(registry.get());
  daemon::ReflectionService reflection({v1::Prefill::service_full_name()}, security->authorizer);
  int port = 0;
  auto server = daemon::StartGrpcServer(cfg->listen, {&service, &reflection}, &port,
                                        daemon::ServerLimitsFromConfig(*cfg),
                                        security->server_credentials);
  if (!server.ok()) return Fail(server.status());
  if (Status s = daemon::StartHealth(*cfg, server->get(), &health); !s.ok()) return Fail(s);
  health.SetReady(true);
  auto metrics = daemon::StartMetricsEndpoint(*cfg, *security, registry);
  if (!metrics.ok()) return Fail(metrics.status());
  if (Status s = daemon::WritePortFile(cfg->port_file, port); !s.ok()) return Fail(s);
  KV_LOG_INFO << "kvstream-prefill " << service.instance_id() << " serving on port " << port
              << " (model " << model->backend->config().name << ", "
              << model->backend->config().num_layers << " layers, backend "
              << model->backend->name() << ", pool " << cfg->pool_blocks << " blocks, transport "
              << (*conn)->transport().name() << ")";

  int sig = daemon::WaitForTerminationSignal();
  KV_LOG_INFO << "signal " << sig << ": draining";
  daemon::Drain("prefill", &health, {cfg->drain_delay_ms, cfg->drain_grace_ms,
                                   [&] { service.StopAdmitting(); },
                                   [&] { return service.in_flight(); }});
  KV_LOG_INFO << "shutting down";
  service.BeginShutdown();
  health.Shutdown();
  (*server)->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  (*server)->Wait();
  metrics->reset();  // its scrapes read the service and the connectors
  conn->reset();
  int free_blocks = model->pool->allocator().free_count();
  KV_LOG_INFO << "kvstream-prefill stopped; " << free_blocks << "/" << model->pool->num_blocks()
              << " blocks free";
  return 0;
}
