// The tiers below the KV pool put together for one pool: where a prefill's blocks are written
// down to (write path) and fetched back up from (read path). Policy: write-through (every
// block of a finished prefill goes to every tier that lacks it).
//
// Guarantees:
//  - WriteDown never blocks on a tier: it queues the blocks with a lease of their own, so
//    they are neither freed nor reused before a background thread has copied them out. The
//    queue holds at most half the pool's blocks: past that a write-down is skipped (counted),
//    so slow tiers never starve requests of pool blocks.
//  - Fetch extends a cached prefix block by block with blocks found in the tiers (fastest
//    first; a remote tier is asked once, batched, for the whole rest of the prompt), each copied into a fresh pool block of the caller's lease; it stops at the first
//    block no tier holds or can read back verified. The tokens it reports are exactly the
//    blocks copied: a failed read is a miss (counted), never KV of other tokens.
//  - Stop (or the destructor) drops queued writes and joins the thread: every lease returned.
// Host pools only (the copies are memcpy). Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "kvcache/prefix_key.h"
#include "kvcache/tier.h"
#include "model/kv_cache.h"

namespace kvstream::kvcache {

class TieredCache {
 public:
  // `tiers`: fastest first (host, disk, ...); may be empty (then every call does nothing).
  TieredCache(model::KvPool* pool, uint64_t model_hash, std::vector<std::unique_ptr<KvTier>> tiers);
  ~TieredCache();
  TieredCache(const TieredCache&) = delete;
  TieredCache& operator=(const TieredCache&) = delete;

  bool enabled() const { return !tiers_.empty(); }

  // tokens[0, from_tokens) are in `lease` already (from_tokens a multiple of the block size).
  // make_room(n) is asked to free n pool blocks when allocation fails. Returns the tokens
  // `lease` covers with KV afterwards (>= from_tokens).
  int Fetch(const BlockKey& root, std::span<const int32_t> tokens, int from_tokens,
            model::BlockLease* lease, const std::function<void(int)>& make_room);
  // ids[i] hold the KV of tokens [i*block_size, ...); takes references of its own.
  void WriteDown(const BlockKey& root, std::span<const int32_t> tokens,
                 const std::vector<int32_t>& ids);
  // Waits until every queued write is done (tests; a shutdown uses Stop).
  void Flush();
  void Stop();
  void EraseAll();

  struct TierReport {
    std::string name;
    TierStats stats;
  };
  struct Stats {
    std::vector<TierReport> tiers;
    uint64_t fetched_tokens = 0;  // tokens whose KV came up from a tier
    uint64_t fetch_us = 0;        // time requests waited for fetches (on their TTFT)
    uint64_t queued_writes = 0;   // blocks waiting for the write-down (gauge)
    uint64_t skipped_blocks = 0;  // blocks not written down: the queue was full
  };
  Stats stats() const;

 private:
  struct Job {
    BlockKey root;
    std::vector<int32_t> tokens;
    model::BlockLease lease;
  };
  void Worker();
  void WriteJob(const Job& job);
  std::vector<BlockKey> Keys(const BlockKey& root, std::span<const int32_t> tokens) const;
  // The fastest tier holding each of keys[first...] (null from the first no tier holds on).
  std::vector<KvTier*> Locate(std::span<const BlockKey> keys, size_t first);

  model::KvPool* pool_;
  const uint64_t model_hash_;
  std::vector<std::unique_ptr<KvTier>> tiers_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  uint64_t queued_blocks_ = 0;
  uint64_t skipped_blocks_ = 0;
  std::atomic<uint64_t> fetched_tokens_{0}, fetch_us_{0};
  std::thread worker_;
};

}  // namespace kvstream::kvcache
