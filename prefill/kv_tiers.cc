#include "prefill/kv_tiers.h"

#include "common/log.h"
#include "daemon/credentials.h"  // ReadTokenFile
#include "daemon/kv_store_tier.h"
#include "kvcache/disk_tier.h"
#include "kvcache/host_tier.h"

namespace kvstream::prefill {

Result<std::unique_ptr<kvcache::TieredCache>> CreateKvTiers(const daemon::DaemonConfig& config,
                                                            const model::ModelConfig& model,
                                                            model::KvPool* pool,
                                                            kvcache::PoolTier* pool_tier) {
  std::vector<std::unique_ptr<kvcache::KvTier>> tiers;
  const bool gpu = pool->memory().on_device();  // the host tier: CreatePoolTier
  const bool staged = gpu && pool_tier != nullptr && pool_tier->staging() != nullptr;
  if (gpu && !staged && (!config.kv_disk_tier_dir.empty() || !config.kv_store_redis.empty()))
    return InvalidArgument("kv_disk_tier_dir / kv_store_redis with a GPU pool: their blocks are "
                           "staged through the pinned host tier; set kv_host_tier_mb too");
  if (staged) tiers.push_back(std::make_unique<kvcache::BorrowedTier>(pool_tier->staging()));
  std::string secret;
  if (!config.kv_disk_tier_dir.empty() || !config.kv_store_redis.empty()) {
    KV_ASSIGN_OR_RETURN(secret,
                        daemon::ReadTokenFile("kv_tier_secret_file", config.kv_tier_secret_file));
  }
  const kvcache::BlockKey root = kvcache::RootKey(model.hash(), pool->layout(), /*salt=*/"");
  constexpr uint64_t kMiB = 1 << 20;
  if (config.kv_host_tier_mb > 0 && !gpu) {
    kvcache::HostTier::Options o;
    o.layout = pool->layout();
    o.capacity_bytes = uint64_t(config.kv_host_tier_mb) * kMiB;
    o.max_age_s = config.kv_tier_max_age_s;
    KV_ASSIGN_OR_RETURN(auto memory, model::AllocateHostPoolMemory(o.capacity_bytes));
    auto host = kvcache::HostTier::Create(o, std::move(memory));
    if (!host.ok()) return host.status().WithContext("kv_host_tier_mb");
    tiers.push_back(std::move(host).value());
  }
  if (!config.kv_disk_tier_dir.empty()) {
    kvcache::DiskTier::Options o;
    o.dir = config.kv_disk_tier_dir;
    o.identity = {root, pool->layout()};
    o.model_hash = model.hash();
    o.secret = secret;
    o.capacity_bytes = uint64_t(config.kv_disk_tier_mb) * kMiB;
    o.max_age_s = config.kv_tier_max_age_s;
    o.erase_at_open = config.kv_disk_tier_erase;
    auto disk = kvcache::DiskTier::Open(o);
    if (!disk.ok()) return disk.status().WithContext("kv_disk_tier_dir");
    tiers.push_back(std::move(disk).value());
  }
  if (!config.kv_store_redis.empty()) {
    KV_ASSIGN_OR_RETURN(auto store,
                        daemon::CreateStoreKvTier(config, model.hash(), pool->layout(), secret));
    tiers.push_back(std::move(store));
  }
  if (tiers.size() > (staged ? 1u : 0u)) {
    KV_LOG_INFO << "KV tiers below the pool:" << (config.kv_host_tier_mb > 0 ? " host " : "")
                << (config.kv_host_tier_mb > 0 ? std::to_string(config.kv_host_tier_mb) + " MiB" : "")
                << (config.kv_disk_tier_dir.empty()
                        ? ""
                        : " disk " + config.kv_disk_tier_dir + " " +
                              std::to_string(config.kv_disk_tier_mb) + " MiB")
                << (config.kv_store_redis.empty() ? "" : " store " + config.kv_store_redis)
                << " (" << config.kv_tier_write_policy << "; reads: " << config.kv_tier_policy << ")";
  }
  kvcache::FetchPolicy policy;
  KV_ASSIGN_OR_RETURN(policy.mode, kvcache::ParseFetchMode(config.kv_tier_policy));
  policy.timeout = std::chrono::milliseconds(config.kv_tier_timeout_ms);
  policy.threshold_tokens = config.kv_prefetch_threshold_tokens;
  return std::make_unique<kvcache::TieredCache>(pool, model.hash(), std::move(tiers), policy,
                                                config.kv_tier_io_threads, staged,
                                                config.kv_tier_write_threads);
}

}  // namespace kvstream::prefill
