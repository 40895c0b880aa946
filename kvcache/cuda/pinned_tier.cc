#include "kvcache/cuda/pinned_tier.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/log.h"
#include "kvcache/cuda/block_copy.h"
#include "model/cuda/device_buffer.h"  // CudaStatus

namespace kvstream::kvcache::cuda {

using model::CudaStatus;

namespace {
// Blocking sync: the thread that waits for copies sleeps instead of spinning on a core.
constexpr unsigned kEventFlags = cudaEventDisableTiming | cudaEventBlockingSync;
}  // namespace

EventPool::~EventPool() {
  for (cudaEvent_t e : free_) cudaEventDestroy(e);
}

Status EventPool::Reserve(int n) {
  std::lock_guard<std::mutex> lock(mu_);
  while (int(free_.size()) < n) {
    cudaEvent_t e;
    KV_RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&e, kEventFlags), "cudaEventCreate"));
    free_.push_back(e);
    ++created_;
  }
  return OkStatus();
}

Result<cudaEvent_t> EventPool::Take() {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.empty()) {
    cudaEvent_t e;
    KV_RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&e, kEventFlags), "cudaEventCreate"));
    ++created_;
    return e;
  }
  cudaEvent_t e = free_.back();
  free_.pop_back();
  return e;
}

void EventPool::Give(cudaEvent_t e) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(e);
}

int EventPool::created() const {
  std::lock_guard<std::mutex> lock(mu_);
  return created_;
}

int EventPool::free_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return int(free_.size());
}

PinnedHostTier::Prefetch::~Prefetch() {
  // A wait already enqueued captured its record; recording the event again later is safe.
  for (cudaEvent_t e : layer_events_) events_->Give(e);
}

Status PinnedHostTier::Prefetch::WaitLayer(int layer, void* stream) const {
  if (layer_events_.empty()) return OkStatus();
  if (layer < 0 || size_t(layer) >= layer_events_.size())
    return InvalidArgument("prefetch: no layer " + std::to_string(layer));
  return CudaStatus(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), layer_events_[layer], 0),
                    "cudaStreamWaitEvent");
}

Status PinnedHostTier::Prefetch::WaitAll() const {
  if (layer_events_.empty()) return OkStatus();
  return CudaStatus(cudaEventSynchronize(layer_events_.back()), "cudaEventSynchronize");
}

Result<std::unique_ptr<PinnedHostTier>> PinnedHostTier::Create(model::KvPool* pool,
                                                               const Options& options) {
  if (pool == nullptr || !pool->memory().on_device())
    return InvalidArgument("pinned host KV tier: the pool is not on a GPU");
  const model::KvLayout& l = pool->layout();
  const size_t slot = size_t(l.num_layers) * l.block_bytes();
  if (slot == 0 || l.block_bytes() % 16 != 0)
    return InvalidArgument("pinned host KV tier: a block of " + std::to_string(l.block_bytes()) +
                           " bytes per layer (a multiple of 16 needed)");
  const size_t slots = options.capacity_bytes / slot;
  if (slots == 0)
    return InvalidArgument("pinned host KV tier: " + std::to_string(options.capacity_bytes) +
                           " bytes hold no block of " + std::to_string(slot) + " bytes");
  if (slots > (1u << 30)) return InvalidArgument("pinned host KV tier: too many slots");
  std::unique_ptr<PinnedHostTier> t(new PinnedHostTier(pool, options, int(slots)));
  KV_RETURN_IF_ERROR(t->Init());
  return t;
}

PinnedHostTier::PinnedHostTier(model::KvPool* pool, const Options& options, int slots)
    : pool_(pool),
      options_([&] {
        Options o = options;
        if (!(o.low_watermark > 0 && o.low_watermark <= 1)) o.low_watermark = 0.9;
        if (o.copy_ctas <= 0) o.copy_ctas = 16;
        return o;
      }()),
      block_bytes_(pool->layout().block_bytes()),
      slots_(slots),
      copy_ctas_(options_.copy_ctas),
      engine_max_runs_(options_.engine_max_runs) {
  free_.reserve(slots);
  for (int i = slots - 1; i >= 0; --i) free_.push_back(i);
  stats_.capacity_bytes = uint64_t(slots) * pool->layout().num_layers * block_bytes_;
}

Status PinnedHostTier::Init() {
  device_ = pool_->memory().device();
  KV_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
  const size_t bytes = size_t(slots_) * pool_->layout().num_layers * block_bytes_;
  void* p = nullptr;
  KV_RETURN_IF_ERROR(CudaStatus(
      cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable), "cudaHostAlloc (KV tier)"));
  host_ = static_cast<std::byte*>(p);
  KV_RETURN_IF_ERROR(CudaStatus(cudaHostGetDevicePointer(&p, host_, 0), "cudaHostGetDevicePointer"));
  dhost_ = static_cast<std::byte*>(p);
  // Two ids per block; at most the pool's blocks twice over in flight (reads and writes).
  ring_size_ = size_t(4) * pool_->num_blocks() + 64;
  KV_RETURN_IF_ERROR(CudaStatus(
      cudaHostAlloc(&p, ring_size_ * sizeof(int32_t), cudaHostAllocMapped | cudaHostAllocPortable),
      "cudaHostAlloc (KV tier ids)"));
  ring_ = static_cast<int32_t*>(p);
  KV_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&p, ring_size_ * sizeof(int32_t)), "cudaMalloc (KV tier ids)"));
  dring_ = static_cast<int32_t*>(p);
  int least = 0, greatest = 0;
  KV_RETURN_IF_ERROR(CudaStatus(cudaDeviceGetStreamPriorityRange(&least, &greatest),
                                "cudaDeviceGetStreamPriorityRange"));
  KV_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, least),
                                "cudaStreamCreateWithPriority"));
  KV_RETURN_IF_ERROR(events_.Reserve(4 * pool_->layout().num_layers + 16));
  stage_blocks_ = int(std::min<size_t>(options_.stage_bytes / block_bytes_, size_t(pool_->num_blocks())));
  if (stage_blocks_ > 0) {
    KV_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&p, size_t(stage_blocks_) * block_bytes_),
                                  "cudaMalloc (KV tier staging)"));
    dstage_ = static_cast<std::byte*>(p);
    std::vector<int32_t> seq(static_cast<size_t>(stage_blocks_), 0);
    for (int i = 0; i < stage_blocks_; ++i) seq[size_t(i)] = i;
    KV_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&p, seq.size() * sizeof(int32_t)), "cudaMalloc (KV tier staging ids)"));
    dseq_ = static_cast<int32_t*>(p);
    KV_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpy(dseq_, seq.data(), seq.size() * sizeof(int32_t), cudaMemcpyHostToDevice),
        "cudaMemcpy (KV tier staging ids)"));
  }
  reaper_ = std::thread([this] { Reaper(); });
  return OkStatus();
}

PinnedHostTier::~PinnedHostTier() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  if (reaper_.joinable()) reaper_.join();  // it finishes every copy in flight first
  if (stream_) cudaStreamDestroy(stream_);
  if (dring_) cudaFree(dring_);
  if (dstage_) cudaFree(dstage_);
  if (dseq_) cudaFree(dseq_);
  if (ring_) cudaFreeHost(ring_);
  if (host_) cudaFreeHost(host_);
}


bool PinnedHostTier::RingAllocLocked(size_t n, uint64_t* pos) {
  uint64_t p = ring_head_;
  if (p % ring_size_ + n > ring_size_) p += ring_size_ - p % ring_size_;  // no run wraps
  if (p + n - ring_tail_ > ring_size_) return false;
  *pos = p;
  ring_head_ = p + n;
  return true;
}

void PinnedHostTier::EraseLocked(const BlockKey& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  if (it->second.pins > 0 || !it->second.ready) {
    it->second.doomed = true;  // freed when its copy completes
    return;
  }
  free_.push_back(it->second.slot);
  lru_.erase(it->second.lru);
  index_.erase(it);
}

int PinnedHostTier::SlotLocked() {
  if (free_.empty()) {
    // Down to the low watermark at once, so a full tier does not evict on every write.
    const size_t low = size_t(std::max(0, int(std::floor(slots_ * options_.low_watermark)) - 1));
    std::vector<BlockKey> victims;
    for (auto it = lru_.rbegin(); it != lru_.rend() && index_.size() - victims.size() > low; ++it)
      if (index_.at(*it).pins == 0) victims.push_back(*it);
    // Oldest first in the LRU is usually lowest first in a chain: freed so that the next
    // write-down takes them back in ascending order (consecutive slots copy as one run).
    for (auto it = victims.rbegin(); it != victims.rend(); ++it) EraseLocked(*it);
    stats_.evicted_blocks += victims.size();
  }
  if (free_.empty()) return -1;
  const int s = free_.back();
  free_.pop_back();
  return s;
}

// Runs of consecutive ids on both sides: [start index, length).
std::vector<std::pair<int, int>> PinnedHostTier::Runs(std::span<const int32_t> src,
                                                     std::span<const int32_t> dst) {
  std::vector<std::pair<int, int>> runs;
  for (size_t i = 0; i < src.size(); ++i) {
    if (!runs.empty() && src[i] == src[i - 1] + 1 && dst[i] == dst[i - 1] + 1) ++runs.back().second;
    else runs.push_back({int(i), 1});
  }
  return runs;
}

// Layers [c.layer_begin, c.layer_end): one copy-engine memcpy per run and layer when the blocks
// form few runs (no SMs taken from the forward). Else, when the tier's side (its slots: runs
// where a write-down found consecutive room) forms few runs: staged, each layer's runs move by
// copy engine to or from the device staging buffer, in order, and the gather kernel moves the
// staging buffer to or from the scattered pool blocks at device-memory speed (its SMs held for
// a small part of the copy's time; the stream orders the buffer's reuse). Else the gather kernel
// over the link.
Status PinnedHostTier::CopyLayers(const BlockCopy& c, const std::vector<std::pair<int, int>>& runs,
                                  std::span<const int32_t> src, std::span<const int32_t> dst) {
  if (int(runs.size()) <= engine_max_runs_.load()) {
    ++engine_copies_;
    for (int l = c.layer_begin; l < c.layer_end; ++l)
      for (const auto& [i, len] : runs) {
        const std::byte* from = c.src_base + l * c.src_layer_stride + size_t(src[i]) * c.block_bytes;
        std::byte* to = c.dst_base + l * c.dst_layer_stride + size_t(dst[i]) * c.block_bytes;
        KV_RETURN_IF_ERROR(CudaStatus(
            cudaMemcpyAsync(to, from, size_t(len) * c.block_bytes, cudaMemcpyDefault, stream_),
            "cudaMemcpyAsync (KV tier)"));
      }
    return OkStatus();
  }
  const bool host_src = c.src_base == dhost_;
  const std::span<const int32_t> tier_ids = host_src ? src : dst;
  std::vector<std::pair<int, int>> tier_runs;  // [index, length) of consecutive slots
  for (size_t i = 0; i < tier_ids.size() && int(tier_runs.size()) <= kStagedMaxRuns; ++i) {
    if (!tier_runs.empty() && tier_ids[i] == tier_ids[i - 1] + 1) ++tier_runs.back().second;
    else tier_runs.push_back({int(i), 1});
  }
  if (staging_.load() && dstage_ != nullptr && c.n <= stage_blocks_ &&
      int(tier_runs.size()) <= kStagedMaxRuns) {
    ++staged_copies_;
    constexpr int kStageCtas = 64;  // a device-memory copy: brief, whatever its width
    for (int l = c.layer_begin; l < c.layer_end; ++l) {
      BlockCopy k = c;  // the pool side as given, the tier side the staging buffer (index i at i)
      k.layer_begin = l;
      k.layer_end = l + 1;
      if (host_src) {
        for (const auto& [i, len] : tier_runs)
          KV_RETURN_IF_ERROR(CudaStatus(
              cudaMemcpyAsync(dstage_ + size_t(i) * c.block_bytes,
                              c.src_base + l * c.src_layer_stride + size_t(src[i]) * c.block_bytes,
                              size_t(len) * c.block_bytes, cudaMemcpyDefault, stream_),
              "cudaMemcpyAsync (KV tier, staged)"));
        k.src_base = dstage_;  // stride 0: the same buffer for every layer
        k.src_layer_stride = 0;
        k.src_ids = dseq_;
        KV_RETURN_IF_ERROR(CudaStatus(CopyBlocks(k, kStageCtas, stream_), "KV tier staged copy"));
      } else {
        k.dst_base = dstage_;
        k.dst_layer_stride = 0;
        k.dst_ids = dseq_;
        KV_RETURN_IF_ERROR(CudaStatus(CopyBlocks(k, kStageCtas, stream_), "KV tier staged copy"));
        for (const auto& [i, len] : tier_runs)
          KV_RETURN_IF_ERROR(CudaStatus(
              cudaMemcpyAsync(c.dst_base + l * c.dst_layer_stride + size_t(dst[i]) * c.block_bytes,
                              dstage_ + size_t(i) * c.block_bytes, size_t(len) * c.block_bytes,
                              cudaMemcpyDefault, stream_),
              "cudaMemcpyAsync (KV tier, staged)"));
      }
    }
    return OkStatus();
  }
  ++kernel_copies_;
  return CudaStatus(CopyBlocks(c, copy_ctas_.load(), stream_), "KV tier block copy");
}

std::unique_ptr<PoolPrefetch> PinnedHostTier::Fetch(
    const BlockKey& root, std::span<const int32_t> tokens, int from_tokens,
    model::BlockLease* lease, const std::function<void(int)>& make_room) {
  auto result = std::make_unique<Prefetch>();
  result->events_ = &events_;
  result->from_ = result->tokens_ = from_tokens;
  const int bs = pool_->layout().block_size;
  const int n = int(tokens.size());
  if (from_tokens >= n || from_tokens % bs != 0) return result;
  const auto t0 = Clock::now();
  const std::vector<BlockKey> keys = ChainKeys(root, tokens, pool_->layout().block_size);
  const size_t first = size_t(from_tokens / bs);
  std::vector<BlockKey> pinned;
  std::vector<int32_t> slots;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t b = first; b < keys.size(); ++b) {
      if (!UsableLocked(keys[b])) {
        ++stats_.miss_blocks;
        break;
      }
      auto it = index_.find(keys[b]);
      ++it->second.pins;
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      pinned.push_back(keys[b]);
      slots.push_back(it->second.slot);
    }
  }
  auto unpin = [&](size_t from) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = from; i < pinned.size(); ++i) UnpinLocked(pinned[i]);
    pinned.resize(from);
    slots.resize(from);
  };
  if (pinned.empty()) return result;
  const int end = std::min(n, int(first + pinned.size()) * bs);
  if (int(lease->ids().size()) * bs < end) {
    Status grown = lease->GrowToTokens(end, bs);
    if (!grown.ok() && make_room) {
      make_room(model::BlocksForTokens(end, bs) - int(lease->ids().size()));
      grown = lease->GrowToTokens(end, bs);
    }
    if (!grown.ok()) {
      unpin(0);
      return result;  // a miss: no room in the pool
    }
  }
  const int nb = int(pinned.size());
  std::vector<int32_t> dst(lease->ids().begin() + first, lease->ids().begin() + first + nb);
  Transfer t;
  t.keys = pinned;
  Status st = pool_->allocator().Ref(dst);
  if (st.ok()) t.pool_refs = model::BlockLease(&pool_->allocator(), dst);
  const int nl = pool_->layout().num_layers;
  std::vector<cudaEvent_t> evs;
  for (int l = 0; l <= nl && st.ok(); ++l) {  // one per layer, and the transfer's own
    auto e = events_.Take();
    if (!e.ok()) st = e.status();
    else evs.push_back(*e);
  }
  if (st.ok()) st = CudaStatus(cudaSetDevice(device_), "cudaSetDevice");
  std::unique_lock<std::mutex> lock(mu_);
  uint64_t pos = 0;
  const uint64_t old_head = ring_head_;
  if (st.ok()) {
    cv_.wait(lock, [&] { return RingAllocLocked(2 * size_t(nb), &pos) || stopping_; });
    if (stopping_) st = Unavailable("pinned host KV tier stopping");
  }
  if (st.ok()) {
    int32_t* ids = ring_ + pos % ring_size_;
    std::copy(slots.begin(), slots.end(), ids);
    std::copy(dst.begin(), dst.end(), ids + nb);
    st = CudaStatus(cudaMemcpyAsync(dring_ + pos % ring_size_, ids, 2 * size_t(nb) * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, stream_),
                    "cudaMemcpyAsync (KV tier ids)");
    ids = dring_ + pos % ring_size_;
    BlockCopy c;
    c.src_base = dhost_;
    c.src_layer_stride = size_t(slots_) * block_bytes_;
    c.src_ids = ids;
    c.dst_base = pool_->base();
    c.dst_layer_stride = pool_->layout().layer_bytes(pool_->num_blocks());
    c.dst_ids = ids + nb;
    c.n = nb;
    c.block_bytes = block_bytes_;
    const auto runs = Runs(slots, dst);
    for (int l = 0; l < nl && st.ok(); ++l) {
      c.layer_begin = l;
      c.layer_end = l + 1;
      st = CopyLayers(c, runs, slots, dst);
      if (st.ok()) st = CudaStatus(cudaEventRecord(evs[l], stream_), "cudaEventRecord");
    }
    if (st.ok()) st = CudaStatus(cudaEventRecord(evs[nl], stream_), "cudaEventRecord");
    if (!st.ok()) {
      // Nothing of this fetch may land later in blocks the forward is about to compute.
      cudaStreamSynchronize(stream_);
      ring_head_ = old_head;  // taken under the lock: nothing allocated after it
    }
  }
  if (!st.ok()) {
    lock.unlock();
    KV_LOG_WARN << "pinned host KV tier: fetch of " << nb << " blocks not started (a miss): "
                << st.ToString();
    for (cudaEvent_t e : evs) events_.Give(e);
    t.pool_refs.Reset();
    unpin(0);
    std::lock_guard<std::mutex> l2(mu_);
    ++stats_.read_failures;
    return result;
  }
  t.done = evs[nl];
  t.ring_end = pos + 2 * size_t(nb);
  fifo_.push_back(std::move(t));
  cv_.notify_all();
  stats_.hit_blocks += nb;
  stats_.bytes_read += uint64_t(nb) * nl * block_bytes_;
  fetched_tokens_ += uint64_t(end - from_tokens);
  fetch_us_ += uint64_t(std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count());
  lock.unlock();
  evs.pop_back();
  result->layer_events_ = std::move(evs);
  result->tokens_ = end;
  return result;
}

void PinnedHostTier::WriteDown(const BlockKey& root, std::span<const int32_t> tokens,
                               const std::vector<int32_t>& ids, std::function<void()> written) {
  const int bs = pool_->layout().block_size;
  if (tokens.empty() || int64_t(ids.size()) * bs < int64_t(tokens.size())) {
    if (written) written();
    return;
  }
  const std::vector<BlockKey> keys = ChainKeys(root, tokens, bs);
  WriteKeyed(keys, std::span<const int32_t>(ids).first(keys.size()), std::move(written));
}

void PinnedHostTier::WriteBlocks(std::span<const KeyedBlock> blocks, std::function<void()> written) {
  std::vector<BlockKey> keys;
  std::vector<int32_t> ids;
  for (const KeyedBlock& b : blocks) {
    keys.push_back(b.key);
    ids.push_back(b.block);
  }
  WriteKeyed(keys, ids, std::move(written));
}

void PinnedHostTier::WriteKeyed(std::span<const BlockKey> keys, std::span<const int32_t> ids,
                                std::function<void()> written) {
  // Where no copy starts, `written` runs before returning (after the lock is released).
  Transfer t;
  t.written = std::move(written);
  struct RunIfLeft {
    Transfer* t;
    ~RunIfLeft() {
      if (t->written) t->written();
    }
  } run_if_left{&t};
  if (keys.empty()) return;
  t.write = true;
  std::vector<int32_t> slots, src;
  std::unique_lock<std::mutex> lock(mu_);
  if (stopping_) return;
  for (size_t b = 0; b < keys.size(); ++b) {
    if (index_.count(keys[b])) continue;  // held, or being written
    if (writing_blocks_ + src.size() + 1 > uint64_t(pool_->num_blocks()) / 2) {
      skipped_ += keys.size() - b;
      break;
    }
    const int slot = SlotLocked();
    if (slot < 0) {
      stats_.write_failures += keys.size() - b;
      break;
    }
    Entry e;
    e.slot = slot;
    e.lru = lru_.end();
    index_.emplace(keys[b], e);
    t.keys.push_back(keys[b]);
    slots.push_back(slot);
    src.push_back(ids[b]);
  }
  if (src.empty()) return;
  const int nb = int(src.size());
  auto drop = [&] {
    for (const BlockKey& k : t.keys) {
      free_.push_back(index_.at(k).slot);
      index_.erase(k);
    }
    stats_.write_failures += nb;
  };
  uint64_t pos = 0;
  const uint64_t old_head = ring_head_;
  Status st = pool_->allocator().Ref(src);
  if (st.ok()) t.pool_refs = model::BlockLease(&pool_->allocator(), src);
  if (st.ok() && !RingAllocLocked(2 * size_t(nb), &pos)) st = ResourceExhausted("id ring full");
  cudaEvent_t done = nullptr;
  if (st.ok()) {
    auto e = events_.Take();
    if (e.ok()) done = *e;
    else st = e.status();
  }
  if (st.ok()) st = CudaStatus(cudaSetDevice(device_), "cudaSetDevice");
  if (st.ok()) {
    int32_t* ring_ids = ring_ + pos % ring_size_;
    std::copy(src.begin(), src.end(), ring_ids);
    std::copy(slots.begin(), slots.end(), ring_ids + nb);
    st = CudaStatus(cudaMemcpyAsync(dring_ + pos % ring_size_, ring_ids, 2 * size_t(nb) * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, stream_),
                    "cudaMemcpyAsync (KV tier ids)");
    ring_ids = dring_ + pos % ring_size_;
    BlockCopy c;
    c.src_base = pool_->base();
    c.src_layer_stride = pool_->layout().layer_bytes(pool_->num_blocks());
    c.src_ids = ring_ids;
    c.dst_base = dhost_;
    c.dst_layer_stride = size_t(slots_) * block_bytes_;
    c.dst_ids = ring_ids + nb;
    c.n = nb;
    c.block_bytes = block_bytes_;
    c.layer_begin = 0;
    c.layer_end = pool_->layout().num_layers;
    if (st.ok()) st = CopyLayers(c, Runs(src, slots), src, slots);
    if (st.ok()) st = CudaStatus(cudaEventRecord(done, stream_), "cudaEventRecord");
    if (!st.ok()) {
      cudaStreamSynchronize(stream_);
      ring_head_ = old_head;
    }
  }
  if (!st.ok()) {
    if (done) events_.Give(done);
    drop();
    KV_LOG_DEBUG << "pinned host KV tier: write-down of " << nb << " blocks not started: " << st.ToString();
    return;  // t.pool_refs returns its references here
  }
  t.done = done;
  t.ring_end = pos + 2 * size_t(nb);
  writing_blocks_ += nb;
  fifo_.push_back(std::move(t));  // leaves t.written empty: the reaper runs it
  t.written = nullptr;
  cv_.notify_all();
}

void PinnedHostTier::FinishLocked(Transfer& t, bool ok) {
  const size_t slot_bytes = size_t(pool_->layout().num_layers) * block_bytes_;
  for (const BlockKey& k : t.keys) {
    auto it = index_.find(k);
    if (it == index_.end()) continue;
    Entry& e = it->second;
    if (t.write && !ok) {  // never visible: its slot goes back
      free_.push_back(e.slot);
      index_.erase(it);
      ++stats_.write_failures;
      continue;
    }
    if (t.write) {
      e.ready = true;
      e.written = Clock::now();
      lru_.push_front(k);
      e.lru = lru_.begin();
      ++stats_.written_blocks;
      stats_.bytes_written += slot_bytes;
    } else {
      --e.pins;
    }
    if (e.doomed && e.pins == 0) {
      e.doomed = false;
      EraseLocked(k);
    }
  }
  if (t.write) writing_blocks_ -= t.pool_refs.ids().size();
  ring_tail_ = t.ring_end;
}

void PinnedHostTier::Reaper() {
  cudaSetDevice(device_);
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !fifo_.empty(); });
    if (fifo_.empty()) return;  // stopping, nothing in flight
    cudaEvent_t done = fifo_.front().done;
    lock.unlock();
    const cudaError_t e = cudaEventSynchronize(done);
    if (e != cudaSuccess) {
      KV_LOG_ERROR << "pinned host KV tier: copy failed: " << cudaGetErrorString(e);
    }
    lock.lock();
    Transfer t = std::move(fifo_.front());
    fifo_.pop_front();
    reaping_ = true;
    FinishLocked(t, e == cudaSuccess);
    events_.Give(t.done);
    lock.unlock();
    t.pool_refs.Reset();  // the copy is complete: the pool blocks may go
    if (t.written) t.written();
    lock.lock();
    reaping_ = false;
    cv_.notify_all();
  }
}

void PinnedHostTier::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return fifo_.empty() && !reaping_; });
}

void PinnedHostTier::EraseAll() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<BlockKey> all;
  for (const auto& [k, e] : index_) all.push_back(k);
  for (const BlockKey& k : all) EraseLocked(k);
}

bool PinnedHostTier::UsableLocked(const BlockKey& key) {
  auto it = index_.find(key);
  if (it == index_.end() || !it->second.ready || it->second.doomed) return false;
  if (options_.max_age_s > 0 &&
      Clock::now() - it->second.written > std::chrono::seconds(options_.max_age_s)) {
    EraseLocked(key);
    ++stats_.evicted_blocks;
    return false;
  }
  return true;
}

void PinnedHostTier::UnpinLocked(const BlockKey& key) {
  auto it = index_.find(key);
  if (it == index_.end() || it->second.pins == 0) return;
  if (--it->second.pins == 0 && it->second.doomed) {
    it->second.doomed = false;
    EraseLocked(key);
  }
}

bool PinnedHostTier::View::Contains(const BlockKey& key) {
  std::lock_guard<std::mutex> lock(t_->mu_);
  return t_->UsableLocked(key);
}

bool PinnedHostTier::View::Pin(const BlockKey& key) {
  std::lock_guard<std::mutex> lock(t_->mu_);
  if (!t_->UsableLocked(key)) return false;
  ++t_->index_.at(key).pins;
  return true;
}

void PinnedHostTier::View::Unpin(const BlockKey& key) {
  std::lock_guard<std::mutex> lock(t_->mu_);
  t_->UnpinLocked(key);
}

void PinnedHostTier::View::Erase(const BlockKey& key) {
  std::lock_guard<std::mutex> lock(t_->mu_);
  t_->EraseLocked(key);
}

Status PinnedHostTier::View::Get(const BlockKey& key, std::span<const std::span<std::byte>> layers) {
  const int nl = t_->pool_->layout().num_layers;
  if (int(layers.size()) != nl) return InvalidArgument("pinned host KV tier: wrong layer count");
  int slot;
  {
    std::lock_guard<std::mutex> lock(t_->mu_);
    if (!t_->UsableLocked(key)) return NotFound("pinned host KV tier: block not held");
    Entry& e = t_->index_.at(key);
    ++e.pins;  // not evicted while it is copied out
    slot = e.slot;
  }
  for (int l = 0; l < nl; ++l) std::memcpy(layers[l].data(), t_->SlotLayer(slot, l), t_->block_bytes_);
  std::lock_guard<std::mutex> lock(t_->mu_);
  t_->UnpinLocked(key);
  return OkStatus();
}

Status PinnedHostTier::View::Put(const BlockHeader& header,
                                 std::span<const std::span<const std::byte>> layers) {
  const int nl = t_->pool_->layout().num_layers;
  if (int(layers.size()) != nl) return InvalidArgument("pinned host KV tier: wrong layer count");
  int slot;
  {
    std::lock_guard<std::mutex> lock(t_->mu_);
    if (t_->stopping_) return Unavailable("pinned host KV tier stopping");
    if (t_->index_.count(header.key)) return OkStatus();  // held, or being written
    slot = t_->SlotLocked();
    if (slot < 0) {
      ++t_->stats_.write_failures;
      return ResourceExhausted("pinned host KV tier: every slot in use");
    }
    Entry e;
    e.slot = slot;
    e.lru = t_->lru_.end();
    t_->index_.emplace(header.key, e);  // not ready: invisible until its bytes are in
  }
  for (int l = 0; l < nl; ++l) std::memcpy(t_->SlotLayer(slot, l), layers[l].data(), t_->block_bytes_);
  std::lock_guard<std::mutex> lock(t_->mu_);
  Entry& e = t_->index_.at(header.key);
  e.ready = true;
  e.written = Clock::now();
  t_->lru_.push_front(header.key);
  e.lru = t_->lru_.begin();
  ++t_->stats_.written_blocks;
  t_->stats_.bytes_written += uint64_t(nl) * t_->block_bytes_;
  if (e.doomed && e.pins == 0) {
    e.doomed = false;
    t_->EraseLocked(header.key);
  }
  return OkStatus();
}

PinnedHostTier::Stats PinnedHostTier::stats() const {
  Stats s;
  s.events_created = events_.created();
  s.events_free = events_.free_count();
  std::lock_guard<std::mutex> lock(mu_);
  s.tier = stats_;
  s.tier.entries = lru_.size();
  s.tier.bytes_used = uint64_t(lru_.size()) * pool_->layout().num_layers * block_bytes_;
  s.fetched_tokens = fetched_tokens_;
  s.fetch_us = fetch_us_;
  s.skipped_blocks = skipped_;
  s.in_flight = fifo_.size();
  s.ring_used = ring_head_ - ring_tail_;
  s.engine_copies = engine_copies_;
  s.kernel_copies = kernel_copies_;
  s.staged_copies = staged_copies_;
  return s;
}

}  // namespace kvstream::kvcache::cuda
