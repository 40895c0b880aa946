// L3: blocks as files in a local directory, one file per block (<key hex>.kvb, mode 0600, the
// kvcache/block_codec.h form with the cluster secret's HMAC).
//
// Guarantees (besides kvcache/tier.h's):
//  - An entry is written to a temporary name and renamed into place when complete: a reader
//    never sees a partial entry under its final name; a crash leaves at most temporary files,
//    removed at the next Open.
//  - Open rebuilds the index from the directory: an entry of another identity (model, layout,
//    salt; seen in its header) is never read past its header, never used and left in place
//    (counted in foreign_entries; EraseAll removes it); an entry of this identity that does
//    not verify is deleted.
//  - Every Get verifies the whole entry again (CRC, identity, key, HMAC): a file damaged,
//    truncated, replaced or deleted since is a counted failure, deleted, never KV.
//  - At most capacity_bytes of this identity's entries: a Put first evicts least recently used
//    entries down to low_watermark; a write that fails (e.g. the disk is full) stores nothing.
//  - Entries older than max_age_s (0 = no bound; by the file's time) are dropped when met.
#pragma once

#include <chrono>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "kvcache/host_tier.h"  // KeyHasher
#include "kvcache/tier.h"

namespace kvstream::kvcache {

class DiskTier final : public KvTier {
 public:
  struct Options {
    std::string dir;
    BlockIdentity identity;
    uint64_t model_hash = 0;
    std::string secret;           // the cluster secret (>= kMinSecretBytes)
    uint64_t capacity_bytes = 0;
    double low_watermark = 0.9;
    int64_t max_age_s = 0;
    bool erase_at_open = false;   // remove every entry first (any identity)
  };
  // Creates the directory (0700) when missing, then rebuilds the index.
  static Result<std::unique_ptr<DiskTier>> Open(const Options& options);

  std::string_view name() const override { return "disk"; }
  bool Contains(const BlockKey& key) override;
  Status Get(const BlockKey& key, std::span<const std::span<std::byte>> layers) override;
  Status Put(const BlockHeader& header, std::span<const std::span<const std::byte>> layers) override;
  void Erase(const BlockKey& key) override;
  void EraseAll() override;
  TierStats stats() const override;

  struct OpenReport {
    uint64_t loaded = 0;           // entries of this identity that verified
    uint64_t foreign_entries = 0;  // another model's / layout's entries, left unread
    uint64_t dropped = 0;          // entries of this identity that did not verify (deleted)
  };
  OpenReport open_report() const { return report_; }
  std::string PathOf(const BlockKey& key) const;

 private:
  using FileClock = std::chrono::system_clock;
  struct Entry {
    uint64_t bytes;
    FileClock::time_point written;
    std::list<BlockKey>::iterator lru;
  };
  explicit DiskTier(const Options& options);
  Status Rebuild();
  bool ExpiredLocked(const Entry& e) const;
  void EraseLocked(const BlockKey& key);  // the index entry and its file
  void FailRead(const BlockKey& key);

  const Options options_;
  mutable std::mutex mu_;
  std::unordered_map<BlockKey, Entry, KeyHasher> index_;
  std::list<BlockKey> lru_;  // front = most recently used
  uint64_t used_ = 0;
  uint64_t temp_seq_ = 0;
  TierStats stats_;
  OpenReport report_;
};

}  // namespace kvstream::kvcache
