// L2: blocks in host memory (plain memory with the CPU backend; page-locked memory that the
// caller allocates, e.g. cudaHostAlloc, with a GPU pool), a fixed number of block-sized slots
// carved from one allocation made at start.
//
// Guarantees (besides kvcache/tier.h's): holds at most capacity / block bytes entries; a Put into
// a full tier first evicts least recently used unpinned entries down to low_watermark of the
// slots (a Get counts as a use); entries older than max_age_s (0 = no bound) are dropped when
// met. The bookkeeping is kvcache/tier_index.h's.
// Entries are kept as raw payload (no codec: the memory never leaves the process).
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "kvcache/tier.h"
#include "kvcache/tier_index.h"

namespace kvstream::kvcache {

class HostTier final : public KvTier {
 public:
  struct Options {
    model::KvLayout layout;
    size_t capacity_bytes = 0;
    double low_watermark = 0.9;  // of the slots, in (0, 1]
    int64_t max_age_s = 0;
  };
  // `memory` holds the slots (at least capacity_bytes); kInvalidArgument when not even one
  // block fits.
  static Result<std::unique_ptr<HostTier>> Create(const Options& options,
                                                  std::unique_ptr<model::PoolMemory> memory);

  std::string_view name() const override { return "host"; }
  bool Contains(const BlockKey& key) override;
  Status Get(const BlockKey& key, std::span<const std::span<std::byte>> layers) override;
  Status Put(const BlockHeader& header, std::span<const std::span<const std::byte>> layers) override;
  bool Pin(const BlockKey& key) override;
  void Unpin(const BlockKey& key) override;
  void Erase(const BlockKey& key) override;
  void EraseAll() override;
  TierStats stats() const override;

 private:
  HostTier(const Options& options, std::unique_ptr<model::PoolMemory> memory, int slots);
  std::byte* SlotPtr(uint64_t slot) const;
  void EraseLocked(const BlockKey& key);

  const Options options_;
  const size_t block_bytes_;  // one layer
  const size_t slot_bytes_;   // every layer
  std::unique_ptr<model::PoolMemory> memory_;
  mutable std::mutex mu_;
  TierIndex index_;  // one slot_bytes_ per entry
  std::vector<int> free_;
  TierStats stats_;
};

}  // namespace kvstream::kvcache
