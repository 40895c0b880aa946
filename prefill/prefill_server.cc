#include "prefill/prefill_server.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>

#include "common/log.h"
#include "connector/grpc_status.h"
#include "connector/handshake.h"  // kQuiescedTrailer
#include "daemon/daemon_runtime.h"  // ComputeDeviceId
#include "daemon/kv_store_tier.h"  // FillKvTierStats
#include "prefill/prefill_request.h"

namespace kvstream::prefill {

namespace v1 = kvstream::v1;
using connector::FromGrpc;
using connector::ToGrpc;

namespace {
int64_t MicrosBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::microseconds>(b - a).count();
}

// save_layer from the forward: layer l's KV is in the pool once AfterLayer(l) runs.
class SaveHooks : public model::LayerHooks {
 public:
  SaveHooks(grpc::ServerContext* ctx, connector::SaveRequest* save, bool pipelined,
            grpc::ServerWriter<v1::PrefillProgress>* writer, bool progress_per_layer,
            int64_t fault_delay_ms, int num_layers, bool gpu_pool,
            const std::atomic<bool>* stopping)
      : ctx_(ctx), save_(save), pipelined_(pipelined), writer_(writer),
        progress_per_layer_(progress_per_layer), fault_delay_ms_(fault_delay_ms),
        num_layers_(num_layers), gpu_pool_(gpu_pool), stopping_(stopping) {}
  bool kv_complete() const { return kv_complete_; }
  int64_t post_us = 0;  // time the forward spent posting writes
  Status AfterLayer(int layer, void* stream) override {
#ifdef KVSTREAM_FAULT_INJECTION
    if (fault_delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(fault_delay_ms_));
#endif
    if (ctx_->IsCancelled()) return Canceled("the decode side cancelled the prefill call");
    if (save_->cancelled()) return Canceled("prefill cancelled");
    // A save begun just after the shutdown's CancelAll collected the active ones is not in it.
    if (stopping_->load()) return Canceled("prefill shutting down");
    // GPU pool: the layer's KV is still being computed on `stream`; the transport's copy
    // stream waits on it (an event), so this thread goes on enqueueing layer l+1 at once.
    if (pipelined_) {
      auto t = Clock::now();
      KV_RETURN_IF_ERROR(save_->SaveLayer(layer, gpu_pool_ ? stream : nullptr));
      post_us += std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t).count();
    }
    if (layer == num_layers_ - 1) {
      // Every layer's KV is in the pool: the last layer's attention and MLP would only feed
      // logits nobody reads. Stop the forward here (a hook error aborts it).
      kv_complete_ = true;
      return Canceled("prefill: KV of every layer computed");
    }
    // With transport notifications the decode side needs no per-layer message; sending them
    // from inside the forward would only slow it down.
    if (progress_per_layer_) SendProgress();
    return OkStatus();
  }
  void SendProgress() {
    for (int l : save_->TakeCompletedLayers()) {
      if (!progress_per_layer_) continue;
      v1::PrefillProgress p;
      p.set_layer(l);
      writer_->Write(p);  // a gone client shows up as ctx cancellation
    }
  }

 private:
  grpc::ServerContext* ctx_;
  connector::SaveRequest* save_;
  bool pipelined_;
  grpc::ServerWriter<v1::PrefillProgress>* writer_;
  bool progress_per_layer_;
  int64_t fault_delay_ms_;
  int num_layers_;
  bool gpu_pool_;
  const std::atomic<bool>* stopping_;
  bool kv_complete_ = false;
};
}  // namespace

PrefillServer::PrefillServer(const daemon::DaemonConfig& config, model::ModelBackend* backend,
                             model::KvPool* pool, connector::PrefillConnector* connector)
    : config_(config), backend_(backend), pool_(pool), connector_(connector),
      instance_id_(connector::NewInstanceId("prefill")),
      device_id_(daemon::ComputeDeviceId(config)),
      cache_(&pool->allocator(), [&] {
        kvcache::DirectoryOptions o;
        o.block_size = pool->layout().block_size;
        o.budget_blocks = config.prompt_cache_blocks;
        return o;
      }()),
      tiers_(std::make_unique<kvcache::TieredCache>(pool, backend->config().hash(),
                                                    std::vector<std::unique_ptr<kvcache::KvTier>>{})) {}

grpc::Status PrefillServer::Handshake(grpc::ServerContext* ctx, const v1::HandshakeRequest* req,
                                      v1::HandshakeResponse* resp) {
  if (grpc::Status a = authz_->Check(*ctx, daemon::Method::kHandshake); !a.ok()) return a;
  auto peer_layout = connector::FromProto(req->layout());
  if (!peer_layout.ok()) return ToGrpc(peer_layout.status());
  // Both ends must run the same data plane (e.g. a GPU pool over "ucx" resolves to UCX direct
  // or ucx_staged depending on the host's UCX).
  if (!req->transport_backend().empty() &&
      req->transport_backend() != connector_->transport().name()) {
    Status s = FailedPrecondition("handshake refused: transport differs: local " +
                                  connector_->transport().name() + ", peer " +
                                  req->transport_backend());
    KV_LOG_WARN << "handshake from " << req->decode_instance_id() << " refused: " << s.ToString();
    return ToGrpc(s);
  }
  transport::PeerDescriptor peer;
  peer.address = req->transport_address();
  for (const auto& r : req->regions())
    peer.regions.push_back(transport::RemoteRegion{r.addr(), r.length(), r.key()});
  // A decode whose transport listens on every interface is dialled where its call came from.
  peer.host = connector::HostOfGrpcPeer(ctx->peer());
  const std::string who = authz_->PeerName(*ctx);
  if (connector_->CheckSession(req->decode_instance_id(), req->session_secret(), who) ==
      connector::PrefillConnector::Session::kMismatch) {
    KV_LOG_WARN << "handshake under decode instance " << req->decode_instance_id()
                << " refused: its session has another secret";
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "handshake refused: decode instance '" + req->decode_instance_id() +
                            "' belongs to another session");
  }
  // AcceptPeer checks the secret again as it binds (two first handshakes may race).
  std::string ticket;
  Status s = connector_->AcceptPeer(req->decode_instance_id(), req->session_secret(), *peer_layout,
                                    peer, req->pool_blocks(), &ticket, req->session_epoch(), who);
  if (!s.ok()) {
    KV_LOG_WARN << "handshake from " << req->decode_instance_id() << " refused: " << s.ToString();
    return ToGrpc(s);
  }
  KV_LOG_INFO << "handshake from " << req->decode_instance_id() << " (" << req->transport_backend()
              << ", " << req->pool_blocks() << " blocks) accepted";
  resp->set_prefill_instance_id(instance_id_);
  resp->set_device_id(device_id_);
  resp->set_transport_admission(ticket);
  connector::ToProto(connector_->local_layout(), resp->mutable_layout());
  return grpc::Status::OK;
}

grpc::Status PrefillServer::Prefill(grpc::ServerContext* ctx, const v1::PrefillRequest* req,
                                    grpc::ServerWriter<v1::PrefillProgress>* writer) {
  if (grpc::Status a = authz_->Check(*ctx, daemon::Method::kPrefill); !a.ok()) {
    ctx->AddTrailingMetadata(connector::kQuiescedTrailer, "1");  // nothing was posted
    return a;
  }
  if (connector_->CheckSession(req->decode_instance_id(), req->session_secret(),
                               authz_->PeerName(*ctx)) ==
      connector::PrefillConnector::Session::kMismatch) {
    KV_LOG_WARN << "[req " << req->request_id() << "] prefill call under decode instance "
                << req->decode_instance_id() << " refused: wrong session secret";
    ctx->AddTrailingMetadata(connector::kQuiescedTrailer, "1");  // nothing was posted
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "prefill refused: not the session of decode instance '" +
                            req->decode_instance_id() + "'");
  }
  ++total_;
  ++in_flight_;
  const auto t0 = Clock::now();
  // One line when a call arrives and one when it ends (like the decode's generate/done): a
  // load that never lands on the decode side shows here whether the prefill had it at all.
  KV_LOG_INFO << "[req " << req->request_id() << "] prefill call from " << req->decode_instance_id()
              << ": " << req->tokens_size() << " tokens";
  Status s = RunPrefill(ctx, *req, writer);
  --in_flight_;
  // RunPrefill returns only once nothing it posted can still land.
  ctx->AddTrailingMetadata(connector::kQuiescedTrailer, "1");
  if (s.ok()) {
    ++ok_;
    KV_LOG_INFO << "[req " << req->request_id() << "] prefill done in "
                << MicrosBetween(t0, Clock::now()) / 1000 << " ms";
  } else {
    (s.code() == StatusCode::kCanceled ? cancelled_ : failed_)++;
    KV_LOG_WARN << "[req " << req->request_id() << "] prefill ended after "
                << MicrosBetween(t0, Clock::now()) / 1000 << " ms: " << s.ToString();
  }
  return ToGrpc(s);
}

Status PrefillServer::RunPrefill(grpc::ServerContext* ctx, const v1::PrefillRequest& req,
                                 grpc::ServerWriter<v1::PrefillProgress>* writer) {
  const uint64_t id = req.request_id();
  if (stopping_) return Unavailable("prefill daemon shutting down");
  if (!admitting_) return Unavailable("prefill daemon draining: not taking new prefills");
  const Deadline deadline =
      connector::ServerDeadline(*ctx, DeadlineAfterMs(config_.request_timeout_ms));
  KV_RETURN_IF_ERROR(
      CheckPrefillRequest(req, backend_->config().vocab_size, backend_->config().max_position));
  const int n = req.tokens_size();
  std::vector<int32_t> tokens(req.tokens().begin(), req.tokens().end());
  std::unique_lock<std::timed_mutex> forward_lock(forward_mu_, std::defer_lock);
  // Declared before `save`: the local blocks outlive every write that reads them.
  model::BlockLease lease;
  const kvcache::BlockKey root =
      kvcache::RootKey(backend_->config().hash(), pool_->layout(), req.cache_salt());
  // Dynamic NTK rotates a whole forward by its sequence's length once that passes
  // max_position_embeddings: only prompts within it share KV with the cache.
  const model::RopeScaling& rope = backend_->config().rope;
  const bool cacheable = rope.type != "dynamic" || n <= rope.original_max_position;
  kvcache::PrefixDirectory::Match cached;
  // Copies from the tier below a GPU pool, in flight while the forward runs.
  std::unique_ptr<kvcache::PoolPrefetch> prefetch;
  if (cacheable) cached = cache_.Find(root, tokens);
  // The blocks that follow the pool's prefix, found in the tiers below it and read from the
  // slow ones (disk, store) as the policy says, before the forward lock: other requests'
  // forwards go on meanwhile.
  kvcache::TieredCache::PendingPtr fetch;
  if (cacheable && tiers_->enabled() && cached.tokens < n)
    fetch = tiers_->Prepare(root, tokens, cached.tokens, deadline);
  if (cached.tokens < n) {
    const auto asked = Clock::now();
    const bool locked = forward_lock.try_lock_until(deadline);
    if (observed_.queue) observed_.queue->Observe(double(MicrosBetween(asked, Clock::now())) * 1e-6);
    if (!locked)
      return Timeout("request " + std::to_string(id) + ": prefill busy until the deadline");
    if (ctx->IsCancelled()) return Canceled("the decode side cancelled the prefill call");
    // A repeat that queued behind the forward of the same prompt (or prefix) finds it now.
    if (cacheable) {
      cached.lease.Reset();
      cached = cache_.Find(root, tokens);
      // Copied into pool blocks under the lock (memory copies only); below a GPU pool, staged
      // in the pinned tier and copied from there layer by layer while the forward runs.
      if (fetch != nullptr && cached.tokens < n) {
        if (cached.tokens == 0) cached.lease = model::BlockLease(&pool_->allocator(), {});
        auto make_room = [&](int blocks) {
          cache_.EvictForAllocation(blocks);
          if (write_back_ && pool_->allocator().free_count() < blocks) WaitForWriteBack(deadline);
        };
        if (pool_tier_) {
          prefetch = tiers_->FillFrom(pool_tier_.get(), fetch.get(), tokens, cached.tokens,
                                      &cached.lease, make_room);
          if (prefetch) cached.tokens = prefetch->tokens();
        } else {
          cached.tokens = tiers_->Fill(fetch.get(), cached.tokens, &cached.lease, make_room);
        }
      }
      fetch.reset();  // the tiers' entries unpinned
      if (cached.tokens == n) forward_lock.unlock();
    }
  }
  if (cacheable) cache_.CountLookup(cached.tokens);
  const int from_cache = cached.tokens;
  const bool hit = from_cache == n;  // the whole prompt: no forward
  lease = from_cache > 0 ? std::move(cached.lease) : model::BlockLease(&pool_->allocator(), {});
  if (!hit) {
    const int bs = pool_->layout().block_size;
    Status grown = lease.GrowToTokens(n, bs);
    if (!grown.ok() && cache_.enabled()) {
      // Cached blocks nobody reads give way to a request that needs room.
      cache_.EvictForAllocation(model::BlocksForTokens(n, bs) - static_cast<int>(lease.ids().size()));
      grown = lease.GrowToTokens(n, bs);
      // Write-back: the blocks just evicted are free once written down (queued, never waited
      // for by the eviction); rather than fail, wait for the writes, by the deadline.
      if (!grown.ok() && write_back_) {
        WaitForWriteBack(deadline);
        grown = lease.GrowToTokens(n, bs);
      }
    }
    if (!grown.ok()) return grown.WithContext("prefill pool");
  }
  std::vector<int32_t> dest(req.dest_blocks().begin(), req.dest_blocks().end());
  KV_ASSIGN_OR_RETURN(std::shared_ptr<connector::SaveRequest> save,
                      connector_->BeginSave(req.decode_instance_id(), id, n, lease.ids(), dest,
                                            authz_->PeerName(*ctx), req.skip_blocks()));
  KV_LOG_DEBUG << "[req " << id << "] prefill of " << n << " tokens, pipelined=" << req.pipelined()
               << (hit ? ", from the prefix cache"
                       : from_cache > 0 ? ", " + std::to_string(from_cache) + " from the prefix cache"
                                        : std::string());
  {
    // Tells the decode side the request is taken (see PrefillProgress.accepted).
    v1::PrefillProgress accepted;
    accepted.set_accepted(true);
    accepted.set_layer(-1);
    if (!writer->Write(accepted)) {
      KV_LOG_DEBUG << "[req " << id << "] decode side gone before the forward";
    }
  }

  // From the cache, every layer is complete: each is written at once, in order.
  const bool pipelined = req.pipelined() || hit;
  SaveHooks hooks(ctx, save.get(), pipelined, writer,
                  !connector_->transport().capabilities().notifications,
                  config_.fault_layer_delay_ms, pool_->layout().num_layers,
                  pool_->memory().on_device(), &stopping_);
  auto t0 = Clock::now();
  Status s;
  if (hit) {
    if (prefetch) s = prefetch->WaitAll();  // no forward to wait on the GPU
    for (int l = 0; l < pool_->layout().num_layers && s.ok(); ++l) s = hooks.AfterLayer(l, nullptr);
  } else {
    model::SeqInput seq{std::span<const int32_t>(tokens).subspan(from_cache), from_cache,
                        lease.ids()};
    model::ForwardOptions fo;
    fo.skip_lm_head = true;
    model::ForwardOutput out;
    // Layer l's attention waits (on the GPU) for layer l of a prefix still being fetched.
    kvcache::PrefetchHooks layered(prefetch.get(), &hooks);
    s = backend_->Forward(*pool_, std::span<const model::SeqInput>(&seq, 1), &layered, fo, &out);
  }
  auto t1 = Clock::now();
  if (forward_lock.owns_lock()) forward_lock.unlock();
  if (!s.ok() && hooks.kv_complete()) s = OkStatus();
  if (s.ok() && !pipelined) {
    for (int l = 0; l < pool_->layout().num_layers && s.ok(); ++l) s = save->SaveLayer(l);
  }
  if (s.ok()) s = save->WaitForSave(deadline);
  auto t2 = Clock::now();
  if (!s.ok()) {
    save->Quiesce(DeadlineAfterMs(config_.cancel_timeout_ms), s.ToString());
  }
  connector_->EndSave(req.decode_instance_id(), id, authz_->PeerName(*ctx));
  // A shutdown cancels every request: say so, rather than a bare "cancelled" the decode side
  // could mistake for its own cancel.
  if (!s.ok() && stopping_) return Unavailable("prefill daemon shutting down (" + s.message() + ")");
  if (!s.ok()) return s;
  // Only a prompt whose KV was computed completely is kept (a cancelled forward stops early).
  // A hit re-inserts too: its blocks may have come up from a tier.
  if (cacheable) {
    int kept = 0;
    const int added = cache_.Insert(root, tokens, lease.ids(), &kept);
    if (added > 0) {
      KV_LOG_DEBUG << "[req " << id << "] " << added << " blocks of the prompt cached";
    }
    if (write_back_) {
      // Write-back: the cached blocks go down when evicted; those the cache did not keep (its
      // budget, max_tokens) now, as write-through would.
      if (kept < n) {
        const int bs = pool_->layout().block_size;
        const std::vector<kvcache::BlockKey> keys = kvcache::ChainKeys(root, tokens, bs);
        std::vector<kvcache::KeyedBlock> rest;
        for (size_t b = size_t(kept / bs); b < keys.size(); ++b)
          rest.push_back({root, keys[b], uint32_t(std::min(bs, n - int(b) * bs)), lease.ids()[b]});
        WriteBack(rest);
      }
    } else if (!pool_tier_) {
      // Write-through: every block of the prompt to the tiers below (in the background).
      tiers_->WriteDown(root, tokens, lease.ids());
    } else {  // to the pinned tier, then from it to the slower ones once its copy is complete
      pool_tier_->WriteDown(root, tokens, lease.ids(),
                            [t = tiers_.get(), root, tokens] { t->WriteStaged(root, tokens); });
    }
  }
  if (observed_.compute && !hit) observed_.compute->Observe(double(MicrosBetween(t0, t1)) * 1e-6);
  if (observed_.transfer_seconds) {
    observed_.transfer_seconds->Observe(double(save->transfer_us()) * 1e-6);
    observed_.transfer_bytes->Observe(double(save->bytes_posted()));
  }
  hooks.SendProgress();
  v1::PrefillProgress done;
  done.set_done(true);
  done.set_layer(pool_->layout().num_layers - 1);
  done.set_kv_bytes(save->bytes_posted());
  done.set_prefill_compute_us(hit ? 0 : MicrosBetween(t0, t1));
  done.set_prompt_cache_hit(hit);
  done.set_cached_tokens(from_cache);
  done.set_transfer_us(save->transfer_us());
  done.set_transfer_exposed_us(MicrosBetween(t1, t2));
  writer->Write(done);
  KV_LOG_DEBUG << "[req " << id << "] prefill done: compute " << MicrosBetween(t0, t1)
               << " us (posting writes " << hooks.post_us << " us), " << save->bytes_posted()
               << " bytes, transfer " << save->transfer_us() << " us";
  return OkStatus();
}

grpc::Status PrefillServer::Cancel(grpc::ServerContext* ctx, const v1::CancelRequest* req,
                                   v1::CancelResponse* resp) {
  if (grpc::Status a = authz_->Check(*ctx, daemon::Method::kCancel); !a.ok()) return a;
  const std::string who = authz_->PeerName(*ctx);
  switch (connector_->CheckSession(req->decode_instance_id(), req->session_secret(), who)) {
    case connector::PrefillConnector::Session::kMismatch:
      KV_LOG_WARN << "[req " << req->request_id() << "] cancel under decode instance "
                  << req->decode_instance_id() << " refused: wrong session secret";
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          "cancel refused: not the session of decode instance '" +
                              req->decode_instance_id() + "'");
    case connector::PrefillConnector::Session::kNone:
      // No handshake, no link: nothing of this instance can be running (and a foreign caller
      // leaves no tombstone that would refuse the instance's later requests).
      resp->set_known(false);
      resp->set_stopped(true);
      return grpc::Status::OK;
    case connector::PrefillConnector::Session::kMatch:
      break;
  }
  Deadline d = connector::ServerDeadline(*ctx, DeadlineAfterMs(config_.cancel_timeout_ms));
  auto r = connector_->Cancel(req->decode_instance_id(), req->request_id(), d, who);
  resp->set_known(r.known);
  resp->set_stopped(r.stopped);
  KV_LOG_INFO << "[req " << req->request_id() << "] cancel from " << req->decode_instance_id()
              << (r.known ? " (was running)" : " (not running)");
  return grpc::Status::OK;
}

grpc::Status PrefillServer::Stats(grpc::ServerContext* ctx, const v1::StatsRequest* req,
                                  v1::StatsResponse* resp) {
  if (grpc::Status a = authz_->Check(*ctx, daemon::Method::kStats); !a.ok()) return a;
  FillStats(resp);
  return grpc::Status::OK;
}

void PrefillServer::FillStats(v1::StatsResponse* resp) const {
  resp->set_instance_id(instance_id_);
  resp->set_role("prefill");
  auto* p = resp->mutable_pool();
  p->set_num_blocks(pool_->num_blocks());
  p->set_free_blocks(pool_->allocator().free_count());
  p->set_block_size(pool_->layout().block_size);
  p->set_block_bytes(pool_->layout().block_bytes());
  p->set_num_layers(pool_->layout().num_layers);
  const kvcache::PrefixDirectory::Stats pc = cache_.stats();
  p->set_prompt_cache_blocks(pc.blocks);
  resp->set_requests_in_flight(in_flight_.load());
  auto cs = connector_->stats();
  auto* c = resp->mutable_counters();
  c->set_requests_total(total_);
  c->set_requests_ok(ok_);
  c->set_requests_failed(failed_);
  c->set_requests_cancelled(cancelled_);
  c->set_kv_bytes_moved(cs.bytes_written);
  c->set_handshakes(cs.handshakes);
  c->set_prompt_cache_hits(pc.hits);
  c->set_prompt_cache_misses(pc.misses);
  c->set_prompt_cache_evictions(pc.evicted_blocks);
  c->set_prompt_cache_hit_tokens(pc.hit_tokens);
  resp->set_model_name(backend_->config().name);
  resp->set_vocab_size(backend_->config().vocab_size);
  resp->set_model_hash(backend_->config().hash());
  resp->set_backend(backend_->name());
  resp->set_transport(connector_->transport().name());
  auto add_tier = [&](const std::string& name, const kvcache::TierStats& t) {
    daemon::FillKvTierStats(name, t, resp->add_kv_tiers());
  };
  const kvcache::TieredCache::Stats ts = tiers_->stats();
  uint64_t fetched = ts.fetched_tokens, fetch_us = ts.fetch_us;
  // The pinned host tier below a GPU pool is ts.tiers[0] (its staging view), counted there.
  if (pool_tier_) fetch_us += pool_tier_->stats().fetch_us;
  for (const auto& t : ts.tiers) add_tier(t.name, t.stats);
  resp->set_kv_tier_fetched_tokens(fetched);
  resp->set_kv_tier_fetch_us(fetch_us);
  resp->set_kv_tier_queued_blocks(ts.queued_writes);
  resp->set_kv_tier_recomputed_tokens(ts.recomputed_tokens);
  resp->set_kv_tier_late_blocks(ts.late_blocks);
  // The pinned tier's own write-downs skipped (too much in flight) count with the queue's.
  resp->set_kv_tier_skipped_blocks(ts.skipped_blocks +
                                   (pool_tier_ ? pool_tier_->stats().skipped_blocks : 0));
  resp->set_kv_tier_held_blocks(ts.held_blocks);
  resp->set_kv_tier_write_back_blocks(ts.write_back_blocks);
}

void PrefillServer::EnableMetrics(daemon::MetricsRegistry* registry) {
  registry->AddReader([this](daemon::MetricsWriter& out) {
    v1::StatsResponse s;
    FillStats(&s);
    daemon::WriteStatsMetrics(s, static_cast<int>(connector_->stats().peers), out);
  });
  observed_.queue = registry->AddHistogram(
      "kvstream_prefill_queue_seconds",
      "A prefill call waiting for the forward (one at a time), prompt-cache hits excepted", {},
      daemon::buckets::RequestSeconds());
  observed_.compute = registry->AddHistogram(
      "kvstream_prefill_compute_seconds",
      "A prompt's forward up to its last layer's KV (prompt-cache hits excepted)", {},
      daemon::buckets::RequestSeconds());
  const daemon::MetricLabels labels = {{"transport", connector_->transport().name()}};
  observed_.transfer_seconds = registry->AddHistogram(
      "kvstream_prefill_kv_transfer_seconds",
      "A prompt's KV writes, first posted to last complete at the decode", labels,
      daemon::buckets::RequestSeconds());
  observed_.transfer_bytes = registry->AddHistogram(
      "kvstream_prefill_kv_transfer_bytes", "KV bytes written for one prompt", labels,
      daemon::buckets::Bytes());
}

void PrefillServer::UpdateWriteBack() {
  write_back_ = config_.kv_tier_write_policy == "write_back" && tiers_ != nullptr &&
                (tiers_->enabled() || pool_tier_ != nullptr);
  if (write_back_) {
    cache_.set_on_evict([this](std::span<const kvcache::KeyedBlock> b) { WriteBack(b); });
  } else {
    cache_.set_on_evict({});
  }
}

void PrefillServer::WriteBack(std::span<const kvcache::KeyedBlock> blocks) {
  if (blocks.empty()) return;
  if (!pool_tier_) {
    tiers_->WriteBack(blocks, /*wait_for_room=*/stopping_.load());
    return;
  }
  // To the pinned tier, then from it to the slower ones once its copy is complete. At shutdown
  // in pieces within the pinned tier's bound on copies in flight (half the pool), each done
  // before the next.
  const size_t piece = stopping_ ? std::max<size_t>(1, size_t(pool_->num_blocks()) / 2) : blocks.size();
  for (size_t i = 0; i < blocks.size(); i += piece) {
    std::vector<kvcache::KeyedBlock> some(blocks.begin() + i,
                                          blocks.begin() + std::min(blocks.size(), i + piece));
    kvcache::TieredCache* t = tiers_.get();
    pool_tier_->WriteBlocks(some, [t, some] { t->WriteBackStaged(some); });
    if (stopping_) {
      pool_tier_->Flush();
      t->Flush();
    }
  }
}

void PrefillServer::WaitForWriteBack(Deadline deadline) {
  if (pool_tier_) {
    pool_tier_->Flush();  // its copies out hold the pool blocks (the staged writes do not)
  } else {
    tiers_->WaitForWrites(deadline);
  }
}

void PrefillServer::BeginShutdown() {
  stopping_ = true;
  connector_->CancelAll(DeadlineAfterMs(config_.cancel_timeout_ms));
  // Blocks still read by a cancelled write return when its lease does. Write-back with a tier
  // that outlives the process (disk, store): every cached block goes down first (waiting for
  // room in the queue), and the writes finish before the tiers stop: a shutdown keeps what
  // write-through would have kept. (Host memory alone would be lost anyway: nothing written.)
  const bool write_cache = write_back_ && tiers_->durable();
  cache_.Clear(/*closing=*/true, /*report=*/write_cache);
  if (write_cache) {
    if (pool_tier_) pool_tier_->Flush();
    tiers_->Flush();
  }
  // Queued write-downs are dropped (their blocks returned); the tiers keep what they hold.
  tiers_->Stop();
}

}  // namespace kvstream::prefill
