// TierIndex: the bookkeeping every tier below the pool shares (kvcache/tier.h): which blocks it
// holds, their sizes and write times, least recently used first out, bounded in bytes and age.
//
// Guarantees:
//  - used() never exceeds capacity_bytes through Reserve: a reservation that does not fit first
//    evicts least recently used entries until the new bytes fit under low_watermark * capacity
//    (the high watermark is the capacity itself), so a full tier does not evict on every write
//    (no thrashing); it fails, reserving nothing, when that is not enough.
//  - An entry with references (Ref, until as many Unref) is never evicted, by size or age: a
//    block being read or queued for a prefetch stays. Remove (an explicit erase, a failed read)
//    removes it regardless.
//  - Entries older than max_age_s (0 = no bound) are Expired; Contains does not report them.
// Not thread-safe: the tier holds its own lock over the index and its data together.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <optional>
#include <unordered_map>

#include "kvcache/prefix_key.h"

namespace kvstream::kvcache {

struct KeyHasher {
  size_t operator()(const BlockKey& k) const;
};

class TierIndex {
 public:
  using Clock = std::chrono::system_clock;
  struct Options {
    uint64_t capacity_bytes = 0;
    double low_watermark = 0.9;  // of capacity_bytes, in (0, 1]; anything else means 0.9
    int64_t max_age_s = 0;
  };
  struct Entry {
    uint64_t bytes = 0;
    uint64_t slot = 0;  // the tier's own (e.g. a host slot number)
    Clock::time_point written;
    int refs = 0;
  };
  // Called for each entry an eviction removes (the tier frees its data).
  using OnEvict = std::function<void(const BlockKey&, const Entry&)>;

  explicit TierIndex(const Options& options);

  const Entry* Find(const BlockKey& key) const;  // null when absent (expired or not)
  bool Expired(const Entry& e) const;
  bool Contains(const BlockKey& key) const;      // held and not expired
  void Touch(const BlockKey& key);               // the most recently used from now

  // Reserves `bytes` (evicting as above). False: nothing reserved, nothing more evicted than
  // what could go.
  bool Reserve(uint64_t bytes, const OnEvict& on_evict);
  void Unreserve(uint64_t bytes);
  // Records `key` over `bytes` already reserved, most recently used. False when `key` is held
  // already: the reservation is returned and the entry kept.
  bool Insert(const BlockKey& key, uint64_t bytes, uint64_t slot, Clock::time_point written);
  // Records an entry found at start (call in recency order, most recent first), least recently
  // used so far and unbounded until EvictDownTo.
  void Restore(const BlockKey& key, uint64_t bytes, uint64_t slot, Clock::time_point written);
  std::optional<Entry> Remove(const BlockKey& key);
  // Evicts unreferenced entries, least recently used first, until used() <= bytes. Returns how
  // many went.
  uint64_t EvictDownTo(uint64_t bytes, const OnEvict& on_evict);
  // Removes every entry (references or not), calling on_evict for each.
  void Clear(const OnEvict& on_evict);

  bool Ref(const BlockKey& key);  // false when absent
  void Unref(const BlockKey& key);

  size_t entries() const { return index_.size(); }
  uint64_t used() const { return used_; }
  uint64_t capacity() const { return options_.capacity_bytes; }

 private:
  struct Node {
    Entry entry;
    std::list<BlockKey>::iterator lru;
  };
  template <typename Pred>
  uint64_t EvictWhile(Pred pred, const OnEvict& on_evict);

  const Options options_;
  std::unordered_map<BlockKey, Node, KeyHasher> index_;
  std::list<BlockKey> lru_;  // front = most recently used
  uint64_t used_ = 0;        // entries plus reservations
};

}  // namespace kvstream::kvcache
