// L2: blocks in host memory (plain memory with the CPU backend; page-locked memory that the
// caller allocates, e.g. cudaHostAlloc, with a GPU pool), a fixed number of block-sized slots
// carved from one allocation made at start.
//
// Guarantees (besides kvcache/tier.h's): holds at most capacity / block bytes entries; a Put into
// a full tier first evicts least recently used entries down to low_watermark of the slots (a
// Get counts as a use); entries older than max_age_s (0 = no bound) are dropped when met.
// Entries are kept as raw payload (no codec: the memory never leaves the process).
#pragma once

#include <chrono>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "kvcache/tier.h"

namespace kvstream::kvcache {

struct KeyHasher {
  size_t operator()(const BlockKey& k) const;
};

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
  void Erase(const BlockKey& key) override;
  void EraseAll() override;
  TierStats stats() const override;

 private:
  using Clock = std::chrono::steady_clock;
  struct Entry {
    int slot;
    Clock::time_point written;
    std::list<BlockKey>::iterator lru;
  };
  HostTier(const Options& options, std::unique_ptr<model::PoolMemory> memory, int slots);
  std::byte* SlotPtr(int slot) const;
  bool ExpiredLocked(const Entry& e) const;
  void EraseLocked(const BlockKey& key);

  const Options options_;
  const size_t block_bytes_;  // one layer
  const size_t slot_bytes_;   // every layer
  std::unique_ptr<model::PoolMemory> memory_;
  mutable std::mutex mu_;
  std::unordered_map<BlockKey, Entry, KeyHasher> index_;
  std::list<BlockKey> lru_;  // front = most recently used
  std::vector<int> free_;
  int slots_;
  TierStats stats_;
};

}  // namespace kvstream::kvcache
