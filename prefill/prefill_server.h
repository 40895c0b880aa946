// The prefill daemon's gRPC service (kvstream.v1.Prefill) over a PrefillConnector.
//
// Prefill(r): allocate local blocks, run the forward over r's tokens; with pipelining, after
// layer l push l's KV (save_layer) at once, else push every layer after the whole forward; wait
// for the writes (wait_for_save), then free the local blocks. Whatever the outcome, the call
// returns only when no write of r can still land (trailer kvstream-writes-quiesced: 1).
// Forward passes run one at a time (the backend uses every core).
//
// Prefix cache (config prompt_cache_blocks > 0, kvcache/prefix_directory.h): after a successful
// prefill the prompt's local blocks stay cached, block by block. A request whose prompt begins
// with cached blocks uses them and computes only the rest (its forward starts at the cached
// length); one whose whole prompt is cached skips the forward and writes every layer from the
// cache (layer by layer, each write with its notification, as after a forward), concurrently with
// other requests. Either way the decode receives the whole prompt's KV. A request that finds the
// pool full evicts unreferenced cached blocks first. BeginShutdown() drops the cache.
//
// KV tiers below the pool (prefill/kv_tiers.h, docs/kv_tiers.md): after a successful prefill its
// blocks are written down to the host / disk tiers in the background (the request does not
// wait; the blocks stay referenced until copied out). A prompt whose cached prefix in the pool
// ends where a tier holds the next blocks gets them copied into fresh pool blocks before its
// forward, which then computes only what no tier held; a tier block that does not read back
// verified ends the prefix there (a miss, counted), so the tokens never change.
// kv_tier_write_policy write_back (with a tier on): a prefill writes down only the blocks the
// prompt cache did not keep; the cache's evictions are written down instead (the write holds
// its own references: a block is reused only once copied out), and BeginShutdown writes every
// cached block down (with a disk or store tier) before the tiers stop. A request that finds the pool full of blocks being
// written back waits for those writes (by its deadline) rather than failing.
#pragma once

#include <atomic>
#include <mutex>

#include "daemon/credentials.h"
#include "daemon/daemon_config.h"
#include "daemon/metrics.h"
#include "connector/prefill_connector.h"
#include "kvcache/prefix_directory.h"
#include "kvcache/pool_tier.h"
#include "kvcache/tiered_cache.h"
#include "model/backend.h"
#include "proto/kvstream.grpc.pb.h"

namespace kvstream::prefill {

class PrefillServer final : public kvstream::v1::Prefill::Service {
 public:
  PrefillServer(const daemon::DaemonConfig& config, model::ModelBackend* backend,
                model::KvPool* pool, connector::PrefillConnector* connector);

  grpc::Status Handshake(grpc::ServerContext* ctx, const kvstream::v1::HandshakeRequest* req,
                         kvstream::v1::HandshakeResponse* resp) override;
  grpc::Status Prefill(grpc::ServerContext* ctx, const kvstream::v1::PrefillRequest* req,
                       grpc::ServerWriter<kvstream::v1::PrefillProgress>* writer) override;
  grpc::Status Cancel(grpc::ServerContext* ctx, const kvstream::v1::CancelRequest* req,
                      kvstream::v1::CancelResponse* resp) override;
  grpc::Status Stats(grpc::ServerContext* ctx, const kvstream::v1::StatsRequest* req,
                     kvstream::v1::StatsResponse* resp) override;
  // What Stats reports (the metrics reader reads the same: daemon/metrics.h).
  void FillStats(kvstream::v1::StatsResponse* resp) const;
  // Registers the prefill's metrics with `registry`, which must outlive the server: its Stats
  // figures and histograms of queue time, compute and KV transfers. Before the server starts;
  // without it nothing is observed.
  void EnableMetrics(daemon::MetricsRegistry* registry);

  // Drain: new Prefill calls are refused with kUnavailable; running ones go on.
  void StopAdmitting() { admitting_ = false; }
  // Prefill calls not yet returned.
  int in_flight() const { return in_flight_.load(); }
  // Who may call which method (set before the server starts; default: every caller).
  void set_authorizer(std::shared_ptr<const daemon::Authorizer> a) { authz_ = std::move(a); }
  // The KV tiers below the pool (set before the server starts; default: none).
  void set_kv_tiers(std::unique_ptr<kvcache::TieredCache> tiers) {
    tiers_ = std::move(tiers);
    UpdateWriteBack();
  }
  kvcache::TieredCache& kv_tiers() { return *tiers_; }
  // The tier below a GPU pool that copies into it while the forward runs
  // (daemon::CreatePoolTier; set before the server starts; default: none).
  void set_pool_tier(std::unique_ptr<kvcache::PoolTier> tier) {
    pool_tier_ = std::move(tier);
    UpdateWriteBack();
  }
  // The tiers' threads read the pool tier's staging view: they stop before it goes.
  ~PrefillServer() override {
    if (tiers_) tiers_->Stop();
  }
  // New Prefill calls are refused; running ones are cancelled (their writes quiesced).
  void BeginShutdown();
  const std::string& instance_id() const { return instance_id_; }

 private:
  Status RunPrefill(grpc::ServerContext* ctx, const kvstream::v1::PrefillRequest& req,
                    grpc::ServerWriter<kvstream::v1::PrefillProgress>* writer);
  // Write-back on the prompt cache's evictions when the policy asks for it and a tier is on.
  void UpdateWriteBack();
  // Write-back: `blocks` (still referenced) down to the tiers, in the background; at shutdown
  // waiting for room in the queues instead of skipping.
  void WriteBack(std::span<const kvcache::KeyedBlock> blocks);
  // Write-back: waits (by `deadline`) for the writes that hold evicted pool blocks.
  void WaitForWriteBack(Deadline deadline);

  daemon::DaemonConfig config_;
  std::shared_ptr<const daemon::Authorizer> authz_ = daemon::Authorizer::Open();
  model::ModelBackend* backend_;
  model::KvPool* pool_;
  connector::PrefillConnector* connector_;
  std::string instance_id_;
  std::string device_id_;  // sent at handshake: lets decode see a prefill on its own GPU
  kvcache::PrefixDirectory cache_;
  std::unique_ptr<kvcache::TieredCache> tiers_;
  std::unique_ptr<kvcache::PoolTier> pool_tier_;
  bool write_back_ = false;  // UpdateWriteBack: the policy's write_back with a tier on
  std::timed_mutex forward_mu_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> admitting_{true};
  std::atomic<int> in_flight_{0};
  std::atomic<uint64_t> total_{0}, ok_{0}, failed_{0}, cancelled_{0};
  // Histograms (EnableMetrics); null: not observed.
  struct Observed {
    daemon::Histogram* queue = nullptr;
    daemon::Histogram* compute = nullptr;
    daemon::Histogram* transfer_seconds = nullptr;
    daemon::Histogram* transfer_bytes = nullptr;
  } observed_;
};

}  // namespace kvstream::prefill
