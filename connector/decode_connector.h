// DecodeConnector: the load side of the KV connector (what the decode engine calls).
//
//   StartLoad(r, tokens, dest_blocks, pipelined, deadline, keepalive)   start_load
//       Asks the prefill daemon (Prefill RPC, asynchronous) to compute the KV of `tokens` and
//       write it into `dest_blocks` of the local pool. Returns once the load is posted; the
//       handshake with the prefill happens first if needed (lazily; retried until the deadline
//       while the prefill was never reached, but see "Lost prefill").
//
// Lost prefill: the channel to the prefill pings it every keepalive_time_ms; a connection that
// closes or stops answering (keepalive_timeout_ms) fails the calls on it (which marks the peer
// lost) and, when it cannot be made again within reconnect_wait_ms, marks the peer lost. While it is lost, a load makes no Prefill call
// until a handshake succeeds again, and gives the prefill reconnect_wait_ms to be connectable
// (one attempt at a time; the loads queued behind an attempt share its result); otherwise it
// fails at once with kUnavailable instead of retrying until its deadline.
//   WaitForLayer(r, l, deadline)   wait_for_layer: OK once layer l of r is complete in the pool.
//   WaitForLoad(r, deadline)       every layer landed and the prefill finished; returns its figures.
//
// Landing is confirmed by this decode alone: a layer lands on its own notification from the
// local transport (or, where the transport delivers none, the prefill's per-layer progress
// message). The Prefill call's OK completes nothing by itself: after it the load waits, at most
// cancel_timeout_ms and never past its deadline, for layers not yet notified, then fails with
// kDataLoss naming them.
//   Finished(r)                    finished: the engine no longer needs r's load.
//
// Session: each connector makes its own secret (NewSessionSecret) and presents it at every
// Handshake, Prefill and Cancel; the instance id alone, which Stats and logs show, cannot act
// for this decode at its prefill. Where the transport carries notification MACs, a notification
// counts only if its MAC verifies for the current handshake's epoch (others are dropped and
// counted in stats().notifications_dropped).
//
// Block safety: `keepalive` (the owner of the destination blocks, e.g. a shared BlockLease) is
// held until no write into those blocks can still arrive: the Prefill call ended with prefill's
// confirmation, or a Cancel call confirmed it stopped, or, when the prefill is unreachable, a
// quarantine period passed after the peer was lost. Dropping it is the only way the connector
// frees blocks, so a block is never reused while a write into it may be in flight.
// Signals for requests that are not loading (finished, failed, unknown) are ignored.
//
// Thread-safe. Every blocking call takes a deadline.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/status.h"
#include "common/time.h"
#include "connector/client_auth.h"
#include "connector/handshake.h"
#include "connector/layer_tracker.h"
#include "connector/notification_mac.h"
#include "model/kv_cache.h"
#include "proto/kvstream.grpc.pb.h"
#include "transport/transport.h"

namespace kvstream::connector {

struct DecodeConnectorOptions {
  std::string prefill_address;        // host:port of the prefill daemon's gRPC server
  std::string instance_id;            // empty: generated
  int64_t handshake_timeout_ms = 5000;
  int64_t cancel_timeout_ms = 3000;   // Cancel RPC to confirm a stopped writer
  int64_t quarantine_ms = 2000;       // hold blocks this long after the writer was lost
  int64_t keepalive_time_ms = 300;    // gRPC keepalive ping interval on the channel to the prefill
  int64_t keepalive_timeout_ms = 500; // unanswered this long: the connection is lost
  int64_t reconnect_wait_ms = 300;    // a lost prefill: how long a load waits for it to connect
  std::string device_id;              // this daemon's compute device (ComputeDeviceId), sent at handshake
  ClientAuth auth;                    // credentials of the calls to the prefill (default: none)
};

struct LoadResult {
  int64_t prefill_compute_us = 0;
  int64_t transfer_us = 0;
  int64_t transfer_exposed_us = 0;
  uint64_t kv_bytes = 0;
  int32_t cached_tokens = 0;  // prompt tokens the prefill took from its prefix cache
};

struct DecodeConnectorStats {
  uint64_t handshakes = 0;
  uint64_t loads_started = 0;
  uint64_t loads_ok = 0;
  uint64_t loads_failed = 0;
  uint64_t kv_bytes = 0;
  uint64_t stale_signals_ignored = 0;
  uint64_t data_connections_refused = 0;  // by the transport (TransportCounters)
  uint64_t notifications_dropped = 0;     // their MAC did not verify (notification_mac.h)
  int quarantined_blocks = 0;    // blocks whose writer was lost, still held
  int loads_in_flight = 0;
};

class DecodeConnector {
 public:
  // Registers the pool's memory with `transport` and routes its notifications to the tracker.
  // `pool` must outlive the connector.
  static Result<std::unique_ptr<DecodeConnector>> Create(
      const DecodeConnectorOptions& options, std::unique_ptr<transport::Transport> transport,
      model::KvPool* pool, LayoutDescriptor local);
  ~DecodeConnector();

  const std::string& instance_id() const { return options_.instance_id; }
  const std::string& prefill_address() const { return options_.prefill_address; }
  // Called with each load that succeeded (on the load's thread, after its last layer landed).
  // Set before the first StartLoad.
  void set_on_load_done(std::function<void(const LoadResult&)> f) { on_load_done_ = std::move(f); }

  // (Re)does the handshake now. kFailedPrecondition naming the field on a layout mismatch.
  Status Handshake(Deadline deadline);

  // The prefill's compute device id from the last successful handshake (empty before one, or
  // for a CPU prefill).
  std::string peer_device_id() const;
  // True while the last handshake is valid (false before one and after the peer was lost,
  // until a handshake succeeds again).
  bool peer_ready() const { return handshake_epoch_.load() != 0; }

  // skip_blocks: the first dest_blocks hold their tokens' KV already (loaded from this
  // decode's own KV tiers): the prefill is told not to write them (PrefillRequest.skip_blocks).
  // kInvalidArgument unless 0 <= skip_blocks < the blocks covering `tokens`. cache_salt: the
  // request's (PrefillRequest.cache_salt), the root of its prefix keys at the prefill.
  Status StartLoad(uint64_t request_id, std::vector<int32_t> tokens,
                   std::vector<int32_t> dest_blocks, bool pipelined, Deadline deadline,
                   std::shared_ptr<const void> keepalive, int skip_blocks = 0,
                   std::string cache_salt = "");
  // kTimeout says what was missing: which layers landed, whether the prefill acknowledged the
  // request, and where its Prefill call is.
  Status WaitForLayer(uint64_t request_id, int layer, Deadline deadline);
  // WaitForLayer, then, when the layer's notification was an early one (the transport's
  // kNotificationLandedOnEvent: the copy was only enqueued), makes `stream` (the compute
  // cudaStream_t) wait on the GPU for the copy (Transport::StreamWaitLanded); the host does not
  // wait for it. With late notifications it is WaitForLayer. A writer whose connection is gone
  // before the wait is issued: kUnavailable (the layer may not have landed). The GPU wait ends
  // by `deadline` at the latest (ConfirmLandedOnStream then fails).
  Status WaitForLayerOnStream(uint64_t request_id, int layer, void* stream, Deadline deadline);
  // After the work queued behind WaitForLayerOnStream waits has completed: OK if every layer
  // waited for on the GPU truly landed; kUnavailable if the transport released a wait itself
  // (writer died, or the wait's deadline passed): what was computed from it must be discarded.
  Status ConfirmLandedOnStream(uint64_t request_id);
  Result<LoadResult> WaitForLoad(uint64_t request_id, Deadline deadline);
  // Idempotent. If the load still runs it is cancelled at the prefill (asynchronously).
  void Finished(uint64_t request_id);

  // Cancels every load and waits (bounded by the cancel timeout and quarantine) for them to
  // release their blocks. Later StartLoad calls fail with kUnavailable.
  void Shutdown();

  // Prefill's Stats, for clients that only know the decode daemon.
  DecodeConnectorStats stats() const;
  LayerTracker& tracker() { return tracker_; }

 private:
  struct Load;
  DecodeConnector() = default;
  void RunLoad(std::shared_ptr<Load> load);
  // After the Prefill call returned OK: every layer's own notification (see the file comment).
  Status AwaitOwnNotifications(const Load& load);
  Status EnsureHandshake(Deadline deadline);
  // EnsureHandshake while the peer is lost (see "Lost prefill"); under handshake_mu_.
  Status HandshakeAfterLoss(Clock::time_point asked, Deadline deadline);
  void MarkPeerLost(const std::string& why);
  // Marks the peer lost when the channel's connection goes and does not come back within
  // reconnect_wait_ms (a server closing an idle connection looks the same until then); runs
  // until Shutdown().
  void WatchChannel();
  void ReapLocked();
  // Forgets request_id's early notifications; true if it had any.
  bool DropEarly(uint64_t request_id);
  // The load's state in words (for a timeout status).
  std::string DescribeLoad(uint64_t request_id) const;

  DecodeConnectorOptions options_;
  std::unique_ptr<transport::Transport> transport_;
  model::KvPool* pool_ = nullptr;
  LayoutDescriptor local_;
  std::unique_ptr<transport::Registration> registration_;
  std::string session_secret_;  // HandshakeRequest.session_secret; never logged
  // Checks each notification's MAC where the transport carries one (notification_mac.h).
  std::unique_ptr<NotificationVerifier> verifier_;
  bool verify_macs_ = false;
  std::atomic<uint64_t> session_epoch_{0};  // of the last handshake sent
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<kvstream::v1::Prefill::Stub> stub_;
  LayerTracker tracker_;
  // Early notifications of tracked requests, by (request, layer): what WaitForLayerOnStream
  // hands to the transport. Entered before the tracker sees the layer, dropped in Finished().
  std::mutex early_mu_;
  std::map<std::pair<uint64_t, int>, transport::Notification> early_;

  std::mutex handshake_mu_;           // serialises handshakes
  std::mutex handshake_call_mu_;      // serialises Handshake() calls (also the probe's)
  std::atomic<uint64_t> handshake_epoch_{0};  // 0 = none valid
  // A handshake succeeded once: from then on, no valid handshake means the peer was lost.
  std::atomic<bool> was_ready_{false};
  std::string lost_why_;                 // guarded by mu_
  Clock::time_point lost_attempt_end_{};  // guarded by mu_: the last attempt after a loss ended
  Status lost_attempt_status_;            // guarded by mu_: and its result
  std::thread watcher_;
  std::atomic<bool> stop_watching_{false};
  std::string prefill_instance_id_;
  std::string peer_device_id_;  // guarded by mu_
  Status last_handshake_error_;  // guarded by mu_: of the last handshake attempt of a load

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool shutting_down_ = false;
  std::map<uint64_t, std::shared_ptr<Load>> loads_;
  std::vector<std::thread> finished_threads_;
  DecodeConnectorStats stats_;
  std::function<void(const LoadResult&)> on_load_done_;
};

}  // namespace kvstream::connector
