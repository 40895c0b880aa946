#include "transport/pacing.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "transport/core/write_completion.h"
#include "transport/core/write_plan.h"

namespace kvstream::transport {

// ---- TokenBucket ---------------------------------------------------------------------------------

TokenBucket::TokenBucket(double bytes_per_s, uint64_t burst_bytes)
    : rate_(bytes_per_s > 0 ? bytes_per_s : 0),
      burst_(double(std::max<uint64_t>(burst_bytes, 1))),
      tokens_(burst_),
      last_(Clock::now()) {}

void TokenBucket::RefillLocked(Clock::time_point now) {
  if (now <= last_) return;
  tokens_ = std::min(burst_, tokens_ + rate_ * std::chrono::duration<double>(now - last_).count());
  last_ = now;
}

Clock::time_point TokenBucket::Reserve(uint64_t bytes) {
  const Clock::time_point now = Clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  reserved_ += bytes;
  if (rate_ <= 0) return now;
  RefillLocked(now);
  // Debt instead of a queue: the next caller's release time lands after this one's bytes are
  // paid for, which gives call-order fairness without tracking waiters.
  tokens_ -= double(bytes);
  if (tokens_ >= 0) return now;
  return now + std::chrono::duration_cast<Clock::duration>(
                   std::chrono::duration<double>(-tokens_ / rate_));
}

void TokenBucket::Refund(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  reserved_ -= std::min(reserved_, bytes);
  if (rate_ <= 0) return;
  RefillLocked(Clock::now());
  tokens_ = std::min(burst_, tokens_ + double(bytes));
}

bool TokenBucket::Acquire(uint64_t bytes, Deadline deadline) {
  const Clock::time_point release = Reserve(bytes);
  if (release > deadline) {
    Refund(bytes);
    return false;
  }
  std::this_thread::sleep_until(release);
  return true;
}

void TokenBucket::Set(double bytes_per_s, uint64_t burst_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  RefillLocked(Clock::now());
  rate_ = bytes_per_s > 0 ? bytes_per_s : 0;
  burst_ = double(std::max<uint64_t>(burst_bytes, 1));
  tokens_ = std::min(tokens_, burst_);
}

double TokenBucket::rate() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rate_;
}

uint64_t TokenBucket::burst() const {
  std::lock_guard<std::mutex> lock(mu_);
  return uint64_t(burst_);
}

uint64_t TokenBucket::reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reserved_;
}

// ---- options -------------------------------------------------------------------------------------

namespace {
constexpr uint64_t kMinChunk = 256 << 10;
constexpr uint64_t kMaxChunk = 64 << 20;

uint64_t DefaultChunk(double rate) {
  if (!(rate > 0)) return kMaxChunk;
  const double one_ms = rate * 1e-3;
  return uint64_t(std::clamp(one_ms, double(kMinChunk), double(kMaxChunk)));
}
}  // namespace

Result<PacingOptions> ResolvePacingDefaults(const PacingOptions& options) {
  if (!std::isfinite(options.bytes_per_s) || options.bytes_per_s < 0) {
    return InvalidArgument("pacing rate must be a finite number of bytes/s >= 0 (0 = unlimited), got " +
                           std::to_string(options.bytes_per_s));
  }
  PacingOptions out = options;
  if (out.chunk_bytes == 0) out.chunk_bytes = DefaultChunk(out.bytes_per_s);
  if (out.burst_bytes == 0) out.burst_bytes = 2 * out.chunk_bytes;
  return out;
}

Result<double> PaceRateForItlTarget(const ItlBudget& b) {
  auto positive = [](double v) { return std::isfinite(v) && v > 0; };
  if (!positive(b.itl_target_s)) return InvalidArgument("ITL target must be > 0 seconds");
  if (!positive(b.device_bw_bytes_per_s))
    return InvalidArgument("device copy bandwidth must be > 0 bytes/s (measure it)");
  if (!positive(b.hbm_bytes_per_byte))
    return InvalidArgument("HBM bytes per transferred byte must be > 0 (2 within one GPU, 1 from a peer or the host)");
  if (!std::isfinite(b.idle_step_s) || b.idle_step_s < 0 || !std::isfinite(b.step_hbm_bytes) ||
      b.step_hbm_bytes < 0) {
    return InvalidArgument("idle step time and step HBM bytes must be finite and >= 0");
  }
  double t0 = b.idle_step_s;
  if (t0 == 0) {
    if (b.step_hbm_bytes == 0)
      return InvalidArgument("the ITL budget needs the decode step's idle time or its HBM bytes");
    t0 = b.step_hbm_bytes / b.device_bw_bytes_per_s;
  }
  if (t0 >= b.itl_target_s) {
    return FailedPrecondition("the decode step takes " + std::to_string(t0 * 1e3) +
                              " ms idle, not below the ITL target of " +
                              std::to_string(b.itl_target_s * 1e3) +
                              " ms: no transfer rate keeps it within the target");
  }
  return b.device_bw_bytes_per_s * (1 - t0 / b.itl_target_s) / b.hbm_bytes_per_byte;
}

Result<PacingOptions> ResolvePacing(const TransportOptions& options) {
  const PacingOptions& o = options.pacing;
  PacingOptions p;
  p.burst_bytes = o.burst_bytes;
  p.chunk_bytes = o.chunk_bytes;
  if (!std::isfinite(o.bytes_per_s) || o.bytes_per_s < 0)
    return InvalidArgument("pace_bytes_per_s must be >= 0 (0 = unlimited)");
  if (!std::isfinite(o.itl_target_ms) || o.itl_target_ms < 0)
    return InvalidArgument("itl_target_ms must be >= 0 (0 = none)");
  if (o.bytes_per_s > 0) {
    p.bytes_per_s = o.bytes_per_s;
  } else if (o.itl_target_ms > 0) {
    ItlBudget b;
    b.itl_target_s = o.itl_target_ms * 1e-3;
    b.idle_step_s = o.itl_idle_step_ms * 1e-3;
    b.step_hbm_bytes = o.itl_step_hbm_bytes;
    b.device_bw_bytes_per_s = o.itl_device_bw_bytes_per_s;
    b.hbm_bytes_per_byte = o.itl_hbm_bytes_per_byte;
    auto r = PaceRateForItlTarget(b);
    if (!r.ok()) return r.status().WithContext("deriving the pacing rate from itl_target_ms");
    p.bytes_per_s = *r;
  }
  return ResolvePacingDefaults(p);
}

// ---- PacedEndpoint -------------------------------------------------------------------------------

namespace {

using internal::WriteCompletion;

struct Chunk {
  std::vector<CopyOp> ops;
  uint64_t bytes = 0;
};

// Cuts the coalesced runs at chunk boundaries (a chunk may hold several small runs); a write
// without bytes keeps one empty chunk so that its notification still goes through the backend.
std::vector<Chunk> SplitIntoChunks(const internal::WritePlan& plan, uint64_t chunk_bytes,
                                   uint64_t* pieces) {
  std::vector<Chunk> out;
  Chunk cur;
  *pieces = 0;
  for (const internal::Run& run : plan.runs) {
    uint64_t off = 0;
    while (off < run.length) {
      const uint64_t n = std::min(chunk_bytes - cur.bytes, run.length - off);
      cur.ops.push_back(CopyOp{run.local_offset + off, run.remote_offset + off, n});
      cur.bytes += n;
      off += n;
      ++*pieces;
      if (cur.bytes == chunk_bytes) {
        out.push_back(std::move(cur));
        cur = Chunk{};
      }
    }
  }
  if (cur.bytes > 0 || out.empty()) out.push_back(std::move(cur));
  return out;
}

// True when two ops write the same destination byte: such a write must keep its order across
// chunks (transport.h), so its chunks go one at a time.
bool DestinationsOverlap(const internal::WritePlan& plan) {
  std::vector<std::pair<uint64_t, uint64_t>> r;
  r.reserve(plan.runs.size());
  for (const internal::Run& run : plan.runs) r.emplace_back(run.remote_offset, run.length);
  std::sort(r.begin(), r.end());
  for (size_t i = 1; i < r.size(); ++i) {
    if (r[i - 1].first + r[i - 1].second > r[i].first) return true;
  }
  return false;
}

struct PacedWrite {
  WriteRequest proto;  // the caller's request without its ops
  bool ordered = false; // destinations overlap: one chunk in flight at a time
  std::vector<Chunk> chunks;
  size_t next = 0;      // first chunk not posted yet
  size_t completed = 0; // chunks seen complete and OK
  bool reserved = false;
  Clock::time_point release;
  std::vector<std::unique_ptr<WriteHandle>> inflight;
  Status error;
  bool cancel_forwarded = false;
  std::shared_ptr<WriteCompletion> completion;

  bool last_chunk_next() const { return next + 1 == chunks.size(); }
};

// While chunks are in flight the worker polls their handles (the Endpoint interface has no
// completion callback); this bounds the extra latency of a notification gated on them.
constexpr auto kPollInterval = std::chrono::microseconds(200);
constexpr auto kIdleWait = std::chrono::milliseconds(100);

struct PacedState {
  std::mutex mu;
  std::condition_variable cv;
  bool shutdown = false;
  std::deque<std::unique_ptr<PacedWrite>> active;

  void Poke() {
    { std::lock_guard<std::mutex> lock(mu); }
    cv.notify_all();
  }
};

class PacedEndpoint final : public Endpoint {
 public:
  PacedEndpoint(std::unique_ptr<Endpoint> inner, std::vector<uint64_t> remote_lengths,
                std::shared_ptr<TokenBucket> bucket, uint64_t chunk_bytes)
      : inner_(std::move(inner)),
        remote_lengths_(std::move(remote_lengths)),
        bucket_(std::move(bucket)),
        chunk_bytes_(chunk_bytes),
        state_(std::make_shared<PacedState>()) {
    worker_ = std::thread([this] { Loop(); });
  }

  ~PacedEndpoint() override {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->shutdown = true;
    }
    state_->cv.notify_all();
    worker_.join();
    std::deque<std::unique_ptr<PacedWrite>> left;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      left.swap(state_->active);
    }
    for (auto& w : left) {
      if (w->reserved) bucket_->Refund(w->chunks[w->next].bytes);
      for (auto& h : w->inflight) h->Cancel();
    }
    // The inner endpoint's close finishes every inner handle and guarantees nothing more lands.
    inner_.reset();
    for (auto& w : left) {
      for (auto& h : w->inflight) {
        Status s = h->Wait(Clock::now());
        if (s.ok()) {
          ++w->completed;
        } else if (w->error.ok()) {
          w->error = s;
        }
      }
      if (w->completed == w->chunks.size()) {
        w->completion->Complete(OkStatus());
      } else {
        w->completion->Complete(Canceled("paced endpoint closed before the write finished"));
      }
    }
  }

  Result<std::unique_ptr<WriteHandle>> Write(const WriteRequest& request) override {
    KV_RETURN_IF_ERROR(internal::CheckRequestShape(request, remote_lengths_.size()));
    KV_ASSIGN_OR_RETURN(internal::WritePlan plan,
                        internal::PlanWrite(request.ops, request.local->region().length,
                                            remote_lengths_[size_t(request.remote_region)]));
    auto w = std::make_unique<PacedWrite>();
    w->proto = request;
    w->proto.ops.clear();
    uint64_t pieces = 0;
    w->chunks = SplitIntoChunks(plan, chunk_bytes_, &pieces);
    w->ordered = w->chunks.size() > 1 && DestinationsOverlap(plan);
    w->completion = std::make_shared<WriteCompletion>(plan.bytes, pieces);
    // A cancel wakes the worker so that it stops posting the write's chunks.
    auto handle = std::make_unique<internal::CompletionHandle>(
        w->completion, [state = state_] { state->Poke(); });
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->active.push_back(std::move(w));
    }
    state_->cv.notify_all();
    return std::unique_ptr<WriteHandle>(std::move(handle));
  }

  Status status() const override { return inner_->status(); }
  std::string AdmissionTicket() const override { return inner_->AdmissionTicket(); }

 private:
  // Worker thread: reaps finished chunks, completes writes, posts chunks whose budget is due.
  void Loop() {
    std::unique_lock<std::mutex> lock(state_->mu);
    while (!state_->shutdown) {
      const Clock::time_point now = Clock::now();
      Clock::time_point wake = now + kIdleWait;
      bool any_inflight = false;
      for (auto it = state_->active.begin(); it != state_->active.end();) {
        if (Progress(**it)) {
          it = state_->active.erase(it);
          continue;
        }
        if (!(*it)->inflight.empty()) any_inflight = true;
        ++it;
      }
      Issue(lock, &wake, &any_inflight);
      if (any_inflight) wake = std::min(wake, now + kPollInterval);
      state_->cv.wait_until(lock, wake);
    }
  }

  // Reaps the write's finished chunks; returns true once the write is complete (and completed).
  bool Progress(PacedWrite& w) {
    for (auto h = w.inflight.begin(); h != w.inflight.end();) {
      if (!(*h)->Done()) {
        ++h;
        continue;
      }
      Status s = (*h)->Wait(Clock::now());
      if (s.ok()) {
        ++w.completed;
      } else if (w.error.ok()) {
        w.error = s;
      }
      h = w.inflight.erase(h);
    }
    const bool stop = !w.error.ok() || w.completion->cancel_requested();
    if (stop) {
      if (w.reserved) {
        bucket_->Refund(w.chunks[w.next].bytes);
        w.reserved = false;
      }
      if (!w.cancel_forwarded) {
        for (auto& h : w.inflight) h->Cancel();
        w.cancel_forwarded = true;
      }
      if (!w.inflight.empty()) return false;
      if (!w.error.ok()) {
        w.completion->Complete(w.error);
      } else if (w.completed == w.chunks.size()) {
        w.completion->Complete(OkStatus());
      } else {
        w.completion->Complete(Canceled("write cancelled after " + std::to_string(w.completed) +
                                        " of " + std::to_string(w.chunks.size()) + " chunks"));
      }
      return true;
    }
    if (w.next == w.chunks.size() && w.inflight.empty()) {
      w.completion->Complete(OkStatus());
      return true;
    }
    return false;
  }

  // Posts due chunks, oldest write first. One reservation at a time per endpoint, so the
  // bucket's debt stays bounded by what is about to be posted. The lock is released around the
  // inner Write() (a backend may take a while to post), so that Write() and Cancel() callers are
  // never held up by it; Write() may grow `active` meanwhile, hence the rescan after each post.
  void Issue(std::unique_lock<std::mutex>& lock, Clock::time_point* wake, bool* any_inflight) {
  rescan:
    if (state_->shutdown) return;
    const Clock::time_point now = Clock::now();
    for (auto& wp : state_->active) {
      PacedWrite& w = *wp;
      if (w.next == w.chunks.size() || !w.error.ok() || w.completion->cancel_requested()) continue;
      // The notification rides on the last chunk: every earlier chunk must have landed.
      if (w.proto.notify && w.last_chunk_next() && w.next > 0 && !w.inflight.empty()) continue;
      if (w.ordered && !w.inflight.empty()) continue;
      // A producer dependency is honoured by chunk 0; the others follow its completion.
      if (w.proto.after_stream != nullptr && w.next > 0 && w.completed == 0) continue;
      if (!w.reserved) {
        w.release = bucket_->Reserve(w.chunks[w.next].bytes);
        w.reserved = true;
      }
      if (w.release > now) {
        *wake = std::min(*wake, w.release);
        return;
      }
      WriteRequest req = w.proto;
      req.ops = w.chunks[w.next].ops;
      req.notify = w.proto.notify && w.last_chunk_next();
      if (w.next > 0) req.after_stream = nullptr;
      w.reserved = false;
      const uint64_t bytes = w.chunks[w.next].bytes;
      ++w.next;
      // Only this thread erases from `active` or touches a write's posting state, so `w` stays
      // valid while unlocked.
      lock.unlock();
      auto h = inner_->Write(req);
      lock.lock();
      if (!h.ok()) {
        // Nothing of this chunk was posted: its budget goes back.
        bucket_->Refund(bytes);
        w.error = h.status();
      } else {
        w.inflight.push_back(std::move(h).value());
        *any_inflight = true;
      }
      goto rescan;
    }
  }

  std::unique_ptr<Endpoint> inner_;
  const std::vector<uint64_t> remote_lengths_;
  const std::shared_ptr<TokenBucket> bucket_;
  const uint64_t chunk_bytes_;
  std::shared_ptr<PacedState> state_;
  std::thread worker_;
};

class PacedTransport final : public Transport {
 public:
  PacedTransport(std::unique_ptr<Transport> inner, std::shared_ptr<TokenBucket> bucket,
                 uint64_t chunk_bytes)
      : inner_(std::move(inner)), bucket_(std::move(bucket)), chunk_bytes_(chunk_bytes) {}
  std::string name() const override { return inner_->name(); }
  Capabilities capabilities() const override { return inner_->capabilities(); }
  std::string LocalAddress() const override { return inner_->LocalAddress(); }
  Result<std::unique_ptr<Registration>> Register(const MemoryRegion& region) override {
    return inner_->Register(region);
  }
  Result<std::unique_ptr<Registration>> Allocate(size_t length) override {
    return inner_->Allocate(length);
  }
  Result<std::unique_ptr<Endpoint>> Connect(const PeerDescriptor& peer) override {
    KV_ASSIGN_OR_RETURN(std::unique_ptr<Endpoint> ep, inner_->Connect(peer));
    return PaceEndpoint(std::move(ep), peer, bucket_, chunk_bytes_);
  }
  Status Admit(const std::string& ticket) override { return inner_->Admit(ticket); }
  TransportCounters counters() const override { return inner_->counters(); }
  void SetNotificationSink(NotificationSink sink) override {
    inner_->SetNotificationSink(std::move(sink));
  }
  Status StreamWaitLanded(const Notification& n, void* stream, Deadline deadline) override {
    return inner_->StreamWaitLanded(n, stream, deadline);
  }
  Status ConfirmLanded(const Notification& n) override { return inner_->ConfirmLanded(n); }

 private:
  std::unique_ptr<Transport> inner_;
  std::shared_ptr<TokenBucket> bucket_;
  uint64_t chunk_bytes_;
};

}  // namespace

Result<std::unique_ptr<Endpoint>> PaceEndpoint(std::unique_ptr<Endpoint> inner,
                                               const PeerDescriptor& peer,
                                               std::shared_ptr<TokenBucket> bucket,
                                               uint64_t chunk_bytes) {
  if (!inner) return InvalidArgument("PaceEndpoint: no endpoint to pace");
  if (!bucket) return InvalidArgument("PaceEndpoint: no token bucket");
  if (bucket->unlimited()) return inner;
  if (chunk_bytes == 0) chunk_bytes = DefaultChunk(bucket->rate());
  std::vector<uint64_t> lengths;
  lengths.reserve(peer.regions.size());
  for (const RemoteRegion& r : peer.regions) lengths.push_back(r.length);
  return std::unique_ptr<Endpoint>(
      new PacedEndpoint(std::move(inner), std::move(lengths), std::move(bucket), chunk_bytes));
}

Result<std::unique_ptr<Transport>> PaceTransport(std::unique_ptr<Transport> inner,
                                                 const PacingOptions& options) {
  if (!inner) return InvalidArgument("PaceTransport: no transport to pace");
  KV_ASSIGN_OR_RETURN(PacingOptions o, ResolvePacingDefaults(options));
  if (o.bytes_per_s <= 0) return inner;
  auto bucket = std::make_shared<TokenBucket>(o.bytes_per_s, o.burst_bytes);
  return std::unique_ptr<Transport>(new PacedTransport(std::move(inner), std::move(bucket),
                                                       o.chunk_bytes));
}

}  // namespace kvstream::transport
