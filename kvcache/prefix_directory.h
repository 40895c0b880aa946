// PrefixDirectory: which block-aligned token prefixes have their KV cached, and where.
//
// A radix tree with one node per full block of block_size tokens. A node's key is SHA-256 over
// its parent's key and its tokens; the root key folds in the model identity, the KV layout and an
// optional per-tenant salt (kvcache/prefix_key.h), so one model's KV is never matched for
// another, and one tenant cannot find another's prefixes. A prompt's last, partial block is kept
// too, as a leaf matched only by exactly the same remaining tokens (so a repeated prompt needs no
// forward at all).
//
// Guarantees:
//  - Match returns the longest cached prefix of the tokens whose every block is held in the pool,
//    with references of its own on those blocks (a BlockLease): an eviction while the caller
//    uses them never frees them.
//  - The directory holds one allocator reference per cached block. It evicts only nodes whose
//    block nobody else references and that have no cached child, least recently used first (a
//    match touches the whole path), so a cached prefix never has a hole.
//  - It holds at most budget_blocks blocks: past that an Insert first evicts down to the low
//    watermark (low_watermark * budget), so a full cache does not evict on every insert.
//  - max_tokens bounds what is cached (models whose KV depends on the total length, e.g.
//    dynamic-NTK rotary, cache nothing past their original maximum position).
//  - Write-back (set_on_evict): every block evicted (LRU, watermark, EvictForAllocation, and
//    Clear when asked to) is reported with its root, its chained key (the tiers' key) and its
//    token count, while the directory still holds its reference: the callback takes references
//    of its own to keep the block past the directory's release. The destructor reports nothing.
// Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "kvcache/prefix_key.h"
#include "model/kv_cache.h"

namespace kvstream::kvcache {

struct DirectoryOptions {
  int block_size = 16;
  int budget_blocks = 0;        // 0 = off: Match always misses (uncounted), Insert keeps nothing
  double low_watermark = 0.9;   // of budget_blocks, in (0, 1]
  int max_tokens = 1 << 30;     // nothing past this many tokens is cached
};

class PrefixDirectory {
 public:
  PrefixDirectory(model::BlockAllocator* allocator, const DirectoryOptions& options);
  ~PrefixDirectory();
  PrefixDirectory(const PrefixDirectory&) = delete;
  PrefixDirectory& operator=(const PrefixDirectory&) = delete;

  bool enabled() const { return options_.budget_blocks > 0; }
  // Called with each batch of evicted blocks, under the directory's lock (it must neither call
  // the directory nor wait long: queue). Set before the directory is used.
  using OnEvict = std::function<void(std::span<const KeyedBlock>)>;
  void set_on_evict(OnEvict fn) { on_evict_ = std::move(fn); }
  int block_size() const { return options_.block_size; }

  struct Match {
    int tokens = 0;             // cached prefix length: whole blocks, or every token (full hit)
    model::BlockLease lease;    // the blocks holding it, with references of the caller's own
  };
  // The longest cached prefix of `tokens` under `root` (the most recently used from then on).
  Match Find(const BlockKey& root, std::span<const int32_t> tokens);
  // Counts one request's lookup in stats(): a hit when matched_tokens > 0, else a miss.
  void CountLookup(int matched_tokens);
  // Records that blocks ids[i] hold the KV of tokens [i*block_size, ...) under `root`: nodes
  // for every block not cached yet, up to the budget and max_tokens, each with a reference of
  // the directory's own. Returns the number of blocks newly cached; `cached_tokens` (if set)
  // gets how many of the tokens the directory holds afterwards (a prefix).
  int Insert(const BlockKey& root, std::span<const int32_t> tokens,
             const std::vector<int32_t>& ids, int* cached_tokens = nullptr);
  // Evicts until the allocator's free blocks and the blocks this call evicted reach
  // `free_blocks` (without write-back the same as free blocks; with it, an evicted block is free
  // once written down) or nothing more can go. Returns the blocks released.
  int EvictForAllocation(int free_blocks);
  // Drops every node (the directory's references). closing: later Inserts keep nothing.
  // report: each block goes to the eviction callback first (a shutdown's write-back).
  void Clear(bool closing, bool report = false);

  struct Stats {
    uint64_t hits = 0, misses = 0;  // counted lookups with / without a matched block
    uint64_t hit_tokens = 0;        // tokens matched by counted lookups
    uint64_t inserted_blocks = 0, evicted_blocks = 0;
    int nodes = 0;
    int blocks = 0;                 // blocks the directory references
  };
  Stats stats() const;

 private:
  struct Node;
  using Lru = std::list<Node*>;
  struct Node {
    BlockKey key;
    BlockKey root;             // of its chain (the eviction report)
    uint32_t tokens = 0;       // tokens its block holds
    Node* parent = nullptr;
    int children = 0;          // cached nodes whose parent this is
    int32_t block = -1;
    bool partial = false;      // a prompt's last, partial block: never has children
    Lru::iterator lru;
  };
  struct KeyHash {
    size_t operator()(const BlockKey& k) const;
  };
  Node* Lookup(const BlockKey& key) const;
  void TouchLocked(Node* n);
  bool EvictableLocked(const Node* n) const;
  // Removes the node; its block joins `victims`, the directory's reference still held.
  void EraseLocked(Node* n, std::vector<KeyedBlock>* victims);
  // Reports the victims (set_on_evict), then releases the directory's references on them.
  void ReleaseLocked(const std::vector<KeyedBlock>& victims, bool report);
  // Evicts evictable nodes, least recently used first, until pred(victims so far) holds.
  template <typename Pred>
  bool EvictUntilLocked(Pred pred);

  model::BlockAllocator* allocator_;
  const DirectoryOptions options_;
  mutable std::mutex mu_;
  std::unordered_map<BlockKey, std::unique_ptr<Node>, KeyHash> nodes_;
  Lru lru_;  // front = most recently used
  bool closing_ = false;
  Stats stats_;
  OnEvict on_evict_;
};

}  // namespace kvstream::kvcache
