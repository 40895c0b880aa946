#include "connector/decode_connector.h"

#include <chrono>
#include <cstdio>
#include <limits>

#include "common/log.h"
#include "connector/grpc_status.h"

namespace kvstream::connector {

namespace v1 = kvstream::v1;

struct DecodeConnector::Load {
  uint64_t id = 0;
  std::vector<int32_t> tokens;
  std::vector<int32_t> dest;
  bool pipelined = true;
  int skip_blocks = 0;
  std::string cache_salt;
  Deadline deadline;
  std::shared_ptr<const void> keepalive;
  std::thread thread;
  Clock::time_point started = Clock::now();
  // Under DecodeConnector::mu_:
  std::shared_ptr<grpc::ClientContext> ctx;  // the running Prefill call, if any
  // Where the load is, for a status that says what was missing when a layer does not land.
  Clock::time_point call_sent{};   // the last Prefill call went out (epoch: none yet)
  Clock::time_point accepted_at{};  // the prefill confirmed it took the request (epoch: not yet)
  int attempts = 0;                 // Prefill calls made
  bool call_ended = false;
  Status call_status;               // of the last call, once ended
  bool cancel_requested = false;
  // Every layer's notification arrived before Finished(): each layer is written once and
  // notified after its data, so no write of this request can still land.
  bool all_landed = false;
  bool finished = false;   // the engine called Finished()
  bool done = false;       // the thread ended and dropped the keepalive
  bool result_ready = false;
  Status result;
  LoadResult info;
};

Result<std::unique_ptr<DecodeConnector>> DecodeConnector::Create(
    const DecodeConnectorOptions& options, std::unique_ptr<transport::Transport> transport,
    model::KvPool* pool, LayoutDescriptor local) {
  if (!transport || !pool) return InvalidArgument("DecodeConnector: transport and pool required");
  if (options.prefill_address.empty()) return InvalidArgument("DecodeConnector: no prefill address");
  if (!(pool->layout() == local.layout))
    return InvalidArgument("DecodeConnector: pool layout differs from the descriptor");
  std::unique_ptr<DecodeConnector> c(new DecodeConnector());
  c->options_ = options;
  if (c->options_.instance_id.empty()) c->options_.instance_id = NewInstanceId("decode");
  KV_ASSIGN_OR_RETURN(c->session_secret_, NewSessionSecret());
  c->verifier_ = std::make_unique<NotificationVerifier>(c->session_secret_, c->options_.instance_id);
  c->verify_macs_ = transport->capabilities().notification_mac;
  c->pool_ = pool;
  c->local_ = std::move(local);
  DecodeConnector* self = c.get();
  transport->SetNotificationSink([self](const transport::Notification& n) {
    if (self->verify_macs_ && !self->verifier_->Verify(n)) {
      KV_LOG_DEBUG << "[req " << n.request_id << "] layer " << n.layer
                   << " notification dropped: its MAC does not verify";
      return;
    }
    KV_LOG_DEBUG << "[req " << n.request_id << "] layer " << n.layer << " landed (notification"
                 << ((n.flags & transport::kNotificationLandedOnEvent) ? ", early)" : ")");
    if ((n.flags & transport::kNotificationLandedOnEvent) == 0) {
      self->tracker_.OnLanded(n.request_id, n.layer);
      return;
    }
    // Early: the event must be known before a waiter can see the layer as landed.
    {
      std::lock_guard<std::mutex> lock(self->early_mu_);
      self->early_[{n.request_id, n.layer}] = n;
    }
    self->tracker_.OnLanded(n.request_id, n.layer);
    if (!self->tracker_.IsLanded(n.request_id, n.layer)) {  // not a tracked request: ignored
      std::lock_guard<std::mutex> lock(self->early_mu_);
      self->early_.erase({n.request_id, n.layer});
    }
  });
  transport::MemoryRegion region;
  region.addr = pool->base();
  region.length = pool->memory().size();
  region.kind = pool->memory().on_device() ? transport::MemoryKind::kCuda : transport::MemoryKind::kHost;
  region.device = pool->memory().device();
  KV_ASSIGN_OR_RETURN(c->registration_, transport->Register(region));
  c->transport_ = std::move(transport);

  grpc::ChannelArguments args;
  // After a prefill restart, reconnect within a second instead of gRPC's default minutes.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // A prefill that dies or hangs is noticed within keepalive time + timeout, also while no
  // call is open (the prefill's server permits it: daemon::StartGrpcServer).
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(options.keepalive_time_ms));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, static_cast<int>(options.keepalive_timeout_ms));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetInt(GRPC_ARG_HTTP2_MIN_SENT_PING_INTERVAL_WITHOUT_DATA_MS,
              static_cast<int>(options.keepalive_time_ms));
  c->channel_ = CreateAuthChannel(options.prefill_address, options.auth, args);
  c->stub_ = v1::Prefill::NewStub(c->channel_);
  c->watcher_ = std::thread([self] { self->WatchChannel(); });
  return c;
}

DecodeConnector::~DecodeConnector() {
  Shutdown();
  // Nothing may call into the tracker once this returns: the transport (and its notification
  // thread) goes first, then the registration's memory can no longer be written.
  registration_.reset();
  transport_.reset();
}

Status DecodeConnector::Handshake(Deadline deadline) {
  // One at a time, so that the link the prefill keeps is the one of the last epoch set here.
  std::lock_guard<std::mutex> serial(handshake_call_mu_);
  v1::HandshakeRequest req;
  req.set_decode_instance_id(options_.instance_id);
  req.set_transport_address(transport_->LocalAddress());
  auto* region = req.add_regions();
  region->set_addr(reinterpret_cast<uint64_t>(registration_->region().addr));
  region->set_length(registration_->region().length);
  region->set_key(registration_->RemoteKey());
  req.set_pool_blocks(pool_->num_blocks());
  ToProto(local_, req.mutable_layout());
  req.set_transport_backend(transport_->name());
  req.set_device_id(options_.device_id);
  req.set_session_secret(session_secret_);
  // From now on only the link this handshake makes may notify (set before the call: a call
  // that times out here may still have replaced the prefill's link).
  const uint64_t epoch = ++session_epoch_;
  req.set_session_epoch(epoch);
  verifier_->set_epoch(epoch);

  grpc::ClientContext ctx;
  ctx.set_deadline(ToGrpcDeadline(deadline));
  ctx.set_wait_for_ready(true);  // the prefill may still be starting
  v1::HandshakeResponse resp;
  grpc::Status gs = stub_->Handshake(&ctx, req, &resp);
  if (!gs.ok()) return FromGrpc(gs).WithContext("handshake with prefill " + options_.prefill_address);
  KV_ASSIGN_OR_RETURN(LayoutDescriptor peer, FromProto(resp.layout()));
  KV_RETURN_IF_ERROR(CheckCompatible(local_, peer));
  // Only the connection of the prefill that answered this authenticated call gets in.
  KV_RETURN_IF_ERROR(transport_->Admit(resp.transport_admission())
                         .WithContext("handshake with prefill " + options_.prefill_address));
  {
    std::lock_guard<std::mutex> lock(mu_);
    prefill_instance_id_ = resp.prefill_instance_id();
    peer_device_id_ = resp.device_id();
    ++stats_.handshakes;
  }
  handshake_epoch_.fetch_add(1);
  was_ready_.store(true);
  KV_LOG_INFO << "handshake with prefill " << resp.prefill_instance_id() << " at "
              << options_.prefill_address << " done (" << transport_->name()
              << (!resp.device_id().empty() && resp.device_id() == options_.device_id
                      ? ", prefill computes on this GPU"
                      : "")
              << ")";
  return OkStatus();
}

std::string DecodeConnector::peer_device_id() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peer_device_id_;
}

Status DecodeConnector::EnsureHandshake(Deadline deadline) {
  // A channel whose connection failed (the prefill went away, perhaps to restart on the same
  // address) fails every call at once until gRPC's backoff ends, and the session may be gone
  // with the old process: treat it as the loss it is now, rather than when the watcher's
  // reconnect window runs out, so that this load reconnects and handshakes at once.
  if (handshake_epoch_.load() != 0 && channel_->GetState(false) == GRPC_CHANNEL_TRANSIENT_FAILURE)
    MarkPeerLost("connection to " + options_.prefill_address + " failed");
  if (handshake_epoch_.load() != 0) return OkStatus();
  const Clock::time_point asked = Clock::now();
  std::lock_guard<std::mutex> lock(handshake_mu_);
  if (handshake_epoch_.load() != 0) return OkStatus();
  if (was_ready_.load()) return HandshakeAfterLoss(asked, deadline);
  auto backoff = std::chrono::milliseconds(50);
  Status last;
  while (true) {
    Deadline attempt = std::min(deadline, DeadlineAfterMs(options_.handshake_timeout_ms));
    last = Handshake(attempt);
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_handshake_error_ = last;
    }
    if (last.ok()) return last;
    // A refused layout will not change by retrying.
    if (last.code() == StatusCode::kFailedPrecondition || last.code() == StatusCode::kInvalidArgument)
      return last;
    if (Clock::now() + backoff >= deadline) return last;
    KV_LOG_WARN << last.ToString() << "; retrying";
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
}

Status DecodeConnector::HandshakeAfterLoss(Clock::time_point asked, Deadline deadline) {
  std::string why;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // An attempt ended while this load queued for it: its answer is this load's too.
    if (lost_attempt_end_ >= asked) return lost_attempt_status_;
    why = lost_why_;
  }
  // Connect now, not when gRPC's reconnect backoff would.
  grpc::experimental::ChannelResetConnectionBackoff(channel_.get());
  Status s;
  const Deadline connect_by = std::min(deadline, DeadlineAfterMs(options_.reconnect_wait_ms));
  if (!channel_->WaitForConnected(ToGrpcDeadline(connect_by))) {
    s = Unavailable("prefill " + options_.prefill_address + " lost (" + why +
                    ") and not connectable again within " +
                    std::to_string(options_.reconnect_wait_ms) + " ms");
  } else {
    s = Handshake(std::min(deadline, DeadlineAfterMs(options_.handshake_timeout_ms)));
    if (s.code() == StatusCode::kTimeout) s = Unavailable(s.message());
  }
  std::lock_guard<std::mutex> lock(mu_);
  lost_attempt_end_ = Clock::now();
  lost_attempt_status_ = s;
  last_handshake_error_ = s;
  return s;
}

void DecodeConnector::MarkPeerLost(const std::string& why) {
  // Only a valid handshake is invalidated; the next load handshakes again.
  if (handshake_epoch_.load() == 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    lost_why_ = why;  // before the epoch: a load that sees none valid finds the reason
  }
  if (handshake_epoch_.exchange(0) != 0) {
    KV_LOG_WARN << "prefill peer lost: " << why;
  }
}

void DecodeConnector::WatchChannel() {
  grpc_connectivity_state last = channel_->GetState(false);
  while (!stop_watching_.load()) {
    const auto until = std::chrono::system_clock::now() + std::chrono::milliseconds(100);
    if (!channel_->WaitForStateChange(last, until)) continue;
    if (last == GRPC_CHANNEL_READY && channel_->GetState(false) != GRPC_CHANNEL_READY) {
      // Killed, stopped (keepalive), cut, or only closed while idle by the server: the last
      // connects again at once.
      const Deadline reconnect_by = DeadlineAfterMs(options_.reconnect_wait_ms);
      if (!channel_->WaitForConnected(ToGrpcDeadline(reconnect_by)))
        MarkPeerLost("connection to " + options_.prefill_address +
                     " closed or unanswered, and not connectable again within " +
                     std::to_string(options_.reconnect_wait_ms) + " ms");
    }
    last = channel_->GetState(false);
  }
}

Status DecodeConnector::StartLoad(uint64_t request_id, std::vector<int32_t> tokens,
                                  std::vector<int32_t> dest_blocks, bool pipelined,
                                  Deadline deadline, std::shared_ptr<const void> keepalive,
                                  int skip_blocks, std::string cache_salt) {
  if (tokens.empty()) return InvalidArgument("start_load: no tokens");
  const int need = model::BlocksForTokens(static_cast<int>(tokens.size()), local_.layout.block_size);
  if (static_cast<int>(dest_blocks.size()) < need)
    return InvalidArgument("start_load: dest blocks do not cover the tokens");
  if (skip_blocks < 0 || skip_blocks >= need)
    return InvalidArgument("start_load: skip_blocks " + std::to_string(skip_blocks) +
                           " out of range [0, " + std::to_string(need) + ")");
  for (int32_t b : dest_blocks)
    if (b < 0 || b >= pool_->num_blocks()) return InvalidArgument("start_load: block id out of range");
  auto load = std::make_shared<Load>();
  load->id = request_id;
  load->tokens = std::move(tokens);
  load->dest = std::move(dest_blocks);
  load->pipelined = pipelined;
  load->skip_blocks = skip_blocks;
  load->cache_salt = std::move(cache_salt);
  load->deadline = deadline;
  load->keepalive = std::move(keepalive);
  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_) return Unavailable("decode connector is shutting down");
  if (loads_.count(request_id)) return AlreadyExists("request " + std::to_string(request_id) + " is loading");
  KV_RETURN_IF_ERROR(tracker_.Begin(request_id, local_.layout.num_layers));
  ReapLocked();
  loads_[request_id] = load;
  ++stats_.loads_started;
  load->thread = std::thread([this, load] { RunLoad(load); });
  return OkStatus();
}

void DecodeConnector::RunLoad(std::shared_ptr<Load> load) {
  const uint64_t id = load->id;
  Status st = EnsureHandshake(load->deadline);
  bool call_started = false;
  bool quiesced = false;
  LoadResult info;
  // Where the transport notifies, the prefill's word about a layer counts for nothing.
  const bool own_notifications = transport_->capabilities().notifications;
  for (int attempt = 0; st.ok() && attempt < 2; ++attempt) {
    v1::PrefillRequest req;
    req.set_decode_instance_id(options_.instance_id);
    req.set_request_id(id);
    *req.mutable_tokens() = {load->tokens.begin(), load->tokens.end()};
    *req.mutable_dest_blocks() = {load->dest.begin(), load->dest.end()};
    req.set_pipelined(load->pipelined);
    req.set_skip_blocks(load->skip_blocks);
    req.set_cache_salt(load->cache_salt);
    req.set_session_secret(session_secret_);
    auto ctx = std::make_shared<grpc::ClientContext>();
    ctx->set_deadline(ToGrpcDeadline(load->deadline));
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (load->cancel_requested) {
        st = Canceled("request " + std::to_string(id) + " finished before its load started");
        break;
      }
      load->ctx = ctx;
      load->call_sent = Clock::now();
      load->accepted_at = {};
      load->call_ended = false;
      ++load->attempts;
    }
    call_started = true;
    KV_LOG_DEBUG << "[req " << id << "] start_load: Prefill call to " << options_.prefill_address
                 << " (" << load->tokens.size() << " tokens, " << load->dest.size() << " blocks"
                 << (attempt > 0 ? ", retry" : "") << ")";
    auto reader = stub_->Prefill(ctx.get(), req);
    v1::PrefillProgress msg;
    while (reader->Read(&msg)) {
      if (msg.accepted()) {
        KV_LOG_DEBUG << "[req " << id << "] prefill accepted the request";
        std::lock_guard<std::mutex> lock(mu_);
        load->accepted_at = Clock::now();
      } else if (msg.done()) {
        info.kv_bytes = msg.kv_bytes();
        info.prefill_compute_us = msg.prefill_compute_us();
        info.transfer_us = msg.transfer_us();
        info.transfer_exposed_us = msg.transfer_exposed_us();
        info.cached_tokens = msg.cached_tokens();
      } else if (!own_notifications) {
        tracker_.OnLanded(id, msg.layer());
      }
    }
    grpc::Status gs = reader->Finish();
    const auto& trailers = ctx->GetServerTrailingMetadata();
    auto it = trailers.find(kQuiescedTrailer);
    quiesced = it != trailers.end() && it->second == "1";
    st = FromGrpc(gs);
    {
      std::lock_guard<std::mutex> lock(mu_);
      load->ctx.reset();
      load->call_ended = true;
      load->call_status = st;
    }
    KV_LOG_DEBUG << "[req " << id << "] Prefill call ended: " << st.ToString()
                 << (quiesced ? " (writes quiesced)" : "");
    if (!st.ok() && quiesced && st.code() == StatusCode::kFailedPrecondition &&
        st.message().find("handshake") != std::string::npos && attempt == 0) {
      // The prefill restarted (or dropped our link): handshake again and retry once.
      MarkPeerLost(st.message());
      st = EnsureHandshake(load->deadline);
      call_started = false;
      quiesced = false;
      continue;
    }
    break;
  }
  if (st.ok()) st = AwaitOwnNotifications(*load);
  if (st.ok()) {
    // Every layer notified and the prefill confirmed every write complete: no layer of it needs
    // a GPU wait any more (and a wait must not fail because the writer's connection has closed
    // since).
    DropEarly(id);
  } else {
    tracker_.Fail(id, st.WithContext("loading KV of request " + std::to_string(id) + " from prefill"));
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (load->all_landed) quiesced = true;
    }
    if (call_started && !quiesced) {
      // The writer may still be writing into our blocks: ask it to stop and confirm.
      v1::CancelRequest creq;
      creq.set_decode_instance_id(options_.instance_id);
      creq.set_request_id(id);
      creq.set_session_secret(session_secret_);
      grpc::ClientContext cctx;
      cctx.set_deadline(ToGrpcDeadline(DeadlineAfterMs(options_.cancel_timeout_ms)));
      v1::CancelResponse cresp;
      grpc::Status cs = stub_->Cancel(&cctx, creq, &cresp);
      if (cs.ok() && cresp.stopped()) {
        quiesced = true;
      } else {
        MarkPeerLost("cancel of request " + std::to_string(id) + " failed: " + cs.error_message());
        {
          std::lock_guard<std::mutex> lock(mu_);
          stats_.quarantined_blocks += static_cast<int>(load->dest.size());
        }
        KV_LOG_WARN << "[req " << id << "] prefill unreachable; holding " << load->dest.size()
                    << " blocks for " << options_.quarantine_ms << " ms before reuse";
        std::this_thread::sleep_for(std::chrono::milliseconds(options_.quarantine_ms));
        std::lock_guard<std::mutex> lock(mu_);
        stats_.quarantined_blocks -= static_cast<int>(load->dest.size());
      }
    }
    if (st.code() == StatusCode::kUnavailable || st.code() == StatusCode::kRemoteDisconnect)
      MarkPeerLost(st.message());
  }
  load->keepalive.reset();
  if (st.ok() && on_load_done_) on_load_done_(info);
  std::lock_guard<std::mutex> lock(mu_);
  load->result_ready = true;
  load->result = st;
  load->info = info;
  load->done = true;
  if (st.ok()) {
    ++stats_.loads_ok;
    stats_.kv_bytes += info.kv_bytes;
  } else {
    ++stats_.loads_failed;
  }
  finished_threads_.push_back(std::move(load->thread));
  if (load->finished) loads_.erase(id);
  cv_.notify_all();
}

Status DecodeConnector::AwaitOwnNotifications(const Load& load) {
  const Deadline grace = std::min(load.deadline, DeadlineAfterMs(options_.cancel_timeout_ms));
  std::string missing;
  for (int l = 0; l < local_.layout.num_layers; ++l) {
    Status s = tracker_.WaitForLayer(load.id, l, grace);
    if (s.ok()) continue;
    if (s.code() == StatusCode::kNotFound) {
      // The engine finished with the request first (Finished() noted whether all had landed).
      std::lock_guard<std::mutex> lock(mu_);
      if (load.finished && load.all_landed) return OkStatus();
      return Canceled("request " + std::to_string(load.id) + " finished before its load landed");
    }
    if (s.code() != StatusCode::kTimeout) return s;
    missing += (missing.empty() ? "" : ",") + std::to_string(l);
  }
  if (missing.empty()) return OkStatus();
  KV_LOG_WARN << "[req " << load.id << "] the prefill reported the load complete, but layers "
              << missing << " were never notified here";
  return DataLoss("the prefill reported request " + std::to_string(load.id) +
                  " complete, but no notification of layers " + missing + " reached this decode");
}

Status DecodeConnector::WaitForLayer(uint64_t request_id, int layer, Deadline deadline) {
  Status s = tracker_.WaitForLayer(request_id, layer, deadline);
  if (s.code() != StatusCode::kTimeout) return s;
  return Status(s.code(), s.message() + ": " + DescribeLoad(request_id));
}

std::string DecodeConnector::DescribeLoad(uint64_t request_id) const {
  auto secs = [](Clock::time_point since) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.1f s", std::chrono::duration<double>(Clock::now() - since).count());
    return std::string(buf);
  };
  std::string landed;
  int n_landed = 0;
  for (int l = 0; l < local_.layout.num_layers; ++l) {
    if (!tracker_.IsLanded(request_id, l)) continue;
    landed += (n_landed++ ? "," : "") + std::to_string(l);
  }
  std::string out = "layers landed " + std::to_string(n_landed) + " of " +
                    std::to_string(local_.layout.num_layers) +
                    (n_landed ? " (" + landed + ")" : "") + "; prefill " + options_.prefill_address;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = loads_.find(request_id);
  if (it == loads_.end()) return out + ": no load of this request";
  const Load& load = *it->second;
  if (load.attempts == 0) {
    return out + ": no Prefill call made yet (handshake pending " + secs(load.started) +
           (last_handshake_error_.ok() ? ", no attempt answered yet"
                                       : "; last attempt: " + last_handshake_error_.ToString()) +
           ")";
  }
  const std::string call =
      load.call_ended ? "Prefill call ended: " + load.call_status.ToString() : "Prefill call still open";
  if (load.accepted_at == Clock::time_point{}) {
    out += " never acknowledged the request (sent " + secs(load.call_sent) + " ago; " + call + ")";
  } else {
    out += " acknowledged the request " + secs(load.accepted_at) + " ago (" + call + ")";
  }
  if (load.attempts > 1) out += " after a retry";
  return out;
}

Status DecodeConnector::WaitForLayerOnStream(uint64_t request_id, int layer, void* stream,
                                             Deadline deadline) {
  KV_RETURN_IF_ERROR(tracker_.WaitForLayer(request_id, layer, deadline));
  transport::Notification n;
  {
    std::lock_guard<std::mutex> lock(early_mu_);
    auto it = early_.find({request_id, layer});
    if (it == early_.end()) return OkStatus();  // a late notification or the final confirmation
    n = it->second;
  }
  return transport_->StreamWaitLanded(n, stream, deadline)
      .WithContext("waiting on the GPU for layer " + std::to_string(layer) + " of request " +
                   std::to_string(request_id));
}

Status DecodeConnector::ConfirmLandedOnStream(uint64_t request_id) {
  std::vector<transport::Notification> early;
  {
    std::lock_guard<std::mutex> lock(early_mu_);
    for (auto it = early_.lower_bound({request_id, std::numeric_limits<int>::min()});
         it != early_.end() && it->first.first == request_id; ++it) {
      early.push_back(it->second);
    }
  }
  // None left: late notifications only, or the prefill confirmed every write complete.
  for (const transport::Notification& n : early) KV_RETURN_IF_ERROR(transport_->ConfirmLanded(n));
  return OkStatus();
}

Result<LoadResult> DecodeConnector::WaitForLoad(uint64_t request_id, Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    auto it = loads_.find(request_id);
    if (it == loads_.end()) return NotFound("request " + std::to_string(request_id) + " has no load");
    if (it->second->result_ready) {
      if (!it->second->result.ok()) return it->second->result;
      return it->second->info;
    }
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout)
      return Timeout("load of request " + std::to_string(request_id) + " not finished");
  }
}

bool DecodeConnector::DropEarly(uint64_t request_id) {
  std::lock_guard<std::mutex> lock(early_mu_);
  bool any = false;
  auto it = early_.lower_bound({request_id, std::numeric_limits<int>::min()});
  while (it != early_.end() && it->first.first == request_id) {
    any = true;
    it = early_.erase(it);
  }
  return any;
}

void DecodeConnector::Finished(uint64_t request_id) {
  // Early notifications say "enqueued", not "complete": a request that still has some may have
  // writes in flight, so it must not count as quiesced below.
  const bool early = DropEarly(request_id);
  const bool all_landed = tracker_.AllLanded(request_id) && !early;
  tracker_.Finish(request_id);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = loads_.find(request_id);
  if (it == loads_.end()) return;
  Load& load = *it->second;
  load.finished = true;
  if (load.done) {
    loads_.erase(it);
    return;
  }
  load.cancel_requested = true;
  load.all_landed = all_landed;
  if (load.ctx) load.ctx->TryCancel();
}

void DecodeConnector::ReapLocked() {
  for (auto& t : finished_threads_)
    if (t.joinable()) t.join();
  finished_threads_.clear();
}

void DecodeConnector::Shutdown() {
  stop_watching_.store(true);
  if (watcher_.joinable()) watcher_.join();
  std::unique_lock<std::mutex> lock(mu_);
  shutting_down_ = true;
  for (auto& [id, load] : loads_) {
    load->cancel_requested = true;
    if (load->ctx) load->ctx->TryCancel();
  }
  auto bound = DeadlineAfterMs(options_.cancel_timeout_ms + options_.quarantine_ms + 2000);
  cv_.wait_until(lock, bound, [&] {
    for (auto& [id, load] : loads_)
      if (!load->done) return false;
    return true;
  });
  std::vector<std::thread> stuck;
  for (auto& [id, load] : loads_)
    if (!load->done && load->thread.joinable()) stuck.push_back(std::move(load->thread));
  ReapLocked();
  lock.unlock();
  // A thread past the bound still holds its blocks; joining keeps them from being freed early.
  for (auto& t : stuck) t.join();
}

DecodeConnectorStats DecodeConnector::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  DecodeConnectorStats s = stats_;
  s.stale_signals_ignored = tracker_.ignored_signals();
  s.data_connections_refused = transport_->counters().connections_refused;
  s.notifications_dropped = verifier_->dropped();
  int in_flight = 0;
  for (auto& [id, load] : loads_)
    if (!load->done) ++in_flight;
  s.loads_in_flight = in_flight;
  return s;
}

}  // namespace kvstream::connector
