// The tiers below the KV pool put together for one pool: where a prefill's blocks are written
// down to (write path) and fetched back up from (read path). Write policy: the caller's;
// write-through calls WriteDown (every block of a finished prefill goes to every tier that
// lacks it), write-back calls WriteBack with the blocks the prefix directory evicts.
//
// Guarantees:
//  - WriteDown never blocks on a tier: it queues the blocks with a lease of their own, so
//    they are neither freed nor reused before the background writers have copied them out. The
//    queue holds at most half the pool's blocks: past that a write-down is skipped (counted),
//    so slow tiers never starve requests of pool blocks. `write_threads` writer threads (at
//    least 1) take the queued blocks one at a time, in queue order, and copy each into every
//    tier that lacks it, so at most that many blocks are being encoded and written at once
//    (blocks of one write-down may complete out of order; each entry is still visible only
//    once complete). A job's lease is returned once the last of its blocks is done or dropped.
//  - A block every local tier holds (their indexes, asked at once) is neither queued nor
//    counted nor leased: only blocks some tier may lack are. A remote tier, whose presence
//    costs a round trip, is asked by a writer, once per queued write-down (one
//    batched query); the blocks it and every local tier hold are not copied again. The gauge
//    (Stats::queued_writes) counts the blocks queued and not yet written or found held;
//    Stats::held_blocks those found held (not written again).
//  - A fetch extends a cached prefix block by block with blocks found in the tiers (fastest
//    first; a remote tier is asked once, batched, for the whole rest of the prompt). Prepare
//    finds them, pins the ones in local tiers (never evicted until the fetch ends) and starts
//    the reads from slow tiers (disk, store) on a bounded pool of I/O threads, then waits for
//    them as the policy says (below), by the caller's deadline at the latest; Fill (quick: pool
//    allocations and copies) copies the blocks into fresh pool blocks of the caller's lease,
//    up to the first block that is not there, late, or did not read back verified. The tokens
//    it reports are exactly the blocks copied: a failed or late read is a miss (counted), never
//    KV of other tokens. A slow read that completes (even after the caller gave up on it)
//    leaves its block in the faster local tiers.
//  - Policies: kBestEffort uses what the fast tiers (memory) hold now and recomputes the rest
//    (the slow reads still run, for the next request); kTimeout waits up to `timeout` for the
//    slow reads, then trims; kWaitComplete waits for all of them. A hit of fewer than
//    threshold_tokens tokens below the pool is recomputed instead of fetched.
//  - WriteBack queues blocks named by their own keys (no chain: one missing does not end the
//    others) exactly as WriteDown does: references of their own, the same queue and bound
//    (skipped past it, counted), blocks every tier holds not queued; counted in
//    Stats::write_back_blocks once queued. With wait_for_room (a shutdown) it waits for room
//    instead of skipping. WriteBackStaged is its staged form (after PoolTier::WriteBlocks).
//  - Stop (or the destructor) drops queued writes and reads (blocks not yet taken by a
//    writer; those being written finish) and joins the threads: every lease returned, the
//    gauge back to 0.
//  - Staged (a pool the host cannot address, e.g. on a GPU): tiers[0] is the staging view of the
//    PoolTier below the pool (PoolTier::staging(): the pinned host tier), every slower tier is
//    read into it and written from it. FillFrom replaces Fill: it puts the blocks read from
//    slow tiers into the staging tier, pins them there and has the PoolTier fetch the run into
//    the pool (asynchronously, layer by layer); WriteStaged replaces WriteDown: once the
//    PoolTier's copy out is complete, the background writers copy the prompt's blocks from the
//    staging tier to the slower tiers that lack them. The policies and the threshold apply to
//    the staging tier as to any.
// Otherwise host pools only (the copies are memcpy). Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/time.h"
#include "kvcache/io_pool.h"
#include "kvcache/pool_tier.h"
#include "kvcache/prefix_key.h"
#include "kvcache/tier.h"
#include "model/kv_cache.h"

namespace kvstream::kvcache {

struct FetchPolicy {
  enum class Mode { kBestEffort, kTimeout, kWaitComplete };
  Mode mode = Mode::kWaitComplete;
  std::chrono::milliseconds timeout{50};  // kTimeout's bound on the wait for slow reads
  int threshold_tokens = 0;               // shorter hits below the pool are recomputed
};
// "best_effort" | "timeout" | "wait_complete".
Result<FetchPolicy::Mode> ParseFetchMode(std::string_view name);

class TieredCache {
 public:
  // `tiers`: fastest first (host, disk, store); may be empty (then every call does nothing).
  // io_threads: the pool reading slow tiers (0: none, slow tiers are then read by Fill).
  // staged: tiers[0] is a PoolTier's staging view (above: "Staged").
  // write_threads: the writer threads of the write-down (below 1: 1).
  TieredCache(model::KvPool* pool, uint64_t model_hash, std::vector<std::unique_ptr<KvTier>> tiers,
              FetchPolicy policy = {}, int io_threads = 2, bool staged = false,
              int write_threads = kDefaultWriteThreads);
  static constexpr int kDefaultWriteThreads = 4;
  ~TieredCache();
  TieredCache(const TieredCache&) = delete;
  TieredCache& operator=(const TieredCache&) = delete;

  bool enabled() const { return !tiers_.empty(); }
  // Some tier keeps its blocks past this process (the slow ones: disk, store).
  bool durable() const {
    for (const auto& t : tiers_)
      if (t->slow()) return true;
    return false;
  }
  const FetchPolicy& policy() const { return policy_; }

  class Pending;  // a prepared fetch: pinned entries, reads in flight
  struct PendingDeleter {
    void operator()(Pending* p) const;
  };
  using PendingPtr = std::unique_ptr<Pending, PendingDeleter>;
  // tokens[0, from_tokens) are in the pool already (from_tokens a multiple of the block size).
  // Finds and reads, per the policy, by `deadline` at the latest. Null when there is nothing to
  // fetch. Must not outlive the cache.
  PendingPtr Prepare(const BlockKey& root, std::span<const int32_t> tokens, int from_tokens,
                     Deadline deadline);
  // tokens[0, from_tokens) are in `lease` (from_tokens may have grown since Prepare). make_room(n)
  // is asked to free n pool blocks when allocation fails. Returns the tokens `lease` covers
  // with KV afterwards (>= from_tokens).
  int Fill(Pending* pending, int from_tokens, model::BlockLease* lease,
           const std::function<void(int)>& make_room);
  // Prepare then Fill.
  int Fetch(const BlockKey& root, std::span<const int32_t> tokens, int from_tokens,
            model::BlockLease* lease, const std::function<void(int)>& make_room,
            Deadline deadline = DeadlineAfterMs(60000));
  // Staged: stages the prepared blocks from tokens[from_tokens...] in tiers[0] and has `below`
  // (whose staging view it is) fetch them into `lease`. Null when nothing is fetched; else the
  // prefetch covers [from_tokens, its tokens()).
  std::unique_ptr<PoolPrefetch> FillFrom(PoolTier* below, Pending* pending,
                                         std::span<const int32_t> tokens, int from_tokens,
                                         model::BlockLease* lease,
                                         const std::function<void(int)>& make_room);
  // Staged: queues the write of the prompt's blocks held by tiers[0] to the slower tiers
  // (never waits; skipped, counted, past the queue's bound).
  void WriteStaged(const BlockKey& root, std::span<const int32_t> tokens);
  // ids[i] hold the KV of tokens [i*block_size, ...); takes references of its own. Not staged.
  void WriteDown(const BlockKey& root, std::span<const int32_t> tokens,
                 const std::vector<int32_t>& ids);
  // Write-back, not staged: `blocks` (still referenced by the caller) to every tier lacking
  // them, with references of its own. Never waits unless wait_for_room.
  void WriteBack(std::span<const KeyedBlock> blocks, bool wait_for_room = false);
  // Write-back, staged: `blocks` held by tiers[0] to the slower tiers that lack them.
  void WriteBackStaged(std::span<const KeyedBlock> blocks);
  // Waits until every queued write is done (tests; a shutdown uses Stop).
  void Flush();
  // Flush up to `deadline`: true when every queued write is done.
  bool WaitForWrites(Deadline deadline);
  void Stop();
  void EraseAll();

  struct TierReport {
    std::string name;
    TierStats stats;
  };
  struct Stats {
    std::vector<TierReport> tiers;
    uint64_t fetched_tokens = 0;     // tokens whose KV came up from a tier
    uint64_t fetch_us = 0;           // time requests waited for fetches (on their TTFT)
    uint64_t recomputed_tokens = 0;  // found below the pool, computed instead (threshold,
                                     // policy, a late or failed read)
    uint64_t late_blocks = 0;        // slow reads not done when the policy stopped waiting
    uint64_t queued_writes = 0;      // blocks waiting for the write-down (gauge)
    uint64_t skipped_blocks = 0;     // blocks not written down: the queue was full
    uint64_t held_blocks = 0;        // blocks of write-downs every tier held: not written again
    uint64_t write_back_blocks = 0;  // blocks queued by WriteBack / WriteBackStaged
  };
  Stats stats() const;

 private:
  struct Reads;
  struct Job {
    BlockKey root;
    std::vector<BlockKey> keys;     // the blocks some tier may lack, in prompt order
    std::vector<uint32_t> tokens;   // the tokens each of them holds
    model::BlockLease lease;        // keys[i]'s KV in ids()[i]; empty when staged (tiers_[0])
    size_t left = 0;                // keys counted in queued_blocks_ when queued
    bool chain = true;              // a prompt's blocks: staged, one gone ends the job
    bool write_back = false;        // counted in write_back_blocks_ when queued
    // Under mu_: keys[next...] are not yet taken by a writer (in queued_blocks_ until taken and
    // done, or dropped).
    size_t next = 0;
    // Per remote tier (by tier index): which keys it held, asked once before the first block.
    std::vector<std::vector<bool>> remote_has;
  };
  using JobPtr = std::shared_ptr<Job>;  // shared by the writers taking its blocks
  // The job of writing down the prompt's blocks that some tier below the pool (the staging
  // tier aside) may lack: local tiers are asked by index; a remote tier may always lack. Staged,
  // it ends at the first such block the staging tier lacks. `index` gets each one's block index.
  Job Lacking(const BlockKey& root, std::span<const int32_t> tokens, std::vector<size_t>* index);
  // The same over explicit keys and token counts; chain: staged, stop at the first block the
  // staging tier lacks (else skip it).
  Job LackingKeys(const BlockKey& root, std::span<const BlockKey> keys,
                  std::span<const uint32_t> tokens, bool chain, std::vector<size_t>* index);
  // false when the queue is full (counted) or stopping; wait: for room instead (at least an
  // empty queue, whatever the job's size).
  bool Enqueue(Job job, bool wait = false);
  // WriteBack / WriteBackStaged: one job per run of blocks under one root.
  void WriteBackRuns(std::span<const KeyedBlock> blocks, bool wait_for_room);
  // Under mu_: drops the job's blocks no writer took yet (the gauge), so none is taken.
  void DropRestLocked(Job& job);
  // Blocks [from_tokens / block_size, end) of `p` held and pinned in tiers_[0]: the tokens covered.
  int Stage(Pending* p, int from_tokens);
  void Worker();
  // Asks the remote tiers once which of the job's blocks they hold.
  void PrepareJob(Job& job);
  // Writes block j of `job` into every tier below the pool that lacks it; `buf` a writer's
  // staging buffer. False when the block is gone from the staging tier (ends the job). `held`:
  // every tier held it.
  bool WriteBlock(const Job& job, size_t j, std::vector<std::byte>& buf, bool* held);
  std::vector<BlockKey> Keys(const BlockKey& root, std::span<const int32_t> tokens) const;
  // The fastest tier holding each of keys[first...] (null from the first no tier holds on).
  std::vector<KvTier*> Locate(std::span<const BlockKey> keys, size_t first);
  // Copies a block read from `from` into the local tiers faster than it.
  void Promote(const BlockHeader& header, const KvTier* from,
               std::span<const std::span<const std::byte>> layers);

  model::KvPool* pool_;
  const uint64_t model_hash_;
  std::vector<std::unique_ptr<KvTier>> tiers_;
  const FetchPolicy policy_;
  const bool staged_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<JobPtr> queue_;  // jobs not yet prepared (PrepareJob)
  std::deque<JobPtr> ready_;  // prepared jobs whose blocks the writers take, front first
  int busy_ = 0;              // writers preparing a job or writing a block
  bool stopping_ = false;
  uint64_t queued_blocks_ = 0;
  uint64_t skipped_blocks_ = 0;
  uint64_t held_blocks_ = 0;
  uint64_t write_back_blocks_ = 0;
  std::atomic<uint64_t> fetched_tokens_{0}, fetch_us_{0}, recomputed_tokens_{0}, late_blocks_{0};
  std::vector<std::thread> writers_;
  std::unique_ptr<IoPool> io_;  // after tiers_: its threads end before the tiers go
};

}  // namespace kvstream::kvcache
