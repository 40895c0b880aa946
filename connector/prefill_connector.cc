#include "connector/prefill_connector.h"

#include <algorithm>
#include <thread>

#include "common/log.h"
#include "connector/notification_mac.h"

namespace kvstream::connector {

// ---- PeerLink -------------------------------------------------------------------------------

Status PeerLink::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!endpoint_) return RemoteDisconnect("link to " + decode_id_ + " torn down: " + torn_down_why_);
  return endpoint_->status();
}

Result<std::unique_ptr<transport::WriteHandle>> PeerLink::Write(
    const transport::WriteRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!endpoint_) return RemoteDisconnect("link to " + decode_id_ + " torn down: " + torn_down_why_);
  return endpoint_->Write(request);
}

void PeerLink::TearDown(const std::string& why) {
  std::unique_ptr<transport::Endpoint> ep;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!endpoint_) return;
    torn_down_why_ = why;
    ep = std::move(endpoint_);
  }
  KV_LOG_WARN << "tearing down link to " << decode_id_ << ": " << why;
  ep.reset();
}

std::array<uint8_t, transport::kNotificationMacBytes> PeerLink::NotificationTag(
    uint64_t request_id, int layer) const {
  return ComputeNotificationMac(secret_, decode_id_, request_id, layer, epoch_);
}

// ---- SaveRequest ----------------------------------------------------------------------------

Status SaveRequest::SaveLayer(int layer, void* after_stream) {
  if (layer < 0 || layer >= layout_.num_layers)
    return InvalidArgument("save_layer: layer " + std::to_string(layer) + " out of range");
  transport::WriteRequest wr;
  wr.local = local_reg_;
  wr.remote_region = 0;
  wr.ops = LayerCopyOps(layout_, layer, local_pool_blocks_, local_blocks_,
                        link_->remote_pool_blocks(), remote_blocks_);
  wr.notify = true;
  wr.notification.request_id = request_id_;
  wr.notification.layer = layer;
  wr.notification.mac = link_->NotificationTag(request_id_, layer);
  wr.after_stream = after_stream;
  uint64_t bytes = 0;
  for (const auto& op : wr.ops) bytes += op.length;
  // Posting happens under mu_ so that Cancel()/Quiesce() see either no post or a recorded one.
  std::lock_guard<std::mutex> lock(mu_);
  if (cancelled_) return Canceled("request " + std::to_string(request_id_) + " was cancelled");
  if (!first_error_.ok()) return first_error_;
  auto handle = link_->Write(wr);
  if (!handle.ok()) {
    first_error_ = handle.status().WithContext("writing layer " + std::to_string(layer));
    return first_error_;
  }
  if (posted_.empty()) first_post_ = Clock::now();
  posted_.push_back(Posted{layer, std::move(handle).value()});
  bytes_ += bytes;
  KV_LOG_DEBUG << "[req " << request_id_ << "] layer " << layer << " posted: " << wr.ops.size()
               << " copies, " << bytes << " bytes";
  return OkStatus();
}

bool SaveRequest::AllDoneLocked() {
  bool all = true;
  for (auto& p : posted_) {
    if (p.done) continue;
    if (p.handle->Done()) {
      p.done = true;
      last_done_ = Clock::now();
      Status s = p.handle->Wait(Clock::now());
      KV_LOG_DEBUG << "[req " << request_id_ << "] layer " << p.layer << " written and notified: "
                   << s.ToString();
      if (!s.ok() && first_error_.ok())
        first_error_ = s.WithContext("layer " + std::to_string(p.layer) + " write");
    } else {
      all = false;
    }
  }
  return all;
}

Status SaveRequest::WaitForSave(Deadline deadline) {
  // Polling keeps handles touched only under mu_, so Cancel() from another thread is safe.
  auto sleep = std::chrono::microseconds(20);
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (AllDoneLocked()) return first_error_;
      if (!first_error_.ok()) return first_error_;
    }
    if (Clock::now() >= deadline) {
      std::string pending;
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (auto& p : posted_)
          if (!p.done) pending += (pending.empty() ? "" : ",") + std::to_string(p.layer);
      }
      return Timeout("wait_for_save: writes of request " + std::to_string(request_id_) +
                     " not complete at the deadline (layers still in flight: " + pending + ")");
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min<std::chrono::microseconds>(sleep * 2, std::chrono::microseconds(500));
  }
}

std::vector<int> SaveRequest::TakeCompletedLayers() {
  std::lock_guard<std::mutex> lock(mu_);
  AllDoneLocked();
  std::vector<int> layers;
  // In order: a layer is reported only when every earlier posted write is done too.
  for (auto& p : posted_) {
    if (!p.done) break;
    if (p.reported) continue;
    if (!p.handle->Wait(Clock::now()).ok()) break;
    p.reported = true;
    layers.push_back(p.layer);
  }
  return layers;
}

void SaveRequest::Quiesce(Deadline deadline, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
  }
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (AllDoneLocked()) return;
    }
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  // The writes did not finish in time: the only way to guarantee they stop is to destroy the
  // endpoint that carries them (the decode instance will handshake again).
  link_->TearDown("request " + std::to_string(request_id_) + ": " + why +
                  "; writes still in flight at the deadline");
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& p : posted_) p.done = true;
  if (first_error_.ok()) first_error_ = Canceled("writes stopped by tearing down the link");
}

bool SaveRequest::cancelled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

uint64_t SaveRequest::bytes_posted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

int64_t SaveRequest::transfer_us() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (posted_.empty() || last_done_ < first_post_) return 0;
  return std::chrono::duration_cast<std::chrono::microseconds>(last_done_ - first_post_).count();
}

// ---- PrefillConnector -----------------------------------------------------------------------

Result<std::unique_ptr<PrefillConnector>> PrefillConnector::Create(
    std::unique_ptr<transport::Transport> transport, model::KvPool* pool, LayoutDescriptor local) {
  if (!transport || !pool) return InvalidArgument("PrefillConnector: transport and pool required");
  if (!(pool->layout() == local.layout))
    return InvalidArgument("PrefillConnector: pool layout differs from the descriptor");
  std::unique_ptr<PrefillConnector> c(new PrefillConnector());
  transport::MemoryRegion region;
  region.addr = pool->base();
  region.length = pool->memory().size();
  region.kind = pool->memory().on_device() ? transport::MemoryKind::kCuda : transport::MemoryKind::kHost;
  region.device = pool->memory().device();
  KV_ASSIGN_OR_RETURN(c->registration_, transport->Register(region));
  c->transport_ = std::move(transport);
  c->pool_ = pool;
  c->local_ = std::move(local);
  return c;
}

PrefillConnector::~PrefillConnector() {
  CancelAll(DeadlineAfterMs(2000));
  // Links (endpoints) go before the registration, the registration before the transport.
  {
    std::lock_guard<std::mutex> lock(mu_);
    active_.clear();
    peers_.clear();
  }
  registration_.reset();
  transport_.reset();
}

std::string PrefillConnector::Scoped(const std::string& peer_identity,
                                     const std::string& decode_id) {
  if (peer_identity.empty()) return decode_id;
  return std::to_string(peer_identity.size()) + ":" + peer_identity + ":" + decode_id;
}

PrefillConnector::Session PrefillConnector::CheckSession(const std::string& decode_id,
                                                        const std::string& secret,
                                                        const std::string& peer_identity) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(Scoped(peer_identity, decode_id));
  if (it == sessions_.end()) return Session::kNone;
  if (SecretsEqual(secret, it->second)) return Session::kMatch;
  ++sessions_refused_;
  return Session::kMismatch;
}

Status PrefillConnector::AcceptPeer(const std::string& decode_id,
                                    const std::string& session_secret,
                                    const LayoutDescriptor& peer_layout,
                                    const transport::PeerDescriptor& peer, int peer_pool_blocks,
                                    std::string* admission_ticket, uint64_t session_epoch,
                                    const std::string& peer_identity) {
  KV_RETURN_IF_ERROR(CheckCompatible(local_, peer_layout));
  if (decode_id.empty()) return InvalidArgument("handshake: decode_instance_id is empty");
  if (session_secret.size() < kSessionSecretBytes || session_secret.size() > kMaxSessionSecretBytes)
    return InvalidArgument("handshake: session_secret must hold " +
                           std::to_string(kSessionSecretBytes) + " to " +
                           std::to_string(kMaxSessionSecretBytes) + " bytes, got " +
                           std::to_string(session_secret.size()));
  // Refused before connecting anywhere: a foreign handshake under a bound id touches nothing.
  if (CheckSession(decode_id, session_secret, peer_identity) == Session::kMismatch)
    return FailedPrecondition("handshake refused: decode instance '" + decode_id +
                              "' belongs to another session");
  if (peer.regions.empty()) return InvalidArgument("handshake: no memory region of the decode pool");
  if (peer_pool_blocks <= 0) return InvalidArgument("handshake: pool_blocks must be > 0");
  uint64_t need = local_.layout.pool_bytes(peer_pool_blocks);
  if (peer.regions[0].length < need)
    return InvalidArgument("handshake: decode pool region is " + std::to_string(peer.regions[0].length) +
                           " bytes, the layout needs " + std::to_string(need));
  auto link = std::make_shared<PeerLink>();
  link->decode_id_ = decode_id;
  link->remote_pool_blocks_ = peer_pool_blocks;
  link->secret_ = session_secret;
  link->epoch_ = session_epoch;
  auto ep = transport_->Connect(peer);
  if (!ep.ok()) return ep.status().WithContext("connecting to decode " + decode_id);
  link->endpoint_ = std::move(ep).value();
  if (admission_ticket != nullptr) *admission_ticket = link->endpoint_->AdmissionTicket();
  std::lock_guard<std::mutex> lock(mu_);
  // Bound and checked again under the lock: of two first handshakes racing, one wins.
  const std::string key = Scoped(peer_identity, decode_id);
  auto [sit, bound] = sessions_.try_emplace(key, session_secret);
  if (!bound && !SecretsEqual(session_secret, sit->second)) {
    ++sessions_refused_;
    return FailedPrecondition("handshake refused: decode instance '" + decode_id +
                              "' belongs to another session");
  }
  peers_[key] = std::move(link);
  ++handshakes_;
  return OkStatus();
}

Result<std::shared_ptr<SaveRequest>> PrefillConnector::BeginSave(
    const std::string& decode_id, uint64_t request_id, int num_tokens,
    std::vector<int32_t> local_blocks, std::vector<int32_t> remote_blocks,
    const std::string& peer_identity, int skip_blocks) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string scoped = Scoped(peer_identity, decode_id);
  auto pit = peers_.find(scoped);
  if (pit == peers_.end())
    return FailedPrecondition("unknown decode instance '" + decode_id + "': handshake first");
  if (Status s = pit->second->status(); !s.ok()) {
    peers_.erase(pit);
    return FailedPrecondition("link to decode instance '" + decode_id + "' lost (" + s.message() +
                              "): handshake again");
  }
  const int bs = local_.layout.block_size;
  const int need = model::BlocksForTokens(num_tokens, bs);
  if (num_tokens <= 0) return InvalidArgument("no tokens to prefill");
  if (static_cast<int>(remote_blocks.size()) < need)
    return InvalidArgument("dest_blocks: " + std::to_string(remote_blocks.size()) +
                           " blocks for " + std::to_string(num_tokens) + " tokens, need " +
                           std::to_string(need));
  if (static_cast<int>(local_blocks.size()) < need)
    return InvalidArgument("local blocks do not cover the tokens");
  const int rpb = pit->second->remote_pool_blocks();
  for (int i = 0; i < need; ++i) {
    if (remote_blocks[i] < 0 || remote_blocks[i] >= rpb)
      return InvalidArgument("dest block id " + std::to_string(remote_blocks[i]) +
                             " out of range [0, " + std::to_string(rpb) + ")");
    if (local_blocks[i] < 0 || local_blocks[i] >= pool_->num_blocks())
      return InvalidArgument("local block id out of range");
  }
  if (skip_blocks < 0 || skip_blocks >= need)
    return InvalidArgument("skip_blocks " + std::to_string(skip_blocks) + " out of range [0, " +
                           std::to_string(need) + ") for " + std::to_string(num_tokens) +
                           " tokens");
  remote_blocks.resize(need);
  local_blocks.resize(need);
  remote_blocks.erase(remote_blocks.begin(), remote_blocks.begin() + skip_blocks);
  local_blocks.erase(local_blocks.begin(), local_blocks.begin() + skip_blocks);
  Key key{scoped, request_id};
  // Expired tombstones go lazily.
  for (auto it = tombstones_.begin(); it != tombstones_.end();)
    it = Clock::now() > it->second ? tombstones_.erase(it) : std::next(it);
  if (tombstones_.count(key))
    return Canceled("request " + std::to_string(request_id) + " was cancelled before it started");
  if (active_.count(key)) return AlreadyExists("request " + std::to_string(request_id) + " is running");
  auto r = std::make_shared<SaveRequest>();
  r->request_id_ = request_id;
  r->layout_ = local_.layout;
  r->local_pool_blocks_ = pool_->num_blocks();
  r->local_reg_ = registration_.get();
  r->link_ = pit->second;
  r->local_blocks_ = std::move(local_blocks);
  r->remote_blocks_ = std::move(remote_blocks);
  active_[key] = r;
  return r;
}

void PrefillConnector::EndSave(const std::string& decode_id, uint64_t request_id,
                               const std::string& peer_identity) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = active_.find({Scoped(peer_identity, decode_id), request_id});
  if (it == active_.end()) return;
  bytes_written_ += it->second->bytes_posted();
  active_.erase(it);
}

PrefillConnector::CancelResult PrefillConnector::Cancel(const std::string& decode_id,
                                                         uint64_t request_id, Deadline deadline,
                                                         const std::string& peer_identity) {
  std::shared_ptr<SaveRequest> r;
  const std::string scoped = Scoped(peer_identity, decode_id);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = active_.find({scoped, request_id});
    if (it == active_.end()) {
      tombstones_[{scoped, request_id}] = Clock::now() + std::chrono::minutes(5);
      return CancelResult{false, true};
    }
    r = it->second;
  }
  r->Quiesce(deadline, "cancelled");
  return CancelResult{true, true};
}

void PrefillConnector::CancelAll(Deadline deadline) {
  std::vector<std::shared_ptr<SaveRequest>> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [k, r] : active_) all.push_back(r);
  }
  for (auto& r : all) r->Quiesce(deadline, "prefill shutting down");
}

PrefillConnectorStats PrefillConnector::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  PrefillConnectorStats s;
  s.handshakes = handshakes_;
  s.bytes_written = bytes_written_;
  s.sessions_refused = sessions_refused_;
  s.peers = peers_.size();
  s.active = active_.size();
  return s;
}

}  // namespace kvstream::connector
