// The L4 shared tier's client: opaque entries (the block codec's encoded bytes) in one or several
// Redis servers, sharded by key hash (docs/kv_store.md).
//
// Guarantees:
//  - Open() refuses to start without credentials (auth_file: the password, or two lines: ACL user
//    then password) unless `insecure`; a file readable by group or others is warned of.
//  - A key lives on one server, chosen by consistent hashing (ring_points virtual nodes per
//    server): adding a server to N moves about 1/(N+1) of the keys.
//  - Every call returns by `timeout` after it starts (a down or stopped server fails the call,
//    never hangs it). A server that failed is not dialled again before its backoff (doubling from
//    backoff_min to backoff_max) has passed; calls meanwhile fail at once with kUnavailable.
//  - Exists() asks each server once (a pipeline of EXISTS, all servers in parallel); keys of a
//    server that failed are reported absent and the status says which failed.
//  - Put() stores with a TTL of `ttl`; Get() returns an entry only if `verify` accepts it, else a
//    miss, counted in verify_failures.
//  - Every key is "<ns>:kv:<hex of the key>"; EraseAll() removes the keys under "<ns>:" (SCAN +
//    UNLINK) on every server and no other key.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "kvcache/redis_conn.h"

namespace kvstream::kvcache {

struct RedisStoreOptions {
  std::vector<std::string> servers;  // ParseRedisEndpoint forms; at least one
  std::string auth_file;
  bool insecure = false;  // allow no auth_file (a server without requirepass)
  std::string ns = "kvstream";  // [A-Za-z0-9_.-]+
  std::chrono::milliseconds timeout{250};
  std::chrono::seconds ttl{86400};
  size_t max_value_bytes = size_t{256} << 20;
  std::chrono::milliseconds backoff_min{100}, backoff_max{5000};
  size_t max_idle_per_server = 4;
  int ring_points = 160;
  // Accepts an entry read back (key, value); null accepts every entry.
  std::function<bool(std::string_view, std::string_view)> verify;
};

struct RedisStoreStats {
  uint64_t exists_calls = 0, exists_keys = 0, exists_present = 0;
  uint64_t gets = 0, hits = 0, misses = 0, verify_failures = 0;
  uint64_t puts = 0, put_bytes = 0, get_bytes = 0;
  uint64_t erased_keys = 0;
  uint64_t errors = 0, timeouts = 0, connects = 0, connect_failures = 0;
  uint64_t bytes_sent = 0, bytes_received = 0;  // on the wire, commands and replies
};

// "a,b,..." as server addresses (empty items skipped).
std::vector<std::string> SplitRedisServers(std::string_view list);

// Reads a Redis auth file (see Open). `key` names the setting in errors.
Result<RedisCredentials> ReadRedisAuthFile(const std::string& key, const std::string& path);

class RedisStore {
 public:
  static Result<std::unique_ptr<RedisStore>> Open(RedisStoreOptions options);
  ~RedisStore();

  // Connects to every server and PINGs it; the first failure (an AUTH refusal is
  // kFailedPrecondition), or OK.
  Status Probe();
  std::vector<bool> Exists(std::span<const std::string> keys, Status* status = nullptr);
  Status Put(std::string_view key, std::string_view value);
  Result<std::optional<std::string>> Get(std::string_view key);
  Result<uint64_t> EraseAll();

  size_t ShardOf(std::string_view key) const;
  const std::vector<RedisEndpoint>& servers() const { return endpoints_; }
  std::string RedisKey(std::string_view key) const;
  RedisStoreStats stats() const;

 private:
  struct Shard;
  struct Batch;
  explicit RedisStore(RedisStoreOptions options);
  Result<std::unique_ptr<RedisConn>> Acquire(Shard& shard, Deadline deadline, bool* reused);
  void Release(Shard& shard, std::unique_ptr<RedisConn> conn);
  void MarkDown(Shard& shard, const Status& why);
  void RunBatches(std::span<Batch> batches, Deadline deadline);

  RedisStoreOptions options_;
  RedisCredentials credentials_;
  std::vector<RedisEndpoint> endpoints_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::vector<std::pair<uint64_t, uint32_t>> ring_;  // (point, shard), sorted

  struct Counters {
    std::atomic<uint64_t> exists_calls{0}, exists_keys{0}, exists_present{0};
    std::atomic<uint64_t> gets{0}, hits{0}, misses{0}, verify_failures{0};
    std::atomic<uint64_t> puts{0}, put_bytes{0}, get_bytes{0}, erased_keys{0};
    std::atomic<uint64_t> errors{0}, timeouts{0}, connects{0}, connect_failures{0};
    std::atomic<uint64_t> bytes_sent{0}, bytes_received{0};
  };
  mutable Counters counters_;
};

}  // namespace kvstream::kvcache
