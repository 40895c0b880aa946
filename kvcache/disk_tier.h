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
//    unpinned entries down to low_watermark (kvcache/tier_index.h); a write that fails (e.g. the
//    disk is full) stores nothing. A Get pins its entry while it reads the file.
//  - Entries older than max_age_s (0 = no bound; by the file's time) are dropped when met.
//  - Reads and writes use O_DIRECT (Options::direct_reads / direct_writes, the default;
//    buffered where the file system refuses it; a write's last partial page is buffered) from
//    and into a buffer each thread keeps (one entry's size), so neither copies through the page
//    cache nor allocates. No fsync: a crash may lose entries, never expose a partial one.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "kvcache/tier.h"
#include "kvcache/tier_index.h"

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
    // Entries are read with O_DIRECT (no page-cache copy, the page cache left to the host tier
    // above; buffered where the file system refuses it).
    bool direct_reads = true;
    // Entries are written with O_DIRECT, their whole 4 KiB pages (the tail buffered; all
    // buffered where the file system refuses it). Either way without fsync.
    bool direct_writes = true;
  };
  // Creates the directory (0700) when missing, then rebuilds the index.
  static Result<std::unique_ptr<DiskTier>> Open(const Options& options);

  std::string_view name() const override { return "disk"; }
  bool slow() const override { return true; }
  bool Contains(const BlockKey& key) override;
  Status Get(const BlockKey& key, std::span<const std::span<std::byte>> layers) override;
  Status Put(const BlockHeader& header, std::span<const std::span<const std::byte>> layers) override;
  bool Pin(const BlockKey& key) override;
  void Unpin(const BlockKey& key) override;
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
  using FileClock = TierIndex::Clock;
  explicit DiskTier(const Options& options);
  Status Rebuild();
  void EraseLocked(const BlockKey& key);  // the index entry and its file
  void FailRead(const BlockKey& key);

  const Options options_;
  mutable std::mutex mu_;
  TierIndex index_;  // bytes: encoded entries, plus the reservations of files being written
  uint64_t temp_seq_ = 0;
  TierStats stats_;
  OpenReport report_;
};

}  // namespace kvstream::kvcache
