#include "kvcache/tiered_cache.h"

#include <algorithm>
#include <chrono>

#include "common/log.h"

namespace kvstream::kvcache {

TieredCache::TieredCache(model::KvPool* pool, uint64_t model_hash,
                         std::vector<std::unique_ptr<KvTier>> tiers)
    : pool_(pool), model_hash_(model_hash), tiers_(std::move(tiers)) {
  if (!tiers_.empty()) worker_ = std::thread([this] { Worker(); });
}

TieredCache::~TieredCache() { Stop(); }

std::vector<BlockKey> TieredCache::Keys(const BlockKey& root, std::span<const int32_t> tokens) const {
  const int bs = pool_->layout().block_size;
  std::vector<BlockKey> keys;
  BlockKey key = root;
  for (size_t pos = 0; pos < tokens.size(); pos += bs) {
    key = BlockKeyOf(key, tokens.subspan(pos, std::min<size_t>(bs, tokens.size() - pos)));
    keys.push_back(key);
  }
  return keys;
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

int TieredCache::Fetch(const BlockKey& root, std::span<const int32_t> tokens, int from_tokens,
                       model::BlockLease* lease, const std::function<void(int)>& make_room) {
  const int bs = pool_->layout().block_size;
  const int n = static_cast<int>(tokens.size());
  if (!enabled() || from_tokens >= n || from_tokens % bs != 0) return from_tokens;
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<BlockKey> keys = Keys(root, tokens);
  const int nl = pool_->layout().num_layers;
  const size_t block_bytes = pool_->layout().block_bytes();
  const std::vector<KvTier*> where = Locate(keys, from_tokens / bs);
  int covered = from_tokens;
  for (size_t b = from_tokens / bs; b < keys.size(); ++b) {
    // Local tiers asked again: an earlier block's copy into a faster tier may have evicted it.
    KvTier* from = where[b] != nullptr && where[b]->remote() ? where[b] : nullptr;
    for (auto& t : tiers_)
      if (!t->remote() && t->Contains(keys[b])) {
        from = t.get();
        break;
      }
    if (from == nullptr) break;
    const int end = std::min(n, covered + bs);
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
    Status s = from->Get(keys[b], layers);
    if (!s.ok()) {
      KV_LOG_DEBUG << "KV tier " << from->name() << ": block " << b << " not read: " << s.ToString();
      break;  // the block just allocated stays in the lease, to be computed
    }
    // Faster tiers that lacked it keep it from now on.
    for (auto& t : tiers_) {
      if (t.get() == from) break;
      std::vector<std::span<const std::byte>> in(layers.begin(), layers.end());
      BlockHeader h{root, keys[b], model_hash_, pool_->layout(), uint32_t(end - covered)};
      t->Put(h, in).IgnoreError();
    }
    covered = end;
  }
  fetched_tokens_ += uint64_t(covered - from_tokens);
  fetch_us_ += uint64_t(std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::steady_clock::now() - t0).count());
  return covered;
}

void TieredCache::WriteDown(const BlockKey& root, std::span<const int32_t> tokens,
                            const std::vector<int32_t>& ids) {
  const int bs = pool_->layout().block_size;
  if (!enabled() || tokens.empty()) return;
  if (static_cast<int64_t>(ids.size()) * bs < static_cast<int64_t>(tokens.size())) return;
  std::vector<int32_t> mine(ids.begin(), ids.begin() + model::BlocksForTokens(int(tokens.size()), bs));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    if (queued_blocks_ + mine.size() > uint64_t(pool_->num_blocks()) / 2) {
      if (skipped_blocks_ % 1000 < mine.size() || skipped_blocks_ == 0) {
        KV_LOG_WARN << "KV tiers: write-down of " << mine.size() << " blocks skipped: "
                    << queued_blocks_ << " blocks already queued (half the pool); "
                    << skipped_blocks_ << " skipped before";
      }
      skipped_blocks_ += mine.size();
      return;
    }
  }
  if (!pool_->allocator().Ref(mine).ok()) return;
  Job job{root, std::vector<int32_t>(tokens.begin(), tokens.end()),
          model::BlockLease(&pool_->allocator(), std::move(mine))};
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return;  // the job's lease returns its references here
  queued_blocks_ += job.lease.ids().size();
  queue_.push_back(std::move(job));
  cv_.notify_all();
}

void TieredCache::WriteJob(const Job& job) {
  const std::vector<BlockKey> keys = Keys(job.root, job.tokens);
  const int bs = pool_->layout().block_size;
  const int nl = pool_->layout().num_layers;
  const size_t block_bytes = pool_->layout().block_bytes();
  for (size_t b = 0; b < keys.size(); ++b) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    }
    std::vector<std::span<const std::byte>> layers;
    for (int l = 0; l < nl; ++l) layers.emplace_back(pool_->block_ptr(l, job.lease.ids()[b]), block_bytes);
    const int held = std::min<int>(bs, int(job.tokens.size()) - int(b) * bs);
    BlockHeader h{job.root, keys[b], model_hash_, pool_->layout(), uint32_t(held)};
    for (auto& t : tiers_) {
      // A remote tier checks presence itself, batched, before it writes.
      if (!t->remote() && t->Contains(keys[b])) continue;
      Status s = t->Put(h, layers);
      if (!s.ok()) {
        KV_LOG_DEBUG << "KV tier " << t->name() << ": block not written: " << s.ToString();
      }
    }
  }
}

void TieredCache::Worker() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    Job job = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    WriteJob(job);
    const size_t blocks = job.lease.ids().size();
    job.lease.Reset();  // the copies are done: the pool blocks may go
    lock.lock();
    queued_blocks_ -= blocks;
    busy_ = false;
    cv_.notify_all();
  }
}

void TieredCache::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return stopping_ || (queue_.empty() && !busy_); });
}

void TieredCache::Stop() {
  std::deque<Job> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    dropped.swap(queue_);
    for (const Job& j : dropped) queued_blocks_ -= j.lease.ids().size();
    cv_.notify_all();
  }
  if (worker_.joinable()) worker_.join();
  // `dropped` returns its leases here, outside the lock.
}

void TieredCache::EraseAll() {
  for (auto& t : tiers_) t->EraseAll();
}

TieredCache::Stats TieredCache::stats() const {
  Stats s;
  for (const auto& t : tiers_) s.tiers.push_back({std::string(t->name()), t->stats()});
  s.fetched_tokens = fetched_tokens_.load();
  s.fetch_us = fetch_us_.load();
  std::lock_guard<std::mutex> lock(mu_);
  s.queued_writes = queued_blocks_;
  s.skipped_blocks = skipped_blocks_;
  return s;
}

}  // namespace kvstream::kvcache
