// PrefillConnector: the save side of the KV connector (what the prefill engine calls).
//
//   AcceptPeer        handshake from a decode instance: check the layout, connect an endpoint to
//                     its registered pool, bind the instance id to its session secret.
//   BeginSave         one request: which local blocks hold its KV, which decode blocks receive it.
//   SaveRequest::SaveLayer(l)    save_layer: post layer l's writes (coalesced runs of blocks),
//                     followed by the notification (request, l), delivered after the data.
//   SaveRequest::WaitForSave(d)  wait_for_save: every posted write complete at the destination.
//   Cancel            stop a request: no write is posted after it returns, and it returns only
//                     once nothing posted is still in flight (writes completed, or the endpoint
//                     that could write was torn down at the deadline).
//
// Ownership: the connector never owns blocks; the caller keeps its local blocks unchanged until
// Quiesce()/WaitForSave() returned (the transport reads them asynchronously).
// Thread-safe: SaveLayer/WaitForSave come from the request's thread, Cancel from any thread.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/time.h"
#include "connector/handshake.h"
#include "model/kv_cache.h"
#include "transport/transport.h"

namespace kvstream::connector {

// Coalesced copy list for one layer: local block local_blocks[i] -> remote block
// remote_blocks[i]; neighbouring ids on both sides merge into one CopyOp.
std::vector<transport::CopyOp> LayerCopyOps(const model::KvLayout& layout, int layer,
                                            int local_pool_blocks,
                                            const std::vector<int32_t>& local_blocks,
                                            int remote_pool_blocks,
                                            const std::vector<int32_t>& remote_blocks);

class PrefillConnector;

// One connected decode instance.
class PeerLink {
 public:
  const std::string& decode_id() const { return decode_id_; }
  int remote_pool_blocks() const { return remote_pool_blocks_; }
  // OK while connected; kRemoteDisconnect after a transport error or TearDown().
  Status status() const;
  Result<std::unique_ptr<transport::WriteHandle>> Write(const transport::WriteRequest& request);
  // After this returns nothing more lands in the peer's memory through this link.
  void TearDown(const std::string& why);
  // The MAC a notification of (request, layer) through this link carries (notification_mac.h).
  std::array<uint8_t, transport::kNotificationMacBytes> NotificationTag(uint64_t request_id,
                                                                        int layer) const;

 private:
  friend class PrefillConnector;
  std::string decode_id_;
  int remote_pool_blocks_ = 0;
  mutable std::mutex mu_;
  std::unique_ptr<transport::Endpoint> endpoint_;
  std::string torn_down_why_;
  std::string secret_;       // of the session: keys the notification MACs
  uint64_t epoch_ = 0;       // HandshakeRequest.session_epoch of the handshake that made it
};

class SaveRequest {
 public:
  uint64_t request_id() const { return request_id_; }
  // kCanceled after Cancel(); the link's error if the peer is lost. `after_stream` (GPU pools):
  // the cudaStream_t the layer's KV was computed on; the copy waits for the work enqueued on it
  // so far without blocking this thread (transport::WriteRequest::after_stream). nullptr: the
  // KV is complete now.
  Status SaveLayer(int layer, void* after_stream = nullptr);
  // Every posted write complete at the destination; the first write error; kTimeout.
  Status WaitForSave(Deadline deadline);
  // Layers whose writes (and notifications) completed since the last call, in order.
  std::vector<int> TakeCompletedLayers();
  // Stops posting; waits for in-flight writes until `deadline`, then tears the link down.
  // Afterwards nothing of this request is in flight.
  void Quiesce(Deadline deadline, const std::string& why);
  bool cancelled() const;
  uint64_t bytes_posted() const;
  // First post -> last completion observed (us); 0 if nothing was posted.
  int64_t transfer_us() const;

 private:
  friend class PrefillConnector;
  bool AllDoneLocked();
  uint64_t request_id_ = 0;
  model::KvLayout layout_;
  int local_pool_blocks_ = 0;
  const transport::Registration* local_reg_ = nullptr;
  std::shared_ptr<PeerLink> link_;
  std::vector<int32_t> local_blocks_, remote_blocks_;
  mutable std::mutex mu_;
  bool cancelled_ = false;
  struct Posted {
    int layer;
    std::unique_ptr<transport::WriteHandle> handle;
    bool reported = false;
    bool done = false;
  };
  std::vector<Posted> posted_;
  uint64_t bytes_ = 0;
  Clock::time_point first_post_{}, last_done_{};
  Status first_error_;
};

struct PrefillConnectorStats {
  uint64_t handshakes = 0;
  uint64_t bytes_written = 0;
  uint64_t sessions_refused = 0;  // handshakes, prefills and cancels with a wrong secret
  size_t peers = 0;
  size_t active = 0;
};

class PrefillConnector {
 public:
  // Registers `pool`'s memory with the transport (the source of every write). `pool` must
  // outlive the connector.
  static Result<std::unique_ptr<PrefillConnector>> Create(
      std::unique_ptr<transport::Transport> transport, model::KvPool* pool,
      LayoutDescriptor local);
  ~PrefillConnector();

  const LayoutDescriptor& local_layout() const { return local_; }
  transport::Transport& transport() { return *transport_; }

  // Checks compatibility (kFailedPrecondition naming the field) and connects. The first
  // accepted handshake of a decode instance binds its id to `session_secret` for the life of
  // this connector; a later one with another secret is refused (kFailedPrecondition) and
  // changes nothing. A new handshake with the same secret replaces the link; requests in
  // flight keep the old one. kInvalidArgument: a secret shorter than kSessionSecretBytes.
  // `admission_ticket` (if given) receives the new endpoint's AdmissionTicket(), which the
  // decode must admit (HandshakeResponse.transport_admission). Every notification through the
  // link carries the MAC of (decode_id, request, layer, session_epoch) keyed by the secret.
  //
  // Identity: every call below takes the authenticated identity of its caller (`peer_identity`,
  // daemon::Authorizer::PeerName; "" where calls are not authenticated). A session belongs to
  // the identity that made it: the same decode id under another identity is another session,
  // so a peer cannot claim (or act in) the session of a decode id that another identity uses.
  Status AcceptPeer(const std::string& decode_id, const std::string& session_secret,
                    const LayoutDescriptor& peer_layout, const transport::PeerDescriptor& peer,
                    int peer_pool_blocks, std::string* admission_ticket = nullptr,
                    uint64_t session_epoch = 0, const std::string& peer_identity = "");

  // Whether `secret` proves to be `decode_id` (constant-time comparison; a mismatch is counted
  // in stats().sessions_refused). kNone: no session of that id, so nothing of it can be running.
  enum class Session { kNone, kMatch, kMismatch };
  Session CheckSession(const std::string& decode_id, const std::string& secret,
                       const std::string& peer_identity = "") const;

  // kFailedPrecondition: unknown decode instance or lost link (handshake again);
  // kInvalidArgument: block ids out of range or too few for num_tokens;
  // kAlreadyExists: the request is running; kCanceled: it was cancelled before it started.
  // skip_blocks: the first blocks the decode holds already (PrefillRequest.skip_blocks): never
  // written; kInvalidArgument unless 0 <= skip_blocks < the blocks covering num_tokens.
  Result<std::shared_ptr<SaveRequest>> BeginSave(const std::string& decode_id,
                                                 uint64_t request_id, int num_tokens,
                                                 std::vector<int32_t> local_blocks,
                                                 std::vector<int32_t> remote_blocks,
                                                 const std::string& peer_identity = "",
                                                 int skip_blocks = 0);
  // Forgets a request; call after Quiesce() or a successful WaitForSave().
  void EndSave(const std::string& decode_id, uint64_t request_id,
               const std::string& peer_identity = "");

  struct CancelResult {
    bool known = false;
    bool stopped = false;
  };
  // See the file comment. An unknown request is remembered so a late BeginSave is refused.
  CancelResult Cancel(const std::string& decode_id, uint64_t request_id, Deadline deadline,
                      const std::string& peer_identity = "");
  // Cancels every running request (shutdown).
  void CancelAll(Deadline deadline);

  PrefillConnectorStats stats() const;

 private:
  PrefillConnector() = default;
  // The maps' key of a decode id within its identity's sessions.
  static std::string Scoped(const std::string& peer_identity, const std::string& decode_id);
  using Key = std::pair<std::string, uint64_t>;
  std::unique_ptr<transport::Transport> transport_;
  model::KvPool* pool_ = nullptr;
  LayoutDescriptor local_;
  std::unique_ptr<transport::Registration> registration_;
  mutable std::mutex mu_;
  // Keyed by Scoped(identity, decode id).
  std::map<std::string, std::shared_ptr<PeerLink>> peers_;
  std::map<std::string, std::string> sessions_;  // -> its session secret
  mutable uint64_t sessions_refused_ = 0;
  std::map<Key, std::shared_ptr<SaveRequest>> active_;
  std::map<Key, Clock::time_point> tombstones_;  // cancelled before they started; expire
  uint64_t handshakes_ = 0;
  uint64_t bytes_written_ = 0;
};

}  // namespace kvstream::connector
