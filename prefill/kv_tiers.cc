#include "prefill/kv_tiers.h"

#include "common/log.h"
#include "daemon/credentials.h"  // ReadTokenFile
#include "kvcache/disk_tier.h"
#include "kvcache/host_tier.h"

namespace kvstream::prefill {

Result<std::unique_ptr<kvcache::TieredCache>> CreateKvTiers(const daemon::DaemonConfig& config,
                                                            const model::ModelConfig& model,
                                                            model::KvPool* pool) {
  std::vector<std::unique_ptr<kvcache::KvTier>> tiers;
  const bool any = config.kv_host_tier_mb > 0 || !config.kv_disk_tier_dir.empty();
  if (any && pool->memory().on_device())
    return NotSupported("kv_host_tier_mb / kv_disk_tier_dir: the KV tiers copy with the host "
                        "for now and need a host pool (backend cpu)");
  const kvcache::BlockKey root = kvcache::RootKey(model.hash(), pool->layout(), /*salt=*/"");
  constexpr uint64_t kMiB = 1 << 20;
  if (config.kv_host_tier_mb > 0) {
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
    KV_ASSIGN_OR_RETURN(o.secret,
                        daemon::ReadTokenFile("kv_tier_secret_file", config.kv_tier_secret_file));
    o.capacity_bytes = uint64_t(config.kv_disk_tier_mb) * kMiB;
    o.max_age_s = config.kv_tier_max_age_s;
    o.erase_at_open = config.kv_disk_tier_erase;
    auto disk = kvcache::DiskTier::Open(o);
    if (!disk.ok()) return disk.status().WithContext("kv_disk_tier_dir");
    tiers.push_back(std::move(disk).value());
  }
  if (!tiers.empty()) {
    KV_LOG_INFO << "KV tiers below the pool:" << (config.kv_host_tier_mb > 0 ? " host " : "")
                << (config.kv_host_tier_mb > 0 ? std::to_string(config.kv_host_tier_mb) + " MiB" : "")
                << (config.kv_disk_tier_dir.empty()
                        ? ""
                        : " disk " + config.kv_disk_tier_dir + " " +
                              std::to_string(config.kv_disk_tier_mb) + " MiB")
                << " (write-through)";
  }
  return std::make_unique<kvcache::TieredCache>(pool, model.hash(), std::move(tiers));
}

}  // namespace kvstream::prefill
