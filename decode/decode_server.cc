#include "decode/decode_server.h"
#include "decode/decode_request.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "common/log.h"
#include "daemon/daemon_runtime.h"  // ComputeDeviceId
#include "connector/grpc_status.h"
#include "decode/generate_request.h"
#include "decode/kv_tiers.h"
#include "decode/load_hooks.h"
#include "tokenizer/text_stream.h"

namespace kvstream::decode {

namespace v1 = kvstream::v1;
using connector::ToGrpc;

namespace {
int64_t WallMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}
int64_t MicrosSince(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t).count();
}
PrefillRouter MakeRouter(const daemon::DaemonConfig& config, const kvcache::BlockKey& root,
                         int block_size, const std::vector<connector::DecodeConnector*>& connectors) {
  std::vector<std::string> addresses;
  for (connector::DecodeConnector* c : connectors) addresses.push_back(c->prefill_address());
  auto policy = ParseRoutePolicy(config.prefill_routing);  // checked by the config parser
  return PrefillRouter(policy.ok() ? *policy : RoutePolicy::kLeastLoaded, std::move(addresses),
                       root, block_size, config.prefill_route_blocks, config.prefill_route_slack);
}
}  // namespace

DecodeServer::DecodeServer(const daemon::DaemonConfig& config, model::ModelBackend* backend,
                           model::KvPool* pool,
                           std::vector<connector::DecodeConnector*> connectors)
    : config_(config),
      device_id_(daemon::ComputeDeviceId(config)),
      shared_via_mps_(daemon::ComputeDeviceSharedViaMps(config)),
      backend_(backend),
      pool_(pool),
      connectors_(std::move(connectors)),
      // The prefill's key chain (prefill/kv_tiers.cc): the same root, so a prompt's route key
      // and the blocks the decode writes down have the keys they have in every tier.
      kv_root_(kvcache::RootKey(backend->config().hash(), pool->layout(), /*salt=*/"")),
      loads_prefix_(daemon::ResolveDecodeLoadsPrefix(config.kv_decode_loads_prefix, config.transport)),
      router_(MakeRouter(config, kv_root_, pool->layout().block_size, connectors_)),
      admission_(&pool->allocator(), config.max_queue),
      join_budget_(config.itl_target_ms * 1e-3,
                   double(backend->config().decode_step_weight_bytes())) {
  if (shared_via_mps_ && config_.first_step_after_load == "auto") {
    KV_LOG_INFO << "GPU shared through MPS: first_step_after_load=auto keeps the layer-by-layer "
                   "first step even with the prefill on this GPU";
  }
  scheduler_ = std::thread([this] { SchedulerLoop(); });
  prober_ = std::thread([this] { ProbeLoop(); });
}

bool DecodeServer::Ready() const {
  if (config_.on_load_failure == "recompute") return true;  // can serve without a prefill
  for (connector::DecodeConnector* c : connectors_)
    if (c->peer_ready()) return true;
  return false;
}

void DecodeServer::ProbeLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  Deadline next_probe = Clock::now() + std::chrono::seconds(1);
  while (!stopping_) {
    cv_.wait_for(lock, std::chrono::milliseconds(200), [this] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    if (Clock::now() >= next_probe) {
      next_probe = Clock::now() + std::chrono::seconds(1);
      for (connector::DecodeConnector* c : connectors_) {
        if (c->peer_ready()) continue;
        Status s = c->Handshake(DeadlineAfterMs(std::min<int64_t>(config_.handshake_timeout_ms, 1000)));
        if (s.ok()) {
          KV_LOG_INFO << "prefill back: handshake done, taking loads again";
        }
      }
    }
    if (daemon::Health* h = health_.load()) h->SetReady(Ready());
    lock.lock();
  }
}

void DecodeServer::SetHealth(daemon::Health* health) {
  health->SetReady(Ready());
  health_ = health;
}

void DecodeServer::StopAdmitting() {
  admitting_ = false;
  admission_.Close("decode daemon draining: not admitting new requests");
}

bool DecodeServer::FirstStepAfterLoad(const Request& r) const {
  return daemon::ResolveFirstStepAfterLoad(config_.first_step_after_load, device_id_,
                                           r.conn->peer_device_id(), shared_via_mps_);
}

connector::DecodeConnector* DecodeServer::PickConnector(std::span<const int32_t> prefix) {
  const uint64_t rotate = next_connector_.fetch_add(1);
  if (connectors_.size() == 1) return connectors_[0];
  std::vector<PrefillState> states;
  for (connector::DecodeConnector* c : connectors_)
    states.push_back({c->peer_ready(), c->stats().loads_in_flight});
  return connectors_[router_.Pick(router_.RouteKey(prefix), states, rotate)];
}

DecodeServer::~DecodeServer() {
  BeginShutdown();
  Stop();
}

grpc::Status DecodeServer::Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                                    grpc::ServerWriter<v1::GenerateResponse>* writer) {
  if (grpc::Status a = authz_->Check(*ctx, daemon::Method::kGenerate); !a.ok()) return a;
  struct Counted {
    std::atomic<int>& n;
    explicit Counted(std::atomic<int>& c) : n(c) { ++n; }
    ~Counted() { --n; }
  } counted(handlers_);
  auto call = Submit(*req, connector::ServerDeadline(*ctx, DeadlineAfterMs(config_.request_timeout_ms)),
                     [ctx] { return ctx->IsCancelled(); }, nullptr);
  if (!call.ok()) return ToGrpc(call.status());
  const std::shared_ptr<Request> r = std::move(call).value();

  // Stream tokens as the scheduler produces them.
  std::unique_lock<std::mutex> lock(r->mu);
  while (true) {
    while (!r->out.empty()) {
      v1::GenerateResponse msg = std::move(r->out.front());
      r->out.pop_front();
      lock.unlock();
      bool written = writer->Write(msg);
      lock.lock();
      if (!written) CancelLocked(*r, "client went away");
    }
    if (r->complete) return ToGrpc(r->final);
    if (ctx->IsCancelled() && !r->client_gone) CancelLocked(*r, "client cancelled the request");
    r->cv.wait_for(lock, std::chrono::milliseconds(20));
  }
}

Result<std::shared_ptr<DecodeServer::Request>> DecodeServer::Submit(
    const v1::GenerateRequest& request, Deadline deadline, const std::function<bool()>& cancelled,
    std::function<void()> on_output) {
  const v1::GenerateRequest* req = &request;
  auto r = std::make_shared<Request>();
  r->arrival = Clock::now();
  r->deadline = deadline;
  r->on_output = std::move(on_output);
  r->id = next_id_++;
  r->tag = req->client_request_tag();
  auto prompt = PromptTokens(*req, text_);  // prompt_tokens, or prompt_text encoded
  if (prompt.ok()) r->prompt = std::move(prompt).value();
  r->max_tokens = req->max_tokens();
  r->stop.assign(req->stop_token_ids().begin(), req->stop_token_ids().end());
  if (!req->ignore_eos()) r->stop.insert(r->stop.end(), default_stop_.begin(), default_stop_.end());
  {
    std::random_device rd;
    r->sampling = SamplingFromRequest(*req, (uint64_t(rd()) << 32) ^ rd());
  }
  ++total_;

  auto reject = [&](Status s) {
    ++failed_;
    KV_LOG_WARN << "[req " << r->id << "] rejected: " << s.ToString();
    return s;
  };
  if (!admitting_) return reject(Unavailable("decode daemon draining: not admitting new requests"));
  if (!prompt.ok()) return reject(prompt.status());
  const int n = static_cast<int>(r->prompt.size());
  const GenerateLimits limits{backend_->config().vocab_size, backend_->config().max_position,
                              pool_->layout().block_size, pool_->num_blocks()};
  int need = 0;
  const v1::GenerateRequest* checked = req;
  v1::GenerateRequest encoded;  // a text request, checked as the ids it became
  if (!req->prompt_text().empty()) {
    encoded = *req;
    encoded.clear_prompt_text();
    *encoded.mutable_prompt_tokens() = {r->prompt.begin(), r->prompt.end()};
    checked = &encoded;
  }
  if (Status s = CheckGenerateRequest(*checked, limits, &need); !s.ok()) return reject(s);
  if (text_.tokenizer != nullptr) {
    r->text = std::make_unique<tokenizer::TextStream>(
        *text_.tokenizer, std::vector<std::string>(req->stop_strings().begin(), req->stop_strings().end()));
  }

  switch (req->load_mode()) {
    case v1::LOAD_MODE_PIPELINED: r->pipelined = true; break;
    case v1::LOAD_MODE_NON_PIPELINED: r->pipelined = false; break;
    default: r->pipelined = config_.pipelining; break;
  }
  r->remote = n > 1 && req->load_mode() != v1::LOAD_MODE_LOCAL;

  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return reject(Unavailable("decode daemon shutting down"));
  }
  // A full pool queues the request, first come first served (decode/admission.h), bounded by
  // max_queue, queue_timeout_ms and its deadline, rather than failing a burst outright.
  const Deadline queue_deadline =
      std::min(r->deadline, DeadlineAfterMs(config_.queue_timeout_ms));
  auto ids = admission_.Acquire(need, queue_deadline, cancelled);
  if (!ids.ok()) return reject(ids.status());
  r->kv_root = req->cache_salt().empty()
                   ? kv_root_
                   : kvcache::RootKey(backend_->config().hash(), pool_->layout(), req->cache_salt());
  r->cache_salt = req->cache_salt();
  if (write_down_ && loads_prefix_ && r->remote) {
    // The prefix from this decode's own tiers: the prefill is asked only for the rest (LOAD_MODE_LOCAL computes it all).
    TierLoad loaded = LoadPrefixFromTiers(
        write_down_, write_down_staging_, pool_, r->kv_root,
        std::span<const int32_t>(r->prompt).first(size_t(n - 1)), &*ids,
        std::min(r->deadline, DeadlineAfterMs(config_.load_timeout_ms)));
    r->tier_tokens = loaded.tokens;
    r->prefetch = std::move(loaded.prefetch);
    r->load.set_decode_tier_tokens(r->tier_tokens);
    if (r->tier_tokens == n - 1) r->remote = false;  // the whole prefix: no prefill needed
  }
  r->blocks = std::make_shared<model::BlockLease>(&pool_->allocator(), std::move(ids).value());
  if (observed_.queue) observed_.queue->Observe(double(MicrosSince(r->arrival)) * 1e-6);

  KV_LOG_INFO << "[req " << r->id << "] generate: prompt " << n << " tokens, max_tokens "
              << r->max_tokens << ", "
              << (r->remote ? (r->pipelined ? "pipelined load" : "non-pipelined load") : "local")
              << (r->tag.empty() ? "" : ", tag " + r->tag.substr(0, 128));
  if (r->remote) {
    r->load_deadline = std::min(r->deadline, DeadlineAfterMs(config_.load_timeout_ms));
    std::vector<int32_t> prefix(r->prompt.begin(), r->prompt.end() - 1);
    r->conn = PickConnector(prefix);
    Status s = r->conn->StartLoad(r->id, std::move(prefix), r->blocks->ids(), r->pipelined,
                                  r->load_deadline, r->blocks,
                                  r->tier_tokens / pool_->layout().block_size, r->cache_salt);
    if (!s.ok()) return reject(s.WithContext("start_load"));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      if (r->conn) r->conn->Finished(r->id);
      return reject(Unavailable("decode daemon shutting down"));
    }
    active_ids_.insert(r->id);
    pending_.push_back(r);
  }
  cv_.notify_all();
  return r;
}

bool DecodeServer::Take(Request& r, std::vector<v1::GenerateResponse>* out, Status* final) {
  std::lock_guard<std::mutex> lock(r.mu);
  while (!r.out.empty()) {
    out->push_back(std::move(r.out.front()));
    r.out.pop_front();
  }
  if (r.complete && final != nullptr) *final = r.final;
  return r.complete;
}

int DecodeServer::PromptLength(const Request& r) { return static_cast<int>(r.prompt.size()); }

void DecodeServer::Cancel(Request& r, const std::string& why) {
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.client_gone) CancelLocked(r, why);
}

void DecodeServer::CancelLocked(Request& r, const std::string& why) {
  r.client_gone = true;
  if (r.conn) r.conn->tracker().Fail(r.id, Canceled(why));
  cv_.notify_all();
}

bool DecodeServer::Done(const Request& r, int32_t token) const {
  if (r.generated >= r.max_tokens) return true;
  return std::find(r.stop.begin(), r.stop.end(), token) != r.stop.end();
}

void DecodeServer::Emit(Request& r, int32_t token, const model::TokenLogprobs* logprobs) {
  v1::GenerateResponse msg;
  msg.set_token_id(token);
  if (r.sampling.wants_logprobs() && logprobs) {
    msg.set_logprob(logprobs->logprob);
    for (const model::TokenLogprob& t : logprobs->top) {
      v1::TokenLogprob* e = msg.add_top_logprobs();
      e->set_token_id(t.token);
      e->set_logprob(t.logprob);
    }
  }
  if (r.generated == 0 && !r.sampling.greedy()) msg.set_seed(r.sampling.seed);
  msg.set_index(r.generated);
  msg.set_server_time_us(WallMicros());
  const int64_t since_arrival_us = MicrosSince(r.arrival);
  msg.set_since_arrival_us(since_arrival_us);
  msg.set_request_id(r.id);
  // The very figures the client receives (since_arrival_us).
  if (daemon::Histogram* h = r.generated == 0 ? observed_.ttft : observed_.itl)
    h->Observe(double(since_arrival_us - r.last_token_us) * 1e-6);
  r.last_token_us = since_arrival_us;
  ++r.generated;
  if (write_down_ != nullptr) r.answer.push_back(token);
  bool last = Done(r, token);
  if (r.text) {  // the text this token made final; a stop string ends the request
    auto step = r.text->Push(token, last);
    if (step.ok()) {
      msg.set_text(std::move(step->text));
      if (!step->stop_string.empty()) {
        msg.set_stop_string(step->stop_string);
        last = true;
      }
    } else {
      KV_LOG_WARN << "[req " << r.id << "] decoding text: " << step.status().ToString();
      r.text.reset();
    }
  }
  msg.set_last(last);
  if (!r.load_info_sent) {
    // The prefill's figures come with the end of its call, usually just after the last layer
    // landed; the first token is not held back for them. A request ending with this token
    // waits a little for them, unless other streams are decoding (this thread is theirs).
    if (r.remote && !r.load.recomputed()) {
      const bool others_decoding =
          running_.size() > 1 || (running_.size() == 1 && running_.front().get() != &r);
      auto info = r.conn->WaitForLoad(
          r.id, last && !others_decoding ? DeadlineAfterMs(200) : Clock::now());
      if (info.ok()) {
        r.load.set_prefill_compute_us(info->prefill_compute_us);
        r.load.set_transfer_us(info->transfer_us);
        r.load.set_transfer_exposed_us(info->transfer_exposed_us);
        r.load.set_prefix_cached_tokens(info->cached_tokens);
        *msg.mutable_load() = r.load;
        r.load_info_sent = true;
      } else if (last || r.generated == 1) {
        *msg.mutable_load() = r.load;
        if (last) r.load_info_sent = true;
      }
    } else {
      *msg.mutable_load() = r.load;
      r.load_info_sent = true;
    }
  }
  ++tokens_;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    r.out.push_back(std::move(msg));
  }
  r.cv.notify_all();
  if (r.on_output) r.on_output();
  if (last) Complete(r, OkStatus());
}

void DecodeServer::Complete(Request& r, Status status) {
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if (r.complete) return;
    r.complete = true;
    r.final = status;
  }
  if (r.remote) r.conn->Finished(r.id);
  // Our reference, dropped on return (after the write-down took its own); blocks that
  // received a load stay with the connector until it is safe.
  const std::shared_ptr<model::BlockLease> blocks = std::move(r.blocks);
  {
    std::lock_guard<std::mutex> lock(mu_);
    active_ids_.erase(r.id);
  }
  if (status.ok()) {
    ++ok_;
    KV_LOG_INFO << "[req " << r.id << "] done: " << r.generated << " tokens in "
                << MicrosSince(r.arrival) / 1000 << " ms";
  } else {
    (status.code() == StatusCode::kCanceled ? cancelled_ : failed_)++;
    KV_LOG_WARN << "[req " << r.id << "] ended after " << r.generated
                << " tokens: " << status.ToString();
  }
  r.cv.notify_all();
  if (r.on_output) {
    r.on_output();
    r.on_output = nullptr;
  }
  if (status.ok() && blocks) WriteDown(r, *blocks);  // after the response: never delays it
}

void DecodeServer::WriteDown(const Request& r, const model::BlockLease& blocks) {
  std::vector<int32_t> tokens = r.prompt;
  tokens.insert(tokens.end(), r.answer.begin(), r.answer.end());
  WriteDownConversation(write_down_, write_down_staging_, r.kv_root, pool_->layout().block_size,
                        std::move(tokens), r.cache_len, blocks.ids());
}

uint64_t DecodeServer::LoadedBytes(const Request& r) const {
  const model::KvLayout& l = pool_->layout();
  const int blocks = model::BlocksForTokens(static_cast<int>(r.prompt.size()) - 1, l.block_size) -
                     r.tier_tokens / l.block_size;
  return uint64_t(blocks) * l.block_bytes() * uint64_t(l.num_layers);
}

void DecodeServer::FirstStep(const std::shared_ptr<Request>& rp) {
  Request& r = *rp;
  const int n = static_cast<int>(r.prompt.size());
  const model::SeqSampling sampling{r.sampling, 0};
  model::ForwardOptions fo;
  fo.sampling = std::span<const model::SeqSampling>(&sampling, 1);
  model::ForwardOutput out;
  Status s;
  if (r.remote) {
    LoadHooks hooks(r.conn, r.id, r.load_deadline, pool_->layout().num_layers,
                    FirstStepAfterLoad(r), config_.gpu_landed_wait, observed_.layer_wait);
    // Layer l waits (on the GPU) for layer l of the prefix loaded from the tiers, too.
    kvcache::PrefetchHooks layered(r.prefetch.get(), &hooks);
    model::SeqInput seq{std::span<const int32_t>(&r.prompt[n - 1], 1), n - 1, r.blocks->ids()};
    s = backend_->Forward(*pool_, std::span<const model::SeqInput>(&seq, 1), &layered, fo, &out);
    // The forward has completed, but a layer waited for on the GPU may have been released by
    // the transport (its writer died or the wait's deadline passed) rather than by the data:
    // then the token is discarded and the request takes the failed-load path below.
    if (s.ok() && config_.gpu_landed_wait) s = r.conn->ConfirmLandedOnStream(r.id);
    r.load.set_loaded_remotely(true);
    r.load.set_pipelined(r.pipelined);
    r.load.set_kv_bytes(LoadedBytes(r));
    r.load.set_load_wait_us(hooks.wait_us);
    if (!s.ok()) {
      bool stopping;
      {
        std::lock_guard<std::mutex> lock(mu_);
        stopping = stopping_;
      }
      if (r.client_gone || stopping || config_.on_load_failure != "recompute") {
        Complete(r, s.WithContext("KV of the prompt did not land"));
        return;
      }
      KV_LOG_WARN << "[req " << r.id << "] load failed (" << s.ToString()
                  << "); recomputing the prompt locally";
      // The old blocks stay with the connector until the writer is confirmed stopped; the
      // recompute uses fresh ones.
      r.conn->Finished(r.id);
      r.remote = false;
      r.blocks.reset();
      auto ids = pool_->allocator().Allocate(
          model::BlocksForTokens(n + r.max_tokens, pool_->layout().block_size));
      if (!ids.ok()) {
        Complete(r, ids.status().WithContext("recomputing after a failed load"));
        return;
      }
      r.blocks = std::make_shared<model::BlockLease>(&pool_->allocator(), std::move(ids).value());
      r.tier_tokens = 0;  // fresh blocks: the whole prompt is computed
      r.load.set_decode_tier_tokens(0);
      r.load.set_loaded_remotely(false);
      r.load.set_recomputed(true);
      ++recomputed_;
    }
  }
  if (!r.remote) {  // over the prefix loaded from the tiers, if any (layer by layer on a GPU)
    kvcache::PrefetchHooks layered(r.prefetch.get(), nullptr);
    model::SeqInput seq{std::span<const int32_t>(r.prompt).subspan(size_t(r.tier_tokens)),
                        r.tier_tokens, r.blocks->ids()};
    s = backend_->Forward(*pool_, std::span<const model::SeqInput>(&seq, 1), &layered, fo, &out);
    if (!s.ok()) {
      Complete(r, s.WithContext("prompt forward"));
      return;
    }
  }
  r.cache_len = n;
  r.last_token = out.next_tokens.at(0);
  Emit(r, r.last_token, out.logprobs.empty() ? nullptr : &out.logprobs[0]);
  if (!r.complete) running_.push_back(rp);
}

DecodeServer::LoadState DecodeServer::LoadStateOf(const Request& r) {
  if (!r.remote) return LoadState::kLocal;
  if (!r.conn->tracker().Settled(r.id)) return LoadState::kNotSettled;
  // With gpu_landed_wait a layer counts as landed once its copy is only enqueued; a joiner's
  // step waits on nothing, so it joins only once the prefill confirmed every write complete.
  if (config_.gpu_landed_wait) {
    const StatusCode load = r.conn->WaitForLoad(r.id, Clock::now()).status().code();
    if (load == StatusCode::kTimeout) return LoadState::kPending;
    if (load != StatusCode::kOk) return LoadState::kFailed;
  }
  const Deadline now = Clock::now();
  for (int l = 0; l < pool_->layout().num_layers; ++l)
    if (!r.conn->tracker().WaitForLayer(r.id, l, now).ok()) return LoadState::kFailed;
  return LoadState::kLanded;
}

void DecodeServer::DecodeStep(std::vector<std::shared_ptr<Request>>& batch,
                              std::vector<std::shared_ptr<Request>>& joining) {
  std::vector<model::SeqInput> seqs;
  std::vector<model::SeqSampling> sampling;
  seqs.reserve(batch.size() + joining.size());
  for (auto& r : batch) {
    seqs.push_back(model::SeqInput{std::span<const int32_t>(&r->last_token, 1), r->cache_len,
                                   r->blocks->ids()});
    sampling.push_back(model::SeqSampling{r->sampling, uint64_t(r->generated)});
  }
  // A joiner's first step: its last prompt token over the landed KV of the others (what
  // FirstStep computes once the load settled).
  for (auto& r : joining) {
    const int n = static_cast<int>(r->prompt.size());
    seqs.push_back(model::SeqInput{std::span<const int32_t>(&r->prompt[n - 1], 1), n - 1,
                                   r->blocks->ids()});
    sampling.push_back(model::SeqSampling{r->sampling, 0});
  }
  model::ForwardOptions fo;
  fo.sampling = sampling;
  model::ForwardOutput out;
  // Joiners whose prefix came from the tiers: layer l waits (on the GPU) for its copies.
  std::vector<const kvcache::PoolPrefetch*> prefetches;
  for (auto& r : joining)
    if (r->prefetch) prefetches.push_back(r->prefetch.get());
  kvcache::PrefetchHooks layered(prefetches);
  const auto t0 = Clock::now();
  Status s = backend_->Forward(*pool_, seqs, prefetches.empty() ? nullptr : &layered, fo, &out);
  forward_us_ += static_cast<uint64_t>(MicrosSince(t0));
  for (size_t i = 0; i < batch.size(); ++i) {
    Request& r = *batch[i];
    if (!s.ok()) {
      Complete(r, s.WithContext("decode step"));
      continue;
    }
    r.cache_len += 1;
    r.last_token = out.next_tokens.at(i);
    Emit(r, r.last_token, out.logprobs.empty() ? nullptr : &out.logprobs[i]);
  }
  for (size_t j = 0; j < joining.size(); ++j) {
    Request& r = *joining[j];
    if (!s.ok()) {
      Complete(r, s.WithContext("decode step (first token)"));
      continue;
    }
    const int n = static_cast<int>(r.prompt.size());
    r.load.set_loaded_remotely(true);
    r.load.set_pipelined(r.pipelined);
    r.load.set_kv_bytes(LoadedBytes(r));
    r.load.set_load_wait_us(0);
    r.cache_len = n;
    r.last_token = out.next_tokens.at(batch.size() + j);
    Emit(r, r.last_token, out.logprobs.empty() ? nullptr : &out.logprobs[batch.size() + j]);
    if (!r.complete) running_.push_back(joining[j]);
  }
}

void DecodeServer::SchedulerLoop() {
  while (true) {
    const auto iteration_start = Clock::now();
    bool stopping;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(50), [&] {
        return stopping_ || !pending_.empty() || !waiting_.empty() || !running_.empty();
      });
      stopping = stopping_;
      while (!pending_.empty()) {
        waiting_.push_back(std::move(pending_.front()));
        pending_.pop_front();
      }
    }
    // Requests that ended outside the scheduler's control.
    auto reap = [&](const std::shared_ptr<Request>& r) {
      if (r->complete) return true;
      if (stopping) Complete(*r, Unavailable("decode daemon shutting down"));
      else if (r->client_gone) Complete(*r, Canceled("client cancelled the request"));
      else if (Clock::now() >= r->deadline)
        Complete(*r, Timeout("request deadline passed after " + std::to_string(r->generated) +
                             " tokens"));
      return r->complete;
    };
    std::erase_if(waiting_, reap);
    std::erase_if(running_, reap);
    if (stopping) {
      std::lock_guard<std::mutex> lock(mu_);
      if (pending_.empty() && waiting_.empty() && running_.empty()) return;
      continue;
    }
    // One new request's first token per iteration, then one decode step for the others. With
    // nothing running, the first step starts at once and follows the prefill layer by layer;
    // while others decode, a request joins only once its KV has landed, so their inter-token
    // latency never waits on a prefill (the newcomer's TTFT grows by at most one step).
    const size_t max_batch = static_cast<size_t>(config_.max_batch);
    std::vector<std::shared_ptr<Request>> joining;
    double joining_kv = 0;  // KV bytes the joiners' first steps read
    if (!waiting_.empty()) {
      auto pick = waiting_.begin();
      if (!running_.empty()) {
        const size_t room = max_batch > running_.size() ? max_batch - running_.size() : 0;
        // Each waiting request's load state, asked once for this pass (state[i]: waiting_[i]).
        std::vector<LoadState> state;
        state.reserve(waiting_.size());
        for (const auto& r : waiting_) state.push_back(LoadStateOf(*r));
        // Positions, not iterators: erasing inside a deque invalidates all of its iterators.
        std::vector<size_t> landed;
        std::vector<double> landed_kv;
        for (size_t i = 0; i < waiting_.size() && landed.size() < room; ++i) {
          if (state[i] == LoadState::kLanded) {
            landed.push_back(i);
            landed_kv.push_back(KvBytes(int(waiting_[i]->prompt.size()) - 1));
          }
        }
        if (!landed.empty()) {
          double running_kv = 0;
          for (auto& r : running_) running_kv += KvBytes(r->cache_len);
          const size_t k = join_budget_.Admit(running_kv, landed_kv);
          joins_deferred_ += landed.size() - k;
          for (size_t i = 0; i < k; ++i) {
            joining.push_back(waiting_[landed[i]]);
            joining_kv += landed_kv[i];
          }
          for (size_t i = k; i-- > 0;) {
            waiting_.erase(waiting_.begin() + landed[i]);
            state.erase(state.begin() + landed[i]);
          }
        }
        // The others whose first step cannot wait on a prefill: local prompts, failed loads.
        // (A landed one the join budget put off waits for a later step instead; so does, with
        // gpu_landed_wait, a pending one rather than stall the running.)
        const auto first = std::find_if(state.begin(), state.end(), [](LoadState s) {
          return s == LoadState::kLocal || s == LoadState::kFailed;
        });
        pick = waiting_.begin() + (first - state.begin());
      }
      if (pick != waiting_.end()) {
        auto r = *pick;
        waiting_.erase(pick);
        const auto t0 = Clock::now();
        FirstStep(r);
        if (!running_.empty()) first_step_us_ += static_cast<uint64_t>(MicrosSince(t0));
      }
    }
    if (!running_.empty() || !joining.empty()) {
      std::vector<std::shared_ptr<Request>> batch;
      if (running_.size() <= max_batch) {
        batch = running_;
      } else {
        for (size_t i = 0; i < max_batch; ++i) batch.push_back(running_[(rr_ + i) % running_.size()]);
        rr_ = (rr_ + max_batch) % running_.size();
      }
      double step_kv = joining_kv;
      for (auto& r : batch) step_kv += KvBytes(r->cache_len);
      DecodeStep(batch, joining);
      std::erase_if(running_, [](const std::shared_ptr<Request>& r) { return r->complete; });
      ++steps_;
      // The whole iteration is what the streams' inter-token latency sees (host work too).
      const int64_t iteration_us = MicrosSince(iteration_start);
      loop_us_ += static_cast<uint64_t>(iteration_us);
      join_budget_.Observe(double(iteration_us) * 1e-6, step_kv);
    }
  }
}

void DecodeServer::BeginShutdown() {
  std::vector<uint64_t> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    ids.assign(active_ids_.begin(), active_ids_.end());
  }
  admission_.Close("decode daemon shutting down");
  // Wake first steps blocked in wait_for_layer.
  for (connector::DecodeConnector* c : connectors_) {
    for (uint64_t id : ids) c->tracker().Fail(id, Unavailable("decode daemon shutting down"));
  }
  cv_.notify_all();
}

void DecodeServer::Stop() {
  if (scheduler_.joinable()) scheduler_.join();
  if (prober_.joinable()) prober_.join();
}

}  // namespace kvstream::decode
