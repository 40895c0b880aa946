// L2 below a GPU KV pool: blocks in page-locked host memory, moved to and from the pool by
// gathered copies (kvcache/cuda/block_copy.h) on a low-priority copy stream, completion tracked
// by events from a pool (docs/kv_tiers.md, "The GPU path").
//
// Memory: one cudaHostAlloc (mapped) of capacity_bytes made at start, layer-major
// ([layer][slot][block_bytes], like the pool), so a prefix moves in one copy per layer.
//
// Guarantees:
//  - WriteDown never waits for a copy: it enqueues pool -> host copies of the blocks the tier
//    lacks, with references of its own on the pool blocks (neither freed nor reused before the
//    copy-out's event has completed); an entry becomes visible to Fetch only once its copy is
//    complete. The caller's KV must be complete on the GPU (the forward has returned). Blocks
//    that find no slot, or past half the pool in flight, are skipped (counted).
//  - Fetch extends a prefix block by block with the entries held, grows `lease` and enqueues the
//    host -> pool copies layer by layer (one pooled event per layer); it never waits on the host
//    for them. The forward over the rest waits for layer l with Prefetch::WaitLayer(l, stream)
//    (cudaStreamWaitEvent: on the GPU) before its attention reads layer l; PrefetchHooks does that.
//    The copies hold references of their own on the destination blocks until they complete, so a
//    forward that stops early never lets another request reuse a block still being written. A
//    fetch that cannot start (no blocks, a launch error) covers nothing: a miss.
//  - Entries in use by a copy are never evicted; a full tier evicts least recently used entries
//    down to low_watermark of its slots; entries older than max_age_s (0: no bound) are misses.
//  - No event or pinned buffer is made per request: events come from a pool made at start (it
//    grows only if more copies are in flight at once than it holds, counted in stats), block
//    ids travel through one pinned ring (and its device copy) allocated at start.
//  - The destructor waits for every copy in flight and returns every lease; every Prefetch must
//    be destroyed before the tier. Thread-safe.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "kvcache/host_tier.h"  // KeyHasher
#include "kvcache/prefix_key.h"
#include "kvcache/tier.h"       // TierStats
#include "model/backend.h"
#include "model/kv_cache.h"

namespace kvstream::kvcache::cuda {

// cudaEvent_t's made once and handed out again (no timing; a host wait sleeps). Thread-safe.
class EventPool {
 public:
  ~EventPool();
  Status Reserve(int n);
  Result<cudaEvent_t> Take();  // from the free list; creates one only when it is empty
  void Give(cudaEvent_t e);
  int created() const;
  int free_count() const;

 private:
  mutable std::mutex mu_;
  std::vector<cudaEvent_t> free_;
  int created_ = 0;
};

class PinnedHostTier {
 public:
  struct Options {
    size_t capacity_bytes = 0;
    double low_watermark = 0.9;
    int64_t max_age_s = 0;
    int copy_ctas = 32;  // thread blocks of one copy (its share of the SMs)
  };
  // kInvalidArgument for a host pool or a capacity without one slot; allocation errors as they are.
  static Result<std::unique_ptr<PinnedHostTier>> Create(model::KvPool* pool, const Options& options);
  ~PinnedHostTier();
  PinnedHostTier(const PinnedHostTier&) = delete;
  PinnedHostTier& operator=(const PinnedHostTier&) = delete;

  // A fetch in flight: tokens [from, tokens()) are being copied into the lease's blocks.
  class Prefetch {
   public:
    ~Prefetch();
    int tokens() const { return tokens_; }
    int from_tokens() const { return from_; }
    bool empty() const { return layer_events_.empty(); }
    // Makes `stream` (a cudaStream_t) wait on the GPU for layer l's copy; OK when empty().
    Status WaitLayer(int layer, void* stream) const;
    // Waits on the host for every layer (a prompt served whole, without a forward).
    Status WaitAll() const;

   private:
    friend class PinnedHostTier;
    EventPool* events_ = nullptr;
    int from_ = 0, tokens_ = 0;
    std::vector<cudaEvent_t> layer_events_;
  };

  // tokens[0, from_tokens) are in `lease` already (from_tokens a multiple of the block size).
  // make_room(n) is asked to free n pool blocks when allocation fails.
  std::unique_ptr<Prefetch> Fetch(const BlockKey& root, std::span<const int32_t> tokens,
                                  int from_tokens, model::BlockLease* lease,
                                  const std::function<void(int)>& make_room);
  // ids[i] hold the KV of tokens [i*block_size, ...).
  void WriteDown(const BlockKey& root, std::span<const int32_t> tokens,
                 const std::vector<int32_t>& ids);
  // Waits until every copy enqueued so far is complete (and its entries visible).
  void Flush();
  void EraseAll();

  struct Stats {
    TierStats tier;
    uint64_t fetched_tokens = 0;
    uint64_t fetch_us = 0;          // host time spent matching and enqueueing fetches
    uint64_t skipped_blocks = 0;    // write-downs skipped: too much in flight
    uint64_t in_flight = 0;         // copies not yet completed (gauge)
    int events_created = 0, events_free = 0;
    uint64_t ring_used = 0;         // block ids of copies in flight (gauge)
  };
  Stats stats() const;
  // The thread blocks of later copies (benchmarks: the copy's share of the SMs).
  void set_copy_ctas(int ctas) { copy_ctas_ = ctas > 0 ? ctas : 32; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Entry {
    int slot;
    bool ready = false;   // its copy-in has completed
    bool doomed = false;  // erased while in use: freed once no copy uses it
    int pins = 0;         // fetches in flight reading it
    Clock::time_point written;
    std::list<BlockKey>::iterator lru;
  };
  struct Transfer {
    bool write = false;
    cudaEvent_t done = nullptr;
    model::BlockLease pool_refs;   // the pool blocks the copy reads or writes
    std::vector<BlockKey> keys;    // its entries (written, or pinned for a read)
    uint64_t ring_end = 0;
  };
  PinnedHostTier(model::KvPool* pool, const Options& options, int slots);
  Status Init();
  std::vector<BlockKey> Keys(const BlockKey& root, std::span<const int32_t> tokens) const;
  bool RingAllocLocked(size_t n, uint64_t* pos);
  int SlotLocked();
  void EraseLocked(const BlockKey& key);
  void FinishLocked(Transfer& t, bool ok);
  void Reaper();

  model::KvPool* pool_;
  const Options options_;
  const size_t block_bytes_;
  const int slots_;
  int device_ = 0;
  std::byte* host_ = nullptr;   // [layer][slot][block_bytes], mapped
  std::byte* dhost_ = nullptr;  // the same memory as the device addresses it
  int32_t* ring_ = nullptr;     // pinned block ids of the copies in flight
  int32_t* dring_ = nullptr;    // their device copy, read by the kernels
  size_t ring_size_ = 0;
  uint64_t ring_head_ = 0, ring_tail_ = 0;
  cudaStream_t stream_ = nullptr;  // the lowest priority
  std::atomic<int> copy_ctas_;
  EventPool events_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<BlockKey, Entry, KeyHasher> index_;
  std::list<BlockKey> lru_;  // ready entries, front = most recently used
  std::vector<int> free_;
  std::deque<Transfer> fifo_;  // in stream order
  uint64_t writing_blocks_ = 0;
  bool stopping_ = false;
  bool reaping_ = false;  // a finished copy's leases are being returned
  TierStats stats_;
  uint64_t fetched_tokens_ = 0, fetch_us_ = 0, skipped_ = 0;
  std::thread reaper_;
};

// Hooks for the forward over the suffix: layer l's attention waits (on the GPU) for layer l of
// the prefetched prefix, then `inner`'s hooks run (inner may be null).
class PrefetchHooks final : public model::LayerHooks {
 public:
  PrefetchHooks(const PinnedHostTier::Prefetch* prefetch, model::LayerHooks* inner)
      : prefetch_(prefetch), inner_(inner) {}
  Status BeforeAttention(int layer, void* stream) override;
  Status AfterLayer(int layer, void* stream) override;

 private:
  const PinnedHostTier::Prefetch* prefetch_;
  model::LayerHooks* inner_;
};

}  // namespace kvstream::kvcache::cuda
