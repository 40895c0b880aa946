// DecodeServer's figures: the Stats call and the metrics (daemon/metrics.h), from one place.
#include "decode/decode_server.h"

#include "daemon/kv_store_tier.h"  // FillKvTierStats

namespace kvstream::decode {

namespace v1 = kvstream::v1;

grpc::Status DecodeServer::Stats(grpc::ServerContext* ctx, const v1::StatsRequest* req,
                                 v1::StatsResponse* resp) {
  if (grpc::Status a = authz_->Check(*ctx, daemon::Method::kStats); !a.ok()) return a;
  FillStats(resp);
  return grpc::Status::OK;
}

void DecodeServer::FillStats(v1::StatsResponse* resp) {
  resp->set_instance_id(connectors_.front()->instance_id());
  resp->set_role("decode");
  auto* p = resp->mutable_pool();
  p->set_num_blocks(pool_->num_blocks());
  p->set_free_blocks(pool_->allocator().free_count());
  p->set_block_size(pool_->layout().block_size);
  p->set_block_bytes(pool_->layout().block_bytes());
  p->set_num_layers(pool_->layout().num_layers);
  {
    std::lock_guard<std::mutex> lock(mu_);
    resp->set_requests_in_flight(static_cast<int>(active_ids_.size()));
  }
  connector::DecodeConnectorStats cs;
  for (connector::DecodeConnector* c : connectors_) {
    const auto one = c->stats();
    cs.kv_bytes += one.kv_bytes;
    cs.stale_signals_ignored += one.stale_signals_ignored;
    cs.data_connections_refused += one.data_connections_refused;
    cs.notifications_dropped += one.notifications_dropped;
    cs.handshakes += one.handshakes;
    cs.quarantined_blocks += one.quarantined_blocks;
  }
  auto* c = resp->mutable_counters();
  c->set_requests_total(total_);
  c->set_requests_ok(ok_);
  c->set_requests_failed(failed_);
  c->set_requests_cancelled(cancelled_);
  c->set_tokens_generated(tokens_);
  c->set_kv_bytes_moved(cs.kv_bytes);
  c->set_stale_signals_ignored(cs.stale_signals_ignored);
  c->set_data_connections_refused(cs.data_connections_refused);
  c->set_notifications_dropped(cs.notifications_dropped);
  c->set_loads_recomputed(recomputed_);
  c->set_decode_steps(steps_);
  c->set_decode_loop_us(loop_us_);
  c->set_decode_forward_us(forward_us_);
  c->set_decode_first_step_us(first_step_us_);
  c->set_decode_joins_deferred(joins_deferred_);
  c->set_handshakes(cs.handshakes);
  resp->set_quarantined_blocks(cs.quarantined_blocks);
  resp->set_model_name(backend_->config().name);
  resp->set_vocab_size(backend_->config().vocab_size);
  resp->set_model_hash(backend_->config().hash());
  resp->set_backend(backend_->name());
  resp->set_transport(config_.transport);
  if (write_down_ != nullptr) {  // the shared tier finished conversations are written down to
    const kvcache::TieredCache::Stats ts = write_down_->stats();
    for (const auto& t : ts.tiers) daemon::FillKvTierStats(t.name, t.stats, resp->add_kv_tiers());
    resp->set_kv_tier_queued_blocks(ts.queued_writes);
    resp->set_kv_tier_skipped_blocks(ts.skipped_blocks);
    resp->set_kv_tier_held_blocks(ts.held_blocks);
    // The prefixes loaded from them (kv_decode_loads_prefix).
    resp->set_kv_tier_fetched_tokens(ts.fetched_tokens);
    resp->set_kv_tier_fetch_us(ts.fetch_us +
                               (write_down_staging_ ? write_down_staging_->stats().fetch_us : 0));
    resp->set_kv_tier_recomputed_tokens(ts.recomputed_tokens);
    resp->set_kv_tier_late_blocks(ts.late_blocks);
  }
  if (connectors_.size() > 1) {  // a choice of prefill per request
    const RouteStats r = router_.stats();
    auto* routes = resp->mutable_prefill_routes();
    routes->set_by_prefix(r.by_prefix);
    routes->set_by_load(r.by_load);
    routes->set_round_robin(r.round_robin);
    routes->set_moved_down(r.moved_down);
    routes->set_moved_busy(r.moved_busy);
  }
}

void DecodeServer::EnableMetrics(daemon::MetricsRegistry* registry) {
  namespace buckets = daemon::buckets;
  registry->AddReader([this](daemon::MetricsWriter& out) {
    v1::StatsResponse s;
    FillStats(&s);
    int ready = 0;
    for (connector::DecodeConnector* c : connectors_) ready += c->peer_ready() ? 1 : 0;
    daemon::WriteStatsMetrics(s, ready, out);
  });
  observed_.ttft = registry->AddHistogram(
      "kvstream_decode_time_to_first_token_seconds",
      "Request arrival to its first token ready to send (GenerateResponse.since_arrival_us)", {},
      buckets::RequestSeconds());
  observed_.itl = registry->AddHistogram(
      "kvstream_decode_inter_token_latency_seconds",
      "Gap between consecutive tokens of one stream, on the decode's clock", {},
      buckets::TokenSeconds());
  observed_.queue = registry->AddHistogram(
      "kvstream_decode_queue_seconds", "Request arrival to its KV blocks granted (admission)", {},
      buckets::RequestSeconds());
  observed_.layer_wait = registry->AddHistogram(
      "kvstream_decode_layer_load_wait_seconds",
      "First step blocked waiting for one layer's KV to land (one sample per wait)", {},
      buckets::LayerWaitSeconds());
  for (connector::DecodeConnector* c : connectors_) {
    const daemon::MetricLabels labels = {{"transport", config_.transport},
                                         {"peer", c->prefill_address()}};
    daemon::Histogram* seconds = registry->AddHistogram(
        "kvstream_decode_kv_transfer_seconds",
        "A loaded prompt's KV transfer, first write posted to last complete (the prefill's figure)",
        labels, buckets::RequestSeconds());
    daemon::Histogram* bytes = registry->AddHistogram(
        "kvstream_decode_kv_transfer_bytes", "KV bytes of a loaded prompt", labels,
        buckets::Bytes());
    c->set_on_load_done([seconds, bytes](const connector::LoadResult& r) {
      seconds->Observe(double(r.transfer_us) * 1e-6);
      bytes->Observe(double(r.kv_bytes));
    });
  }
}

}  // namespace kvstream::decode
