// L2 below a GPU KV pool: blocks in page-locked host memory, moved to and from the pool by
// gathered copies (kvcache/cuda/block_copy.h) on a low-priority copy stream, completion tracked
// by events from a pool (docs/kv_tiers.md, "The GPU path").
//
// Memory: one cudaHostAlloc (mapped) of capacity_bytes made at start, layer-major
// ([layer][slot][block_bytes], like the pool), and the blocks of one write-down take consecutive
// slots where free, so a prefix moves in a few copy-engine memcpys per layer; scattered pool
// blocks through a device staging buffer (the copy engines, then a device-memory scatter), or,
// scattered on both sides, one gather-kernel launch per layer over the link.
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
//    (cudaStreamWaitEvent: on the GPU) before its attention reads layer l (kvcache::PrefetchHooks).
//    The copies hold references of their own on the destination blocks until they complete, so a
//    forward that stops early never lets another request reuse a block still being written. A
//    fetch that cannot start (no blocks, a launch error) covers nothing: a miss.
//  - Entries in use by a copy are never evicted; a full tier evicts least recently used entries
//    down to low_watermark of its slots; entries older than max_age_s (0: no bound) are misses.
//  - No event or pinned buffer is made per request: events come from a pool made at start (it
//    grows only if more copies are in flight at once than it holds, counted in stats), block
//    ids travel through one pinned ring (and its device copy) allocated at start.
//  - staging(): the entries as a KvTier for the slower tiers staged through this one (kvcache/
//    tiered_cache.h, `staged`): Put copies a block in with the host (visible once complete), Get
//    copies one out, Pin keeps one from eviction; entries Put this way are fetched like any.
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
#include "kvcache/tier_index.h"  // KeyHasher
#include "kvcache/prefix_key.h"
#include "kvcache/pool_tier.h"
#include "model/kv_cache.h"

namespace kvstream::kvcache::cuda {

struct BlockCopy;  // kvcache/cuda/block_copy.h

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

class PinnedHostTier final : public PoolTier {
 public:
  struct Options {
    size_t capacity_bytes = 0;
    double low_watermark = 0.9;
    int64_t max_age_s = 0;
    int copy_ctas = 16;  // thread blocks of the gather kernel (its share of the SMs)
    int engine_max_runs = 4;  // see set_engine_max_runs
    // Device memory through which copies of scattered pool blocks go (0: none; see CopyLayers).
    size_t stage_bytes = size_t(64) << 20;
  };
  // kInvalidArgument for a host pool or a capacity without one slot; allocation errors as they are.
  static Result<std::unique_ptr<PinnedHostTier>> Create(model::KvPool* pool, const Options& options);
  ~PinnedHostTier();
  PinnedHostTier(const PinnedHostTier&) = delete;
  PinnedHostTier& operator=(const PinnedHostTier&) = delete;

  // A fetch in flight: tokens [from, tokens()) are being copied into the lease's blocks.
  class Prefetch final : public PoolPrefetch {
   public:
    ~Prefetch() override;
    int tokens() const override { return tokens_; }
    int from_tokens() const override { return from_; }
    Status WaitLayer(int layer, void* stream) const override;  // cudaStreamWaitEvent
    Status WaitAll() const override;

   private:
    friend class PinnedHostTier;
    EventPool* events_ = nullptr;
    int from_ = 0, tokens_ = 0;
    std::vector<cudaEvent_t> layer_events_;
  };

  // kvcache/pool_tier.h; Fetch returns a PinnedHostTier::Prefetch.
  std::unique_ptr<PoolPrefetch> Fetch(const BlockKey& root, std::span<const int32_t> tokens,
                                      int from_tokens, model::BlockLease* lease,
                                      const std::function<void(int)>& make_room) override;
  void WriteDown(const BlockKey& root, std::span<const int32_t> tokens,
                 const std::vector<int32_t>& ids, std::function<void()> written = {}) override;
  void WriteBlocks(std::span<const KeyedBlock> blocks, std::function<void()> written = {}) override;
  KvTier* staging() override { return &view_; }
  void Flush() override;
  void EraseAll() override;
  Stats stats() const override;
  // The thread blocks of later copies (benchmarks: the copy's share of the SMs).
  void set_copy_ctas(int ctas) { copy_ctas_ = ctas > 0 ? ctas : 16; }
  // Copies whose blocks form at most this many runs (consecutive on both sides) go through the
  // copy engines, one memcpy per run and layer; others through the gather kernel (0: always).
  void set_engine_max_runs(int runs) { engine_max_runs_ = runs; }
  // Copies that the engines do not take whole but whose tier side forms at most kStagedMaxRuns
  // runs go through the device staging buffer (on: the default; benchmarks turn it off to
  // measure the gather kernel alone).
  void set_staging(bool on) { staging_ = on; }
  static constexpr int kStagedMaxRuns = 64;

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
  // WriteDown and WriteBlocks: ids[b] holds the KV named keys[b].
  void WriteKeyed(std::span<const BlockKey> keys, std::span<const int32_t> ids,
                  std::function<void()> written);
  // The host-side view (staging()).
  class View final : public KvTier {
   public:
    explicit View(PinnedHostTier* t) : t_(t) {}
    std::string_view name() const override { return "host"; }
    bool Contains(const BlockKey& key) override;
    Status Get(const BlockKey& key, std::span<const std::span<std::byte>> layers) override;
    Status Put(const BlockHeader& header, std::span<const std::span<const std::byte>> layers) override;
    bool Pin(const BlockKey& key) override;
    void Unpin(const BlockKey& key) override;
    void Erase(const BlockKey& key) override;
    void EraseAll() override { t_->EraseAll(); }
    TierStats stats() const override { return t_->stats().tier; }

   private:
    PinnedHostTier* t_;
  };
  std::byte* SlotLayer(int slot, int layer) const {
    return host_ + (size_t(layer) * slots_ + size_t(slot)) * block_bytes_;
  }
  bool UsableLocked(const BlockKey& key);  // held, complete, not erased, not expired
  void UnpinLocked(const BlockKey& key);
  struct Transfer {
    bool write = false;
    std::function<void()> written;  // a write-down's callback
    cudaEvent_t done = nullptr;
    model::BlockLease pool_refs;   // the pool blocks the copy reads or writes
    std::vector<BlockKey> keys;    // its entries (written, or pinned for a read)
    uint64_t ring_end = 0;
  };
  PinnedHostTier(model::KvPool* pool, const Options& options, int slots);
  Status Init();
  bool RingAllocLocked(size_t n, uint64_t* pos);
  int SlotLocked();
  void EraseLocked(const BlockKey& key);
  void FinishLocked(Transfer& t, bool ok);
  static std::vector<std::pair<int, int>> Runs(std::span<const int32_t> src, std::span<const int32_t> dst);
  Status CopyLayers(const BlockCopy& c, const std::vector<std::pair<int, int>>& runs,
                    std::span<const int32_t> src, std::span<const int32_t> dst);
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
  std::atomic<int> engine_max_runs_;
  std::atomic<bool> staging_{true};
  std::byte* dstage_ = nullptr;  // Options::stage_bytes of device memory (staged copies)
  int32_t* dseq_ = nullptr;      // 0, 1, ... stage_blocks_-1 on the device
  int stage_blocks_ = 0;
  EventPool events_;
  View view_{this};

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
  uint64_t engine_copies_ = 0, kernel_copies_ = 0, staged_copies_ = 0;  // under mu_
  std::thread reaper_;
};

}  // namespace kvstream::kvcache::cuda
