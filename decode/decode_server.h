// The decode daemon's gRPC service (kvstream.v1.Decode) over a DecodeConnector.
//
// Generate(prompt): allocate blocks for prompt + max_tokens, start_load the first n-1 tokens'
// KV from a prefill daemon (unless the prompt has one token or LOCAL mode), then a scheduler
// thread computes the last prompt token itself with wait_for_layer(r, l) before each layer's
// attention, picks the token (greedy, or sampled as the request asks: the token of index i is
// drawn with (seed, i), as colocated Generate() draws it), and decodes every running request together, one token per
// sequence per Forward. Tokens stream back with timestamps. While others decode, a request
// whose prompt KV has fully landed takes its first step inside the next decode step (one more
// sequence of the batch), so landing prompts cost the running streams no extra forward.
//
// Guarantees:
//  - A request's blocks are released however it ends (done, failed, client cancel, deadline,
//    prefill lost, shutdown); blocks that received a load are released only once the connector
//    confirms nothing can still be written into them.
//  - Every request has a deadline: the client's, capped at request_timeout_ms.
//  - When the KV does not land: on_load_failure=fail ends the request with the load's status;
//    recompute computes the prompt locally in fresh blocks.
//  - Several prefill daemons (one DecodeConnector each): a request's load goes where
//    prefill_routing says (decode/prefill_router.h): by default the prefill ranked first for its
//    prompt's first blocks (so the turns of a conversation find their prefix there), else the
//    next in rank when that one is not ready or overloaded; least_loaded: the fewest loads in
//    flight. Only prefills whose last handshake is valid are taken (a prefill that was lost is
//    skipped until a handshake with it succeeds again; with none valid, round robin).
//    A prober thread retries the handshake with every prefill that is not ready, once a second
//    (each attempt bounded by min(handshake_timeout_ms, 1 s)), so a prefill that comes back or
//    starts late takes traffic again; it also keeps the readiness (SetHealth) up to date.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "daemon/credentials.h"
#include "daemon/daemon_config.h"
#include "daemon/health.h"
#include "daemon/metrics.h"
#include "connector/decode_connector.h"
#include "decode/admission.h"
#include "decode/join_budget.h"
#include "decode/prefill_router.h"
#include "decode/text_request.h"
#include "kvcache/pool_tier.h"
#include "kvcache/tiered_cache.h"
#include "model/backend.h"
#include "proto/kvstream.grpc.pb.h"

namespace kvstream::decode {

class DecodeServer final : public kvstream::v1::Decode::Service {
 public:
  // `connectors`: one per prefill daemon, at least one; they must outlive the server.
  DecodeServer(const daemon::DaemonConfig& config, model::ModelBackend* backend,
               model::KvPool* pool, std::vector<connector::DecodeConnector*> connectors);
  ~DecodeServer() override;

  grpc::Status Generate(grpc::ServerContext* ctx, const kvstream::v1::GenerateRequest* req,
                        grpc::ServerWriter<kvstream::v1::GenerateResponse>* writer) override;

  // The internal request API: what Generate does, for the gRPC handler and the HTTP front end
  // (frontend/) alike; authorization is the caller's.
  struct Request;  // one call, from Submit to its end
  // Checks `req`, waits for its KV blocks in the admission line (FIFO; polling `cancelled`),
  // starts its load and hands it to the scheduler; the error otherwise (counted and logged as a
  // rejected Generate). `deadline`: the client's, capped at request_timeout_ms by the caller.
  // `on_output` (may be empty) runs on the scheduler thread, with no lock held, after each
  // message and once after the end; it must not block. It is dropped once the call ended.
  Result<std::shared_ptr<Request>> Submit(const kvstream::v1::GenerateRequest& req,
                                          Deadline deadline, const std::function<bool()>& cancelled,
                                          std::function<void()> on_output);
  // Moves the messages produced so far to *out (in order). True once the call has ended: then
  // every message was taken and *final (when given) is how it ended.
  bool Take(Request& r, std::vector<kvstream::v1::GenerateResponse>* out, Status* final);
  // The client went away: the call ends with kCanceled at the scheduler's next pass, its load is
  // stopped and its blocks are released (as for a cancelled gRPC call).
  void Cancel(Request& r, const std::string& why);
  // The prompt's length in tokens (as encoded, for a text prompt).
  static int PromptLength(const Request& r);
  grpc::Status Stats(grpc::ServerContext* ctx, const kvstream::v1::StatsRequest* req,
                     kvstream::v1::StatsResponse* resp) override;
  // What Stats reports (the metrics reader reads the same: daemon/metrics.h).
  void FillStats(kvstream::v1::StatsResponse* resp);
  // Registers the decode's metrics with `registry`, which must outlive the server: its Stats
  // figures and histograms of TTFT, inter-token latency, queue time, per-layer load wait and
  // transfers per prefill. Before the server starts; without it nothing is observed.
  void EnableMetrics(daemon::MetricsRegistry* registry);

  // Readiness from now on goes to `health` (SetReady): SERVING while some prefill is usable
  // (its handshake valid; the prober retries the others once a second) or on_load_failure is
  // recompute. `health` must outlive the server.
  void SetHealth(daemon::Health* health);
  // Drain: new requests (and those waiting for KV blocks) get kUnavailable; those in flight go on.
  void StopAdmitting();
  // Generate calls not yet returned.
  int in_flight() const { return handlers_.load(); }
  // End-of-sequence ids that end every request not asking ignore_eos (generation_config.json's;
  // set before the server starts; default: none).
  void set_default_stop_tokens(std::vector<int32_t> ids) { default_stop_ = std::move(ids); }
  // Who may call which method (set before the server starts; default: every caller).
  void set_authorizer(std::shared_ptr<const daemon::Authorizer> a) { authz_ = std::move(a); }
  // Every request that ends OK has its KV (prompt and answer, full blocks) written down to
  // `tiers` (the shared store tier: docs/kv_tiers.md) after its last message, so that the next
  // turn's prefix, the answer included, is found there by any prefill. Asynchronous: the tiers
  // take references of their own on the blocks and copy them out on their thread; a full
  // write-down queue skips it (counted). Null (default): nothing written. With a GPU pool,
  // `staging` is the pinned host tier that `tiers` is staged through (its first tier; daemon/
  // pool_tier.h): the blocks are copied to it on the GPU first (its references on them held
  // until the copy is complete), then from it to the store. Set before serving; both must
  // outlive the server.
  void set_kv_write_down(kvcache::TieredCache* tiers, kvcache::PoolTier* staging = nullptr) {
    write_down_ = tiers;
    write_down_staging_ = staging;
  }
  // Text in and out (prompt_text, stop_strings, GenerateResponse.text) with this tokenizer, or
  // refused with why_none. Set before serving; the tokenizer must outlive the server.
  void set_text_support(TextSupport text) { text_ = std::move(text); }
  // Refuses new requests and ends every request in flight with kUnavailable.
  void BeginShutdown();
  // Joins the scheduler (after BeginShutdown and the gRPC server's shutdown).
  void Stop();

 private:
  void SchedulerLoop();
  void ProbeLoop();
  bool Ready() const;
  void FirstStep(const std::shared_ptr<Request>& r);
  // One token for every request of `batch`, plus the first token of every request of `joining`
  // (their prompts' KV has landed: the first step is one more sequence of the batch).
  void DecodeStep(std::vector<std::shared_ptr<Request>>& batch,
                  std::vector<std::shared_ptr<Request>>& joining);
  // Where a waiting request's prompt KV stands, as one scheduler pass sees it.
  enum class LoadState {
    kLocal,       // not loaded remotely: its first step computes the prompt
    kNotSettled,  // some layer neither landed nor failed yet (the tracker's Settled)
    kLanded,      // every layer landed (and, with gpu_landed_wait, the prefill confirmed it)
    kPending,     // gpu_landed_wait: every layer announced, the prefill has not confirmed yet
    kFailed,      // the load failed: its first step recomputes or fails the request
  };
  // Asks the tracker (and, with gpu_landed_wait, WaitForLoad) once, without waiting.
  LoadState LoadStateOf(const Request& r);
  void Emit(Request& r, int32_t token, const model::TokenLogprobs* logprobs);
  void Complete(Request& r, Status status);
  // r's KV of its first r.cache_len tokens (full blocks) in `blocks`, queued for write_down_.
  void WriteDown(const Request& r, const model::BlockLease& blocks);
  // Cancel with r.mu held.
  void CancelLocked(Request& r, const std::string& why);
  bool Done(const Request& r, int32_t token) const;
  // config_.first_step_after_load resolved against r's prefill's device (known after the
  // handshake, which may be redone after a prefill restart).
  bool FirstStepAfterLoad(const Request& r) const;
  // KV bytes of r's prompt the prefill wrote (the blocks after those loaded from the tiers).
  uint64_t LoadedBytes(const Request& r) const;
  // KV bytes of `tokens` tokens over every layer (what a step reads for a sequence).
  double KvBytes(int tokens) const {
    return double(tokens) * double(backend_->config().kv_bytes_per_token());
  }
  // The prefill connector for a new load of `prefix` (see the class comment).
  connector::DecodeConnector* PickConnector(std::span<const int32_t> prefix);

  daemon::DaemonConfig config_;
  std::shared_ptr<const daemon::Authorizer> authz_ = daemon::Authorizer::Open();
  TextSupport text_{nullptr, "no tokenizer was loaded"};
  std::vector<int32_t> default_stop_;
  std::string device_id_;  // daemon::ComputeDeviceId(config_)
  bool shared_via_mps_;    // daemon::ComputeDeviceSharedViaMps(config_)
  model::ModelBackend* backend_;
  model::KvPool* pool_;
  std::vector<connector::DecodeConnector*> connectors_;
  std::atomic<uint64_t> next_connector_{0};
  const kvcache::BlockKey kv_root_;  // the prefix keys' root (kvcache/prefix_key.h), as the prefill's
  const bool loads_prefix_;  // daemon::ResolveDecodeLoadsPrefix(config_)
  PrefillRouter router_;
  kvcache::TieredCache* write_down_ = nullptr;
  kvcache::PoolTier* write_down_staging_ = nullptr;
  Admission admission_;  // FIFO wait for KV blocks (max_queue)

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::deque<std::shared_ptr<Request>> pending_;  // admitted, not yet seen by the scheduler
  std::set<uint64_t> active_ids_;
  std::thread scheduler_;
  std::thread prober_;
  std::atomic<daemon::Health*> health_{nullptr};
  std::atomic<bool> admitting_{true};
  std::atomic<int> handlers_{0};
  // Scheduler-thread state.
  std::deque<std::shared_ptr<Request>> waiting_;   // first step not done
  std::vector<std::shared_ptr<Request>> running_;  // decoding
  size_t rr_ = 0;
  // Landed prompts joining a step, within config_.itl_target_ms (decode/join_budget.h).
  JoinBudget join_budget_;

  // Histograms (EnableMetrics); null: not observed.
  struct Observed {
    daemon::Histogram* ttft = nullptr;
    daemon::Histogram* itl = nullptr;
    daemon::Histogram* queue = nullptr;
    daemon::Histogram* layer_wait = nullptr;
  } observed_;

  std::atomic<uint64_t> next_id_{1};
  std::atomic<uint64_t> total_{0}, ok_{0}, failed_{0}, cancelled_{0}, tokens_{0}, recomputed_{0};
  // Scheduler timing (Stats decode_*): written by the scheduler thread only.
  std::atomic<uint64_t> steps_{0}, loop_us_{0}, forward_us_{0}, first_step_us_{0},
      joins_deferred_{0};
};

}  // namespace kvstream::decode
