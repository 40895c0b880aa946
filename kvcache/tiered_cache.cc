#include "kvcache/tiered_cache.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/log.h"

namespace kvstream::kvcache {

TieredCache::TieredCache(model::KvPool* pool, uint64_t model_hash,
                         std::vector<std::unique_ptr<KvTier>> tiers, FetchPolicy policy,
                         int io_threads, bool staged, int write_threads)
    : pool_(pool),
      model_hash_(model_hash),
      tiers_(std::move(tiers)),
      policy_(policy),
      staged_(staged && !tiers_.empty()) {
  if (tiers_.empty()) return;
  for (int i = 0; i < std::max(1, write_threads); ++i) writers_.emplace_back([this] { Worker(); });
  bool any_slow = false;
  for (const auto& t : tiers_) any_slow |= t->slow();
  if (any_slow && io_threads > 0) io_ = std::make_unique<IoPool>(io_threads, /*max_queued=*/4096);
}

TieredCache::~TieredCache() { Stop(); }

std::vector<BlockKey> TieredCache::Keys(const BlockKey& root, std::span<const int32_t> tokens) const {
  return ChainKeys(root, tokens, pool_->layout().block_size);
}

std::vector<KvTier*> TieredCache::Locate(std::span<const BlockKey> keys, size_t first) {
  std::vector<KvTier*> where(keys.size(), nullptr);
  // Local tiers block by block (an index lookup each), up to the first block none holds.
  auto local = [&](size_t b) {
    for (; b < keys.size(); ++b) {
      for (auto& t : tiers_)
        if (!t->remote() && t->Contains(keys[b])) {
          where[b] = t.get();
          break;
        }
      if (where[b] == nullptr) break;
    }
    return b;
  };
  size_t end = local(first);
  // A remote tier: one batched query for the rest of the chain (a hint: a Get may still miss);
  // past its run, local tiers may hold more.
  for (auto& t : tiers_) {
    if (!t->remote() || end >= keys.size()) continue;
    const std::vector<bool> present = t->Present(keys.subspan(end));
    size_t b = end;
    while (b < keys.size() && present[b - end]) where[b++] = t.get();
    if (b > end) end = local(b);
  }
  return where;
}

Result<FetchPolicy::Mode> ParseFetchMode(std::string_view name) {
  if (name == "best_effort") return FetchPolicy::Mode::kBestEffort;
  if (name == "timeout") return FetchPolicy::Mode::kTimeout;
  if (name == "wait_complete") return FetchPolicy::Mode::kWaitComplete;
  return InvalidArgument("KV tier policy '" + std::string(name) +
                         "': one of best_effort, timeout, wait_complete");
}

// Reads from slow tiers in flight, shared with the I/O threads (which may finish after the
// request stopped waiting).
struct TieredCache::Reads {
  enum State { kPending, kOk, kFailed };
  std::mutex mu;
  std::condition_variable cv;
  std::vector<State> state;
  std::vector<std::vector<std::byte>> data;  // every layer of the block, layer 0 first
  int outstanding = 0;
};

class TieredCache::Pending {
 public:
  explicit Pending(TieredCache* cache) : cache_(cache) {}
  ~Pending() {
    for (size_t b = 0; b < pinned.size(); ++b)
      if (pinned[b]) from[b]->Unpin(keys[b]);
  }
  TieredCache* cache_;
  BlockKey root{};
  int tokens = 0;
  std::vector<BlockKey> keys;
  size_t first = 0, end = 0;      // the blocks [first, end) may be filled
  int found_end_tokens = 0;       // where the found run ended before the policy trimmed it
  std::vector<KvTier*> from;      // per block: the tier it comes from
  std::vector<bool> pinned;
  std::vector<int> slot;          // per block: its read in `reads`, or -1 (read by Fill)
  std::shared_ptr<Reads> reads = std::make_shared<Reads>();
};

void TieredCache::Promote(const BlockHeader& header, const KvTier* from,
                          std::span<const std::span<const std::byte>> layers) {
  for (auto& t : tiers_) {
    if (t.get() == from) break;
    if (!t->remote() && !t->Contains(header.key)) t->Put(header, layers).IgnoreError();
  }
}

void TieredCache::PendingDeleter::operator()(Pending* p) const { delete p; }

TieredCache::PendingPtr TieredCache::Prepare(const BlockKey& root, std::span<const int32_t> tokens,
                                             int from_tokens, Deadline deadline) {
  const int bs = pool_->layout().block_size;
  const int n = static_cast<int>(tokens.size());
  if (!enabled() || from_tokens >= n || from_tokens % bs != 0) return nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  PendingPtr p(new Pending(this));
  p->root = root;
  p->tokens = n;
  p->keys = Keys(root, tokens);
  p->first = size_t(from_tokens / bs);
  p->from = Locate(p->keys, p->first);
  p->end = p->first;
  while (p->end < p->keys.size() && p->from[p->end] != nullptr) ++p->end;
  p->found_end_tokens = std::min(n, int(p->end) * bs);
  if (p->end == p->first) return nullptr;
  if (p->found_end_tokens - from_tokens < policy_.threshold_tokens) {
    recomputed_tokens_ += uint64_t(p->found_end_tokens - from_tokens);
    return nullptr;
  }
  p->pinned.assign(p->keys.size(), false);
  p->slot.assign(p->keys.size(), -1);
  // Local entries stay until the fetch ends; slow tiers' reads start now, in parallel.
  const model::KvLayout layout = pool_->layout();
  const size_t block_bytes = layout.block_bytes() * size_t(layout.num_layers);
  size_t usable = p->end;  // kBestEffort: up to the first slow block
  // Every local entry is pinned before any slow read starts: a read that completes promotes its
  // block into the faster tiers, which could otherwise evict a later block not pinned yet.
  for (size_t b = p->first; b < p->end; ++b) {
    KvTier* t = p->from[b];
    if (t->remote()) continue;
    p->pinned[b] = t->Pin(p->keys[b]);
    if (!p->pinned[b]) {  // gone since Locate
      p->end = b;
      break;
    }
  }
  for (size_t b = p->first; b < p->end; ++b) {
    KvTier* t = p->from[b];
    if (!t->slow() || io_ == nullptr) continue;
    if (policy_.mode == FetchPolicy::Mode::kBestEffort) usable = std::min(usable, b);
    const int i = static_cast<int>(p->reads->state.size());
    {
      std::lock_guard<std::mutex> lock(p->reads->mu);
      p->reads->state.push_back(Reads::kPending);
      p->reads->data.emplace_back();
      ++p->reads->outstanding;
    }
    const BlockHeader h{root, p->keys[b], model_hash_, layout,
                        uint32_t(std::min(n, int(b + 1) * bs) - int(b) * bs)};
    const bool queued = io_->Submit([this, reads = p->reads, i, h, t, block_bytes, layout] {
      std::vector<std::byte> buf(block_bytes);
      std::vector<std::span<std::byte>> layers;
      for (int l = 0; l < layout.num_layers; ++l)
        layers.emplace_back(buf.data() + size_t(l) * layout.block_bytes(), layout.block_bytes());
      const bool ok = t->Get(h.key, layers).ok();
      if (ok) Promote(h, t, std::vector<std::span<const std::byte>>(layers.begin(), layers.end()));
      std::lock_guard<std::mutex> lock(reads->mu);
      if (ok) reads->data[i] = std::move(buf);
      reads->state[i] = ok ? Reads::kOk : Reads::kFailed;
      --reads->outstanding;
      reads->cv.notify_all();
    });
    if (!queued) {
      std::lock_guard<std::mutex> lock(p->reads->mu);
      p->reads->state[i] = Reads::kFailed;
      --p->reads->outstanding;
      p->end = b;  // too many reads in flight: the rest is computed
      break;
    }
    p->slot[b] = i;
  }
  if (policy_.mode == FetchPolicy::Mode::kBestEffort) p->end = std::min(p->end, usable);
  // Waits for the reads the policy waits for, then keeps the run of blocks that are there.
  Deadline until = deadline;
  if (policy_.mode == FetchPolicy::Mode::kTimeout)
    until = std::min(deadline, Clock::now() + policy_.timeout);
  std::unique_lock<std::mutex> lock(p->reads->mu);
  auto done = [&] {
    for (size_t b = p->first; b < p->end; ++b)
      if (p->slot[b] >= 0 && p->reads->state[p->slot[b]] == Reads::kPending) return false;
    return true;
  };
  if (policy_.mode != FetchPolicy::Mode::kBestEffort) p->reads->cv.wait_until(lock, until, done);
  for (size_t b = p->first; b < p->end; ++b) {
    if (p->slot[b] < 0) continue;
    const Reads::State st = p->reads->state[p->slot[b]];
    if (st == Reads::kOk) continue;
    if (st == Reads::kPending) late_blocks_ += 1;
    p->end = b;
    break;
  }
  lock.unlock();
  fetch_us_ += uint64_t(std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::steady_clock::now() - t0).count());
  return p;
}

int TieredCache::Fill(Pending* p, int from_tokens, model::BlockLease* lease,
                      const std::function<void(int)>& make_room) {
  if (p == nullptr || staged_) return from_tokens;  // staged: FillFrom
  const auto t0 = std::chrono::steady_clock::now();
  const int bs = pool_->layout().block_size;
  const int nl = pool_->layout().num_layers;
  const size_t block_bytes = pool_->layout().block_bytes();
  int covered = from_tokens;
  // A prefix that shrank since Prepare leaves a gap no fetched block may follow.
  const bool contiguous = from_tokens % bs == 0 && size_t(from_tokens / bs) >= p->first;
  for (size_t b = size_t(from_tokens / bs); contiguous && b < p->end; ++b) {
    const int end = std::min(p->tokens, int(b + 1) * bs);
    if (static_cast<int>(lease->ids().size()) * bs < end) {
      Status grown = lease->GrowToTokens(end, bs);
      if (!grown.ok() && make_room) {
        make_room(1);
        grown = lease->GrowToTokens(end, bs);
      }
      if (!grown.ok()) break;
    }
    const int32_t id = lease->ids()[b];
    std::vector<std::span<std::byte>> layers;
    for (int l = 0; l < nl; ++l) layers.emplace_back(pool_->block_ptr(l, id), block_bytes);
    if (p->slot[b] >= 0) {
      std::lock_guard<std::mutex> lock(p->reads->mu);
      const std::vector<std::byte>& data = p->reads->data[p->slot[b]];
      for (int l = 0; l < nl; ++l)
        std::memcpy(layers[l].data(), data.data() + size_t(l) * block_bytes, block_bytes);
    } else {
      KvTier* from = p->from[b];
      Status s = from->Get(p->keys[b], layers);
      if (!s.ok()) {
        KV_LOG_DEBUG << "KV tier " << from->name() << ": block " << b << " not read: " << s.ToString();
        break;  // the block just allocated stays in the lease, to be computed
      }
      const BlockHeader h{p->root, p->keys[b], model_hash_, pool_->layout(), uint32_t(end - int(b) * bs)};
      Promote(h, from, std::vector<std::span<const std::byte>>(layers.begin(), layers.end()));
    }
    covered = end;
  }
  fetched_tokens_ += uint64_t(covered - from_tokens);
  if (p->found_end_tokens > covered) recomputed_tokens_ += uint64_t(p->found_end_tokens - covered);
  fetch_us_ += uint64_t(std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::steady_clock::now() - t0).count());
  return covered;
}

int TieredCache::Fetch(const BlockKey& root, std::span<const int32_t> tokens, int from_tokens,
                       model::BlockLease* lease, const std::function<void(int)>& make_room,
                       Deadline deadline) {
  PendingPtr p = Prepare(root, tokens, from_tokens, deadline);
  return Fill(p.get(), from_tokens, lease, make_room);
}

TieredCache::Job TieredCache::Lacking(const BlockKey& root, std::span<const int32_t> tokens,
                                      std::vector<size_t>* index) {
  const int bs = pool_->layout().block_size;
  const std::vector<BlockKey> keys = Keys(root, tokens);
  std::vector<uint32_t> counts;
  for (size_t b = 0; b < keys.size(); ++b)
    counts.push_back(uint32_t(std::min<int>(bs, int(tokens.size()) - int(b) * bs)));
  return LackingKeys(root, keys, counts, /*chain=*/true, index);
}

TieredCache::Job TieredCache::LackingKeys(const BlockKey& root, std::span<const BlockKey> keys,
                                          std::span<const uint32_t> tokens, bool chain,
                                          std::vector<size_t>* index) {
  Job job;
  job.root = root;
  job.chain = chain;
  uint64_t held = 0;
  for (size_t b = 0; b < keys.size(); ++b) {
    bool lacks = false;
    for (size_t i = staged_ ? 1 : 0; i < tiers_.size() && !lacks; ++i)
      lacks = tiers_[i]->remote() || !tiers_[i]->Contains(keys[b]);
    if (!lacks) {
      ++held;
      continue;
    }
    // Staged, a block gone from the staging tier ends a prompt's write-down (as in WriteBlock).
    if (staged_ && !tiers_.front()->Contains(keys[b])) {
      if (chain) break;
      continue;
    }
    job.keys.push_back(keys[b]);
    job.tokens.push_back(tokens[b]);
    if (index) index->push_back(b);
  }
  job.left = job.keys.size();
  if (held > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    held_blocks_ += held;
  }
  return job;
}

bool TieredCache::Enqueue(Job job, bool wait) {
  if (job.left == 0) return true;  // nothing a tier lacks
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t bound = uint64_t(pool_->num_blocks()) / 2;
  if (wait) {
    cv_.wait(lock, [&] {
      return stopping_ || queued_blocks_ == 0 || queued_blocks_ + job.left <= bound;
    });
  }
  if (stopping_) return false;  // the job's lease returns its references here
  if (queued_blocks_ + job.left > bound && !(wait && queued_blocks_ == 0)) {
    if (skipped_blocks_ % 1000 < job.left || skipped_blocks_ == 0) {
      KV_LOG_WARN << "KV tiers: write-down of " << job.left << " blocks skipped: "
                  << queued_blocks_ << " blocks already queued (half the pool); "
                  << skipped_blocks_ << " skipped before";
    }
    skipped_blocks_ += job.left;
    return false;
  }
  queued_blocks_ += job.left;
  if (job.write_back) write_back_blocks_ += job.left;
  queue_.push_back(std::make_shared<Job>(std::move(job)));
  cv_.notify_all();
  return true;
}

void TieredCache::DropRestLocked(Job& job) {
  queued_blocks_ -= job.keys.size() - job.next;
  job.next = job.keys.size();
}

void TieredCache::WriteDown(const BlockKey& root, std::span<const int32_t> tokens,
                            const std::vector<int32_t>& ids) {
  const int bs = pool_->layout().block_size;
  if (!enabled() || staged_ || tokens.empty()) return;
  if (static_cast<int64_t>(ids.size()) * bs < static_cast<int64_t>(tokens.size())) return;
  std::vector<size_t> index;
  Job job = Lacking(root, tokens, &index);
  if (job.left == 0) return;
  std::vector<int32_t> mine;
  for (size_t b : index) mine.push_back(ids[b]);
  if (!pool_->allocator().Ref(mine).ok()) return;
  job.lease = model::BlockLease(&pool_->allocator(), std::move(mine));
  Enqueue(std::move(job));
}

void TieredCache::WriteBack(std::span<const KeyedBlock> blocks, bool wait_for_room) {
  if (!enabled() || staged_) return;
  WriteBackRuns(blocks, wait_for_room);
}

void TieredCache::WriteBackStaged(std::span<const KeyedBlock> blocks) {
  if (!staged_ || tiers_.size() < 2) return;
  WriteBackRuns(blocks, /*wait_for_room=*/false);
}

void TieredCache::WriteBackRuns(std::span<const KeyedBlock> blocks, bool wait_for_room) {
  for (size_t i = 0; i < blocks.size();) {
    size_t end = i + 1;
    while (end < blocks.size() && blocks[end].root == blocks[i].root) ++end;
    std::vector<BlockKey> keys;
    std::vector<uint32_t> counts;
    for (size_t b = i; b < end; ++b) {
      keys.push_back(blocks[b].key);
      counts.push_back(blocks[b].tokens);
    }
    std::vector<size_t> index;
    Job job = LackingKeys(blocks[i].root, keys, counts, /*chain=*/false, &index);
    job.write_back = true;
    if (job.left > 0 && !staged_) {
      std::vector<int32_t> mine;
      for (size_t b : index) mine.push_back(blocks[i + b].block);
      if (!pool_->allocator().Ref(mine).ok()) return;
      job.lease = model::BlockLease(&pool_->allocator(), std::move(mine));
    }
    Enqueue(std::move(job), wait_for_room);
    i = end;
  }
}

void TieredCache::WriteStaged(const BlockKey& root, std::span<const int32_t> tokens) {
  if (!staged_ || tiers_.size() < 2 || tokens.empty()) return;
  Enqueue(Lacking(root, tokens, nullptr));
}

int TieredCache::Stage(Pending* p, int from_tokens) {
  const int bs = pool_->layout().block_size;
  const model::KvLayout layout = pool_->layout();
  KvTier* staging = tiers_.front().get();
  int covered = from_tokens;
  const bool contiguous = from_tokens % bs == 0 && size_t(from_tokens / bs) >= p->first;
  std::vector<std::byte> buf;
  for (size_t b = size_t(from_tokens / bs); contiguous && b < p->end; ++b) {
    const int end = std::min(p->tokens, int(b + 1) * bs);
    if (p->from[b] != staging) {
      // Read by an I/O thread (done: Prepare kept only those), or now, then put in the staging
      // tier (usually there already: the read promoted it) and pinned there.
      std::vector<std::span<std::byte>> layers;
      std::vector<std::byte>* data = nullptr;
      std::unique_lock<std::mutex> lock(p->reads->mu, std::defer_lock);
      if (p->slot[b] >= 0) {
        lock.lock();
        data = &p->reads->data[p->slot[b]];
      } else {
        buf.resize(layout.block_bytes() * size_t(layout.num_layers));
        data = &buf;
      }
      std::byte* base = data->data();
      for (int l = 0; l < layout.num_layers; ++l)
        layers.emplace_back(base + size_t(l) * layout.block_bytes(), layout.block_bytes());
      if (p->slot[b] < 0 && !p->from[b]->Get(p->keys[b], layers).ok()) break;
      const BlockHeader h{p->root, p->keys[b], model_hash_, layout, uint32_t(end - int(b) * bs)};
      if (!staging->Contains(p->keys[b]) &&
          !staging->Put(h, std::vector<std::span<const std::byte>>(layers.begin(), layers.end())).ok())
        break;
      if (p->pinned[b]) p->from[b]->Unpin(p->keys[b]);
      p->pinned[b] = staging->Pin(p->keys[b]);
      if (!p->pinned[b]) break;
      p->from[b] = staging;
    }
    covered = end;
  }
  return covered;
}

std::unique_ptr<PoolPrefetch> TieredCache::FillFrom(PoolTier* below, Pending* p,
                                                    std::span<const int32_t> tokens,
                                                    int from_tokens, model::BlockLease* lease,
                                                    const std::function<void(int)>& make_room) {
  if (p == nullptr || !staged_ || below == nullptr) return nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  const int staged = Stage(p, from_tokens);
  std::unique_ptr<PoolPrefetch> prefetch;
  int covered = from_tokens;
  if (staged > from_tokens) {
    prefetch = below->Fetch(p->root, tokens.first(size_t(staged)), from_tokens, lease, make_room);
    covered = prefetch->tokens();
  }
  fetched_tokens_ += uint64_t(covered - from_tokens);
  if (p->found_end_tokens > covered) recomputed_tokens_ += uint64_t(p->found_end_tokens - covered);
  fetch_us_ += uint64_t(std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::steady_clock::now() - t0).count());
  if (covered == from_tokens) prefetch.reset();
  return prefetch;
}

void TieredCache::PrepareJob(Job& job) {
  // A remote tier: one batched query for the job's blocks (a hint: held ones are not copied).
  job.remote_has.assign(tiers_.size(), {});
  for (size_t i = staged_ ? 1 : 0; i < tiers_.size(); ++i)
    if (tiers_[i]->remote()) job.remote_has[i] = tiers_[i]->Present(job.keys);
}

bool TieredCache::WriteBlock(const Job& job, size_t j, std::vector<std::byte>& buf, bool* held) {
  const int nl = pool_->layout().num_layers;
  const size_t block_bytes = pool_->layout().block_bytes();
  const BlockKey& key = job.keys[j];
  std::vector<KvTier*> lacking;
  for (size_t i = staged_ ? 1 : 0; i < tiers_.size(); ++i) {
    KvTier* t = tiers_[i].get();
    const bool has = t->remote() ? j < job.remote_has[i].size() && job.remote_has[i][j]
                                 : t->Contains(key);
    if (!has) lacking.push_back(t);
  }
  *held = lacking.empty();  // written since it was queued, or held by the remote tier
  if (*held) return true;
  std::vector<std::span<const std::byte>> layers;
  if (staged_) {
    // Copied out of the staging tier first (a chain ends at the first block gone).
    buf.resize(block_bytes * size_t(nl));
    std::vector<std::span<std::byte>> out;
    for (int l = 0; l < nl; ++l) out.emplace_back(buf.data() + size_t(l) * block_bytes, block_bytes);
    if (!tiers_.front()->Get(key, out).ok()) return false;
    layers.assign(out.begin(), out.end());
  } else {
    for (int l = 0; l < nl; ++l)
      layers.emplace_back(pool_->block_ptr(l, job.lease.ids()[j]), block_bytes);
  }
  const BlockHeader h{job.root, key, model_hash_, pool_->layout(), job.tokens[j]};
  for (KvTier* t : lacking) {
    Status s = t->Put(h, layers);
    if (!s.ok()) {
      KV_LOG_DEBUG << "KV tier " << t->name() << ": block not written: " << s.ToString();
    }
  }
  return true;
}

void TieredCache::Worker() {
  std::vector<std::byte> buf;  // this writer's copy of a staged block
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !ready_.empty() || !queue_.empty(); });
    if (stopping_) return;
    JobPtr job;
    ++busy_;
    if (!ready_.empty()) {
      // The next block of the first prepared job.
      job = ready_.front();
      const size_t j = job->next++;
      if (job->next >= job->keys.size()) ready_.pop_front();
      lock.unlock();
      bool held = false;
      const bool kept = WriteBlock(*job, j, buf, &held);
      lock.lock();
      queued_blocks_ -= 1;
      if (held) held_blocks_ += 1;
      // A staged block gone: the rest of a prompt's chain is dropped.
      if (!kept && job->chain && job->next < job->keys.size()) {
        DropRestLocked(*job);
        auto it = std::find(ready_.begin(), ready_.end(), job);
        if (it != ready_.end()) ready_.erase(it);
      }
    } else {
      job = queue_.front();
      queue_.pop_front();
      lock.unlock();
      PrepareJob(*job);
      lock.lock();
      if (stopping_) DropRestLocked(*job);
      else ready_.push_back(job);
    }
    // The last holder of a job returns its lease (the pool references), outside the lock and
    // before this writer counts as idle: once Flush returns, every lease is back.
    lock.unlock();
    job.reset();
    lock.lock();
    --busy_;
    cv_.notify_all();
  }
}

void TieredCache::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return stopping_ || (queue_.empty() && ready_.empty() && busy_ == 0); });
}

bool TieredCache::WaitForWrites(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_until(lock, deadline, [&] {
    return stopping_ || (queue_.empty() && ready_.empty() && busy_ == 0);
  });
}

void TieredCache::Stop() {
  std::deque<JobPtr> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    dropped.swap(queue_);
    for (JobPtr& j : ready_) dropped.push_back(std::move(j));
    ready_.clear();
    for (const JobPtr& j : dropped) DropRestLocked(*j);
    cv_.notify_all();
  }
  // The dropped jobs return their leases now, outside the lock; a job with a block being
  // written returns its lease when that writer is done with it.
  dropped.clear();
  for (auto& w : writers_)
    if (w.joinable()) w.join();
  if (io_) io_->Stop();  // queued reads dropped, running ones joined
}

void TieredCache::EraseAll() {
  for (auto& t : tiers_) t->EraseAll();
}

TieredCache::Stats TieredCache::stats() const {
  Stats s;
  for (const auto& t : tiers_) s.tiers.push_back({std::string(t->name()), t->stats()});
  s.fetched_tokens = fetched_tokens_.load();
  s.fetch_us = fetch_us_.load();
  s.recomputed_tokens = recomputed_tokens_.load();
  s.late_blocks = late_blocks_.load();
  std::lock_guard<std::mutex> lock(mu_);
  s.queued_writes = queued_blocks_;
  s.skipped_blocks = skipped_blocks_;
  s.held_blocks = held_blocks_;
  s.write_back_blocks = write_back_blocks_;
  return s;
}

}  // namespace kvstream::kvcache
