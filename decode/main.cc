// kvstream-decode: serves Generate; loads prompts' KV from a prefill daemon layer by layer and decodes.
#include <chrono>
#include <cstdio>

#include "common/log.h"
#include "common/version.h"
#include "daemon/credentials.h"
#include "daemon/daemon_runtime.h"
#include "daemon/health.h"
#include "daemon/kv_store_tier.h"
#include "daemon/pool_tier.h"
#include "daemon/metrics.h"
#include "daemon/reflection.h"
#include "daemon/signals.h"
#include "connector/handshake.h"
#include "decode/decode_server.h"
#include "frontend/http_server.h"
#include "tokenizer/tokenizer.h"
#include "model/generation_config.h"

using namespace kvstream;

namespace {
int Fail(const Status& s) { return daemon::DaemonFailure("decode", s); }

// The HTTP endpoint's options: the gRPC API's credentials (daemon/credentials.h); the
// checkpoint's chat template when it has one and a tokenizer.
Result<frontend::HttpOptions> HttpOptionsFromConfig(const daemon::DaemonConfig& cfg,
                                                    const decode::TextSupport& text) {
  frontend::HttpOptions o;
  o.listen = cfg.http;
  o.model_id = cfg.http_model_name;
  if (o.model_id.empty()) {
    std::string m = cfg.model;
    while (m.size() > 1 && m.back() == '/') m.pop_back();
    o.model_id = m.substr(m.find_last_of('/') + 1);
  }
  if (!cfg.client_token_file.empty()) {
    KV_ASSIGN_OR_RETURN(o.client_token, daemon::ReadTokenFile("client_token_file", cfg.client_token_file));
  }
  if (!cfg.tls_ca.empty()) {
    o.tls_cert = cfg.tls_cert;
    o.tls_key = cfg.tls_key;
    o.tls_ca = cfg.tls_ca;
  }
  o.open = o.client_token.empty() && o.tls_ca.empty();
  o.request_timeout_ms = cfg.request_timeout_ms;
  if (text.tokenizer == nullptr) {
    o.chat_template_missing = "no tokenizer: " + text.why_none;
  } else if (auto tmpl = frontend::LoadChatTemplate(cfg.model); tmpl.ok()) {
    o.chat_template = std::make_shared<const frontend::ChatTemplate>(std::move(tmpl).value());
    KV_LOG_INFO << "chat template loaded (" << o.chat_template->source.size() << " bytes)";
  } else {
    o.chat_template_missing = tmpl.status().message();
    if (tmpl.status().code() != StatusCode::kNotFound) {
      KV_LOG_WARN << "chat template not loaded: " << tmpl.status().ToString();
    }
  }
  return o;
}
}  // namespace

int main(int argc, char** argv) {
  if (PrintVersionIfAsked(argc, argv, "kvstream-decode")) return 0;
  daemon::BlockTerminationSignals();
  int exit_code = 0;
  auto cfg = daemon::StartDaemon(argc, argv, "decode", &exit_code);
  if (!cfg) return exit_code;
  auto security = daemon::SecurityFromConfig(*cfg, "decode");
  if (!security.ok()) return Fail(security.status());

  auto model = daemon::LoadServingModel(*cfg);
  if (!model.ok()) return Fail(model.status().WithContext("loading the model"));
  auto gen_defaults = model::LoadGenerationDefaults(cfg->model, model->backend->config().vocab_size);
  if (!gen_defaults.ok()) return Fail(gen_defaults.status().WithContext("loading the model"));
  // One transport and connector per prefill daemon; each registers the same pool.
  std::vector<std::unique_ptr<connector::DecodeConnector>> conns;
  const std::string device_id = daemon::ComputeDeviceId(*cfg);
  for (const std::string& peer : daemon::SplitPeers(cfg->peer)) {
    auto transport = daemon::CreateTransportFromConfig(*cfg, "decode");
    if (!transport.ok()) return Fail(transport.status().WithContext("creating the transport"));
    cfg->transport = (*transport)->name();  // as resolved (Stats reports it)
    connector::DecodeConnectorOptions dopt;
    dopt.prefill_address = peer;
    dopt.handshake_timeout_ms = cfg->handshake_timeout_ms;
    dopt.cancel_timeout_ms = cfg->cancel_timeout_ms;
    dopt.quarantine_ms = cfg->quarantine_ms;
    dopt.device_id = device_id;
    dopt.auth = {security->channel_credentials, security->peer_token};
    auto conn = connector::DecodeConnector::Create(
        dopt, std::move(transport).value(), model->pool.get(),
        connector::MakeLayoutDescriptor(model->backend->config(), cfg->block_size));
    if (!conn.ok()) return Fail(conn.status().WithContext("creating the connector for " + peer));
    // Handshake eagerly so a layout mismatch shows at startup; a prefill that is not up yet is
    // retried lazily by the first request sent to it.
    if (Status hs = (*conn)->Handshake(DeadlineAfterMs(cfg->handshake_timeout_ms)); !hs.ok()) {
      if (hs.code() == StatusCode::kFailedPrecondition) return Fail(hs);
      KV_LOG_WARN << hs.ToString() << " (will retry on the first request)";
    }
    conns.push_back(std::move(conn).value());
  }
  std::vector<connector::DecodeConnector*> raw;
  for (auto& c : conns) raw.push_back(c.get());

  // Text in and out needs the checkpoint's tokenizer; without one the daemon serves token ids.
  decode::TextSupport text;
  auto tok = tokenizer::Tokenizer::ForModel(cfg->model);
  if (tok.ok()) {
    text.tokenizer = tok->get();
    KV_LOG_INFO << "tokenizer: " << (*tok)->Describe();
  } else {
    text.why_none = tok.status().message();
    if (tok.status().code() != StatusCode::kNotFound) {
      KV_LOG_WARN << "tokenizer not loaded: " << tok.status().ToString();
    }
  }
  // The shared KV tier (docs/kv_tiers.md): finished conversations are written down to it. From a
  // GPU pool they are staged through a pinned host tier (kv_host_tier_mb), as the prefill's are.
  std::unique_ptr<kvcache::TieredCache> write_down;  // stopped and destroyed before `staging`
  std::unique_ptr<kvcache::PoolTier> staging;
  if (!cfg->kv_store_redis.empty()) {
    const bool gpu = model->pool->memory().on_device();
    if (gpu && cfg->kv_host_tier_mb <= 0)
      return Fail(InvalidArgument("kv_store_redis on a decode with a GPU pool: its blocks are "
                                  "staged through pinned host memory; set kv_host_tier_mb too"));
    auto secret = daemon::ReadTokenFile("kv_tier_secret_file", cfg->kv_tier_secret_file);
    if (!secret.ok()) return Fail(secret.status());
    const uint64_t model_hash = model->backend->config().hash();
    auto store = daemon::CreateStoreKvTier(*cfg, model_hash, model->pool->layout(), *secret);
    if (!store.ok()) return Fail(store.status());
    std::vector<std::unique_ptr<kvcache::KvTier>> tiers;
    if (gpu) {
      auto pool_tier = daemon::CreatePoolTier(*cfg, model->pool.get());
      if (!pool_tier.ok()) return Fail(pool_tier.status());
      staging = std::move(pool_tier).value();
      tiers.push_back(std::make_unique<kvcache::BorrowedTier>(staging->staging()));
    }
    tiers.push_back(std::move(store).value());
    // Its reads (kv_decode_loads_prefix) follow the tier policy, as the prefill's do.
    const bool loads_prefix =
        daemon::ResolveDecodeLoadsPrefix(cfg->kv_decode_loads_prefix, cfg->transport);
    kvcache::FetchPolicy policy;
    auto mode = kvcache::ParseFetchMode(cfg->kv_tier_policy);
    if (!mode.ok()) return Fail(mode.status().WithContext("kv_tier_policy"));
    policy.mode = *mode;
    policy.timeout = std::chrono::milliseconds(cfg->kv_tier_timeout_ms);
    policy.threshold_tokens = cfg->kv_prefetch_threshold_tokens;
    write_down = std::make_unique<kvcache::TieredCache>(
        model->pool.get(), model_hash, std::move(tiers), policy,
        loads_prefix ? cfg->kv_tier_io_threads : 0, /*staged=*/gpu,
        /*write_threads=*/1);
    KV_LOG_INFO << "finished conversations are written down to the shared KV tier "
                << cfg->kv_store_redis
                << (loads_prefix ? ", prompts' prefixes loaded from it" : "")
                << (gpu ? " through " + std::to_string(cfg->kv_host_tier_mb) +
                              " MiB of pinned host memory"
                        : "");
  }
  daemon::Health health("kvstream.v1.Decode");  // outlives the service (its prober reports to it)
  decode::DecodeServer service(*cfg, model->backend.get(), model->pool.get(), raw);
  service.set_text_support(text);
  service.set_kv_write_down(write_down.get(), staging.get());
  service.set_authorizer(security->authorizer);
  auto registry = std::make_shared<daemon::MetricsRegistry>();
  if (!cfg->metrics.empty()) service.EnableMetrics(registry.get());
  service.set_default_stop_tokens(gen_defaults->eos_token_ids);
  daemon::ReflectionService reflection({v1::Decode::service_full_name()}, security->authorizer);
  int port = 0;
  // The client API's connections age out so that clients balancing over DNS re-resolve (the
  // prefill keeps its connections: its decodes hold them).
  daemon::ServerLimits limits = daemon::ServerLimitsFromConfig(*cfg);
  limits.max_connection_age_ms = cfg->max_connection_age_ms;
  auto server = daemon::StartGrpcServer(cfg->listen, {&service, &reflection}, &port, limits,
                                        security->server_credentials);
  if (!server.ok()) return Fail(server.status());
  if (Status s = daemon::StartHealth(*cfg, server->get(), &health); !s.ok()) return Fail(s);
  service.SetHealth(&health);
  auto metrics = daemon::StartMetricsEndpoint(*cfg, *security, registry);
  if (!metrics.ok()) return Fail(metrics.status());
  std::unique_ptr<frontend::HttpServer> http;  // destroyed after service.Stop() below
  if (!cfg->http.empty()) {
    auto opt = HttpOptionsFromConfig(*cfg, text);
    if (!opt.ok()) return Fail(opt.status());
    auto started = frontend::HttpServer::Start(*opt, &service, text.tokenizer,
                                               [&health] { return health.serving(); });
    if (!started.ok()) return Fail(started.status());
    http = std::move(started).value();
    if (Status s = daemon::WritePortFile(cfg->http_port_file, http->port()); !s.ok()) return Fail(s);
  }
  if (Status s = daemon::WritePortFile(cfg->port_file, port); !s.ok()) return Fail(s);
  KV_LOG_INFO << "kvstream-decode " << conns.front()->instance_id() << " serving on port " << port
              << " (model " << model->backend->config().name << ", "
              << model->backend->config().num_layers << " layers, backend "
              << model->backend->name() << ", pool " << cfg->pool_blocks << " blocks, prefill "
              << cfg->peer << ", pipelining " << (cfg->pipelining ? "on" : "off") << ")";

  int sig = daemon::WaitForTerminationSignal();
  KV_LOG_INFO << "signal " << sig << ": draining";
  daemon::Drain("decode", &health, {cfg->drain_delay_ms, cfg->drain_grace_ms,
                                  [&] { service.StopAdmitting(); },
                                  [&] { return service.in_flight() + (http ? http->in_flight() : 0); }});
  KV_LOG_INFO << "shutting down";
  service.BeginShutdown();
  if (http) http->Stop();
  health.Shutdown();
  (*server)->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  (*server)->Wait();
  metrics->reset();  // its scrapes read the service and the connectors
  service.Stop();
  if (staging) staging->Flush();  // the GPU copies out complete: their pool references return
  if (write_down) write_down->Stop();  // drops what is still queued: its block references return
  write_down.reset();  // reads the staging tier: goes first
  staging.reset();
  conns.clear();  // each connector waits (bounded) for its writers before releasing blocks
  int free_blocks = model->pool->allocator().free_count();
  KV_LOG_INFO << "kvstream-decode stopped; " << free_blocks << "/" << model->pool->num_blocks()
              << " blocks free";
  return 0;
}
