// The prefill daemon's prompt KV cache: after a prefill, the prompt's KV blocks stay in the
// prefill pool, keyed by the whole token sequence (hash, then an exact compare); a later request
// with the same tokens is written to its decode instance from them, without a forward. What
// vLLM/SGLang call prefix caching, for whole prompts only (no partial-prefix match).
//
// Ownership: the cache holds one allocator reference on every block of every entry. A hit
// hands out a lease with a reference of its own, so an entry evicted while a write still reads
// it keeps its blocks allocated until that write's lease is released (refcount); eviction for
// room only picks entries nobody else references, least recently used first. Clear() and the
// destructor drop every cache reference: once the in-flight leases are gone the pool is full.
// Thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "model/kv_cache.h"

namespace kvstream::prefill {

class PromptCache {
 public:
  // budget_blocks 0 = off: Lookup always misses (uncounted), Insert keeps nothing.
  PromptCache(model::BlockAllocator* allocator, int budget_blocks);
  ~PromptCache();
  PromptCache(const PromptCache&) = delete;
  PromptCache& operator=(const PromptCache&) = delete;

  bool enabled() const { return budget_ > 0; }
  // Hit: a lease on the entry's blocks (its own references; the entry becomes the most
  // recently used). Miss: nullopt; counted as a miss only with count_miss.
  std::optional<model::BlockLease> Lookup(std::span<const int32_t> tokens, bool count_miss);
  // Keeps `ids` (which hold the KV of `tokens`, positions 0..n-1) under a reference of the
  // cache's own, evicting least recently used entries nobody else references to stay within
  // the budget. Keeps nothing (false) when the prompt alone exceeds the budget, when not enough
  // can be evicted, when the tokens are cached already, or after Clear(/*closing=*/true).
  bool Insert(std::span<const int32_t> tokens, const std::vector<int32_t>& ids);
  // Evicts least recently used entries nobody else references until the allocator has at
  // least `free_blocks` free blocks or nothing more can go. Returns the blocks released.
  int EvictForAllocation(int free_blocks);
  // Drops every entry (the cache's references). closing: later Inserts keep nothing.
  void Clear(bool closing);

  struct Stats {
    uint64_t hits = 0, misses = 0, inserts = 0, evictions = 0;
    int entries = 0;
    int blocks = 0;  // blocks the cache references
  };
  Stats stats() const;

 private:
  struct Entry {
    uint64_t hash = 0;
    std::vector<int32_t> tokens;
    std::vector<int32_t> ids;
  };
  using List = std::list<Entry>;
  List::iterator FindLocked(uint64_t hash, std::span<const int32_t> tokens);
  bool InUseLocked(const Entry& e) const;
  void EraseLocked(List::iterator it);
  // Evicts unreferenced LRU entries until pred() holds; false if it still does not.
  template <typename Pred>
  bool EvictUntilLocked(Pred pred);

  model::BlockAllocator* allocator_;
  const int budget_;
  mutable std::mutex mu_;
  List lru_;  // front = most recently used
  std::unordered_multimap<uint64_t, List::iterator> index_;
  int blocks_ = 0;
  bool closing_ = false;
  Stats stats_;
};

// FNV-1a over the token ids (the cache's key; equal hashes are compared token by token).
uint64_t HashTokens(std::span<const int32_t> tokens);

}  // namespace kvstream::prefill
