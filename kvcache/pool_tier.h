// A tier below the KV pool that copies blocks into the pool asynchronously, on the device, while
// the forward runs (the pinned host tier below a GPU pool: kvcache/cuda/pinned_tier.h).
// The prefill fetches a prompt's cached prefix with Fetch before its forward and passes
// PrefetchHooks to the forward, so layer l's attention waits (on the GPU) for layer l's copy
// only; after a successful prefill it calls WriteDown (docs/kv_tiers.md, "The GPU path").
// Slower tiers (disk, store) are staged through it: its staging() view, first in a TieredCache
// made with `staged`, takes their blocks before Fetch and gives its own to their write-down.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "common/status.h"
#include "kvcache/prefix_key.h"
#include "kvcache/tier.h"
#include "model/backend.h"
#include "model/kv_cache.h"

namespace kvstream::kvcache {

// Copies in flight into a request's blocks: tokens [from_tokens(), tokens()) are being copied.
class PoolPrefetch {
 public:
  virtual ~PoolPrefetch() = default;
  virtual int from_tokens() const = 0;
  virtual int tokens() const = 0;
  // Makes `stream` (the forward's, e.g. a cudaStream_t) wait for layer l's copy, without a host
  // wait; OK when nothing was fetched.
  virtual Status WaitLayer(int layer, void* stream) const = 0;
  // Waits on the host for every layer (a prompt served whole, without a forward).
  virtual Status WaitAll() const = 0;
};

class PoolTier {
 public:
  virtual ~PoolTier() = default;
  // tokens[0, from_tokens) are in `lease` already (from_tokens a multiple of the block size).
  // Grows `lease` over the blocks found and starts their copies; never returns null. A fetch
  // that cannot start covers nothing (tokens() == from_tokens): a miss. make_room(n) is asked
  // to free n pool blocks when allocation fails.
  virtual std::unique_ptr<PoolPrefetch> Fetch(const BlockKey& root, std::span<const int32_t> tokens,
                                              int from_tokens, model::BlockLease* lease,
                                              const std::function<void(int)>& make_room) = 0;
  // ids[i] hold the complete KV of tokens [i*block_size, ...); never waits for the copies.
  // `written` (if set) runs once, on another thread or before WriteDown returns, after the copy
  // out is complete and its entries visible, or when none was started.
  virtual void WriteDown(const BlockKey& root, std::span<const int32_t> tokens,
                         const std::vector<int32_t>& ids,
                         std::function<void()> written = {}) = 0;
  // Write-back: as WriteDown, over blocks named by their own keys (e.g. evicted from the prefix
  // directory, which still references them): each block on its own, no chain.
  virtual void WriteBlocks(std::span<const KeyedBlock> blocks, std::function<void()> written = {}) = 0;
  // The tier's entries as a KvTier that the host reads and writes with memcpy (Get, Put, Pin:
  // kvcache/tier.h), owned by the tier; null if it has none.
  virtual KvTier* staging() { return nullptr; }
  // Waits until every copy started so far is complete (and its entries visible).
  virtual void Flush() = 0;
  virtual void EraseAll() = 0;

  struct Stats {
    TierStats tier;
    uint64_t fetched_tokens = 0;
    uint64_t fetch_us = 0;        // host time spent matching and starting fetches
    uint64_t skipped_blocks = 0;  // write-downs skipped: too much in flight
    uint64_t in_flight = 0;       // copies not yet complete (gauge)
    int events_created = 0, events_free = 0;
    uint64_t ring_used = 0;       // block ids held by copies in flight (gauge)
    uint64_t engine_copies = 0, kernel_copies = 0;  // layer ranges copied by either path
    uint64_t staged_copies = 0;  // layer ranges copied through the device staging buffer
  };
  virtual Stats stats() const = 0;
};

// A KvTier owned elsewhere (a PoolTier's staging view, first in a TieredCache); forwards every call.
class BorrowedTier final : public KvTier {
 public:
  explicit BorrowedTier(KvTier* t) : t_(t) {}
  std::string_view name() const override { return t_->name(); }
  bool Contains(const BlockKey& key) override { return t_->Contains(key); }
  Status Get(const BlockKey& key, std::span<const std::span<std::byte>> layers) override {
    return t_->Get(key, layers);
  }
  Status Put(const BlockHeader& header, std::span<const std::span<const std::byte>> layers) override {
    return t_->Put(header, layers);
  }
  std::vector<bool> Present(std::span<const BlockKey> keys) override { return t_->Present(keys); }
  bool remote() const override { return t_->remote(); }
  bool slow() const override { return t_->slow(); }
  bool Pin(const BlockKey& key) override { return t_->Pin(key); }
  void Unpin(const BlockKey& key) override { t_->Unpin(key); }
  void Erase(const BlockKey& key) override { t_->Erase(key); }
  void EraseAll() override { t_->EraseAll(); }
  TierStats stats() const override { return t_->stats(); }

 private:
  KvTier* t_;
};

// The forward's hooks with prefetches below them: layer l's attention waits for layer l of each
// prefix (the sequences of a batch may each have one), then `inner`'s hooks run (any may be null).
class PrefetchHooks final : public model::LayerHooks {
 public:
  PrefetchHooks(const PoolPrefetch* prefetch, model::LayerHooks* inner) : inner_(inner) {
    if (prefetch) prefetches_.push_back(prefetch);
  }
  explicit PrefetchHooks(std::vector<const PoolPrefetch*> prefetches)
      : prefetches_(std::move(prefetches)) {}
  Status BeforeAttention(int layer, void* stream) override {
    for (const PoolPrefetch* p : prefetches_)
      if (p) KV_RETURN_IF_ERROR(p->WaitLayer(layer, stream));
    return inner_ ? inner_->BeforeAttention(layer, stream) : OkStatus();
  }
  Status AfterLayer(int layer, void* stream) override {
    return inner_ ? inner_->AfterLayer(layer, stream) : OkStatus();
  }

 private:
  std::vector<const PoolPrefetch*> prefetches_;
  model::LayerHooks* inner_ = nullptr;
};

}  // namespace kvstream::kvcache
