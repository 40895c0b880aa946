#include "daemon/kv_store_tier.h"

#include "common/log.h"
#include "kvcache/store_tier.h"

namespace kvstream::daemon {

Result<std::unique_ptr<kvcache::KvTier>> CreateStoreKvTier(const DaemonConfig& config,
                                                           uint64_t model_hash,
                                                           const model::KvLayout& layout,
                                                           const std::string& secret) {
  if (config.kv_store_redis.empty()) return std::unique_ptr<kvcache::KvTier>();
  kvcache::StoreTierOptions o;
  o.redis.servers = kvcache::SplitRedisServers(config.kv_store_redis);
  o.redis.auth_file = config.kv_store_auth_file;
  o.redis.insecure = config.kv_store_insecure;
  o.redis.ns = config.kv_store_namespace;
  o.redis.timeout = std::chrono::milliseconds(config.kv_store_timeout_ms);
  o.redis.ttl = std::chrono::seconds(config.kv_store_ttl_s);
  o.secret = secret;
  o.identity = {kvcache::RootKey(model_hash, layout, /*salt=*/""), layout};
  o.model_hash = model_hash;
  o.max_pending_bytes = size_t(config.kv_store_max_pending_mb) << 20;
  auto store = kvcache::StoreTier::Open(std::move(o));
  if (!store.ok()) return store.status().WithContext("kv_store_redis");
  // A refused AUTH is a configuration error; a server that is down is only a miss for now.
  const Status probe = (*store)->Probe();
  if (probe.code() == StatusCode::kFailedPrecondition) return probe.WithContext("kv_store_redis");
  if (!probe.ok()) {
    KV_LOG_WARN << "kv_store_redis: " << probe.ToString() << " (misses until it answers)";
  }
  return std::unique_ptr<kvcache::KvTier>(
      std::make_unique<kvcache::StoreKvTier>(std::move(store).value()));
}

void FillKvTierStats(std::string_view name, const kvcache::TierStats& t, v1::KvTierStats* o) {
  o->set_name(std::string(name));
  o->set_hit_blocks(t.hit_blocks);
  o->set_miss_blocks(t.miss_blocks);
  o->set_read_failures(t.read_failures);
  o->set_bytes_read(t.bytes_read);
  o->set_bytes_written(t.bytes_written);
  o->set_written_blocks(t.written_blocks);
  o->set_write_failures(t.write_failures);
  o->set_evicted_blocks(t.evicted_blocks);
  o->set_entries(t.entries);
  o->set_bytes_used(t.bytes_used);
  o->set_capacity_bytes(t.capacity_bytes);
}

}  // namespace kvstream::daemon
