// The L4 shared tier: KV blocks in the block codec's form (kvcache/block_codec.h) in Redis
// (kvcache/redis_store.h), written down by a background thread, read up verified.
//
// Guarantees:
//  - Write() never blocks on the store: it queues the block's header and payload (host bytes,
//    already copied off the pool) for the writer thread, which encodes (CRC + HMAC with the
//    cluster secret) and stores it; a queue over max_pending_bytes drops the block (counted).
//    A block the store already holds is not written again.
//  - Read() returns a payload only from an entry that decodes under this tier's identity (root
//    key and layout), for that very key, with this secret; anything else (absent, damaged,
//    poisoned, another model, the store down or late) is a miss, counted, never KV.
//  - Present() asks the store about many keys in one batched query (one round trip per server);
//    a failure reports them absent.
//  - The destructor stops the writer after at most flush_on_close of draining.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "kvcache/block_codec.h"
#include "kvcache/redis_store.h"
#include "kvcache/tier.h"

namespace kvstream::kvcache {

struct StoreTierOptions {
  RedisStoreOptions redis;  // its `verify` is set by the tier
  std::string secret;       // the cluster secret (>= kMinSecretBytes)
  BlockIdentity identity;   // what this daemon reads and writes
  uint64_t model_hash = 0;
  size_t max_pending_bytes = size_t{256} << 20;
  std::chrono::milliseconds flush_on_close{2000};
};

struct StoreTierStats {
  uint64_t written_blocks = 0, written_bytes = 0, skipped_present = 0;
  uint64_t dropped_blocks = 0, write_failures = 0;
  uint64_t read_hits = 0, read_misses = 0, read_bytes = 0, verify_failures = 0;
  uint64_t pending_blocks = 0;
  RedisStoreStats redis;
};

class StoreTier {
 public:
  static Result<std::unique_ptr<StoreTier>> Open(StoreTierOptions options);
  ~StoreTier();

  // Queues one block (its header's key, tokens and layout; the payload: every layer's block,
  // layer 0 first, EncodedBlockBytes(layout) - header - trailer bytes). False: dropped.
  bool Write(const BlockHeader& header, std::vector<std::byte> payload);
  std::vector<bool> Present(std::span<const BlockKey> keys);
  std::optional<std::vector<std::byte>> Read(const BlockKey& key);
  // Waits until the queue is empty and the writer idle, or the deadline; true when drained.
  bool Flush(Deadline deadline);
  // Erases every entry of this deployment's namespace (all models): the keys removed.
  Result<uint64_t> EraseAll() { return store_->EraseAll(); }
  Status Probe() { return store_->Probe(); }
  StoreTierStats stats() const;
  const BlockIdentity& identity() const { return options_.identity; }

 private:
  struct Pending {
    BlockHeader header;
    std::vector<std::byte> payload;
  };
  explicit StoreTier(StoreTierOptions options);
  void WriterLoop();

  StoreTierOptions options_;
  std::unique_ptr<RedisStore> store_;
  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<Pending> queue_;
  size_t pending_bytes_ = 0;
  bool writing_ = false, stop_ = false;
  std::thread writer_;
  std::atomic<uint64_t> written_blocks_{0}, written_bytes_{0}, skipped_present_{0};
  std::atomic<uint64_t> dropped_blocks_{0}, write_failures_{0};
  std::atomic<uint64_t> read_hits_{0}, read_misses_{0}, read_bytes_{0}, verify_failures_{0};
};

// The store tier as the last KvTier of a TieredCache (kvcache/tier.h): Put queues (Write), Get
// reads and verifies (Read), Present is the batched match-time query, Contains asks for one
// key. Erase does nothing (entries expire by their TTL; EraseAll erases the namespace).
class StoreKvTier final : public KvTier {
 public:
  explicit StoreKvTier(std::unique_ptr<StoreTier> store) : store_(std::move(store)) {}
  std::string_view name() const override { return "store"; }
  bool remote() const override { return true; }
  bool slow() const override { return true; }
  bool Contains(const BlockKey& key) override { return store_->Present({&key, 1})[0]; }
  std::vector<bool> Present(std::span<const BlockKey> keys) override { return store_->Present(keys); }
  Status Get(const BlockKey& key, std::span<const std::span<std::byte>> layers) override;
  Status Put(const BlockHeader& header, std::span<const std::span<const std::byte>> layers) override;
  void Erase(const BlockKey& /*key*/) override {}
  void EraseAll() override;
  TierStats stats() const override;
  StoreTier& store() { return *store_; }

 private:
  std::unique_ptr<StoreTier> store_;
};

// A BlockKey as the store's opaque key bytes.
inline std::string StoreKey(const BlockKey& key) {
  return std::string(reinterpret_cast<const char*>(key.data()), key.size());
}

}  // namespace kvstream::kvcache
