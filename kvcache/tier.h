// A tier below the KV pool (L2 host memory, L3 disk, L4 a shared store): whole blocks (every
// layer of one block, as kvcache/block_codec.h lays them out) by their chained key.
//
// Guarantees every tier gives:
//  - Get copies a block into `layers` only if the tier holds it complete and verified; on any
//    failure (absent, expired, damaged, refused by the codec) it returns an error, counts it in
//    stats() (a read failure unless simply absent) and drops the bad entry; `layers` may then
//    hold partial bytes and must not be used.
//  - Put makes an entry visible only once it is complete; an entry already held is kept (a key
//    names its KV). A tier over its size evicts least recently used entries down to its low
//    watermark first; an entry that cannot fit is not stored (an error, counted).
//  - EraseAll removes every entry the tier holds (user data: retention).
//  - Pin keeps an entry from eviction (by size or age) until as many Unpin: a block about to be
//    read stays; false when the tier does not hold it. Erase and failed reads still remove it.
// Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "kvcache/block_codec.h"

namespace kvstream::kvcache {

struct TierStats {
  uint64_t hit_blocks = 0;      // Gets that returned a block
  uint64_t miss_blocks = 0;     // Gets of a block the tier did not hold (or held expired)
  uint64_t read_failures = 0;   // Gets refused: damaged, truncated, bad HMAC, I/O error
  uint64_t bytes_read = 0, bytes_written = 0;
  uint64_t written_blocks = 0;
  uint64_t write_failures = 0;  // Puts that stored nothing (no room, I/O error)
  uint64_t evicted_blocks = 0;  // by LRU or age
  uint64_t entries = 0, bytes_used = 0, capacity_bytes = 0;  // gauges
};

class KvTier {
 public:
  virtual ~KvTier() = default;
  virtual std::string_view name() const = 0;  // "host", "disk", "store"
  virtual bool Contains(const BlockKey& key) = 0;
  // `layers[l]` receives layer l of the block (KvLayout::block_bytes() each).
  virtual Status Get(const BlockKey& key, std::span<const std::span<std::byte>> layers) = 0;
  virtual Status Put(const BlockHeader& header,
                     std::span<const std::span<const std::byte>> layers) = 0;
  // Which of `keys` the tier holds: for a remote tier one batched query, and only a hint (a
  // later Get may still miss).
  virtual std::vector<bool> Present(std::span<const BlockKey> keys) {
    std::vector<bool> out;
    for (const BlockKey& k : keys) out.push_back(Contains(k));
    return out;
  }
  // A tier shared across machines (L4): Present is a hint, Put only queues (the tier checks
  // presence itself before it writes), reads are slow.
  virtual bool remote() const { return false; }
  // A tier whose reads wait on I/O (disk, network): a fetch reads it on I/O threads, with the
  // policy's deadline (kvcache/tiered_cache.h).
  virtual bool slow() const { return false; }
  virtual bool Pin(const BlockKey& key) { return Contains(key); }
  virtual void Unpin(const BlockKey& /*key*/) {}
  virtual void Erase(const BlockKey& key) = 0;
  virtual void EraseAll() = 0;
  virtual TierStats stats() const = 0;
};

}  // namespace kvstream::kvcache
