#include "daemon/pool_tier.h"

#include "common/log.h"
#ifdef KVSTREAM_DAEMON_HAVE_GPU_TIER
#include "kvcache/cuda/pinned_tier.h"
#endif

namespace kvstream::daemon {

Result<std::unique_ptr<kvcache::PoolTier>> CreatePoolTier(const DaemonConfig& config,
                                                          model::KvPool* pool) {
  if (config.kv_host_tier_mb <= 0 || !pool->memory().on_device())
    return std::unique_ptr<kvcache::PoolTier>();
#ifdef KVSTREAM_DAEMON_HAVE_GPU_TIER
  kvcache::cuda::PinnedHostTier::Options o;
  o.capacity_bytes = uint64_t(config.kv_host_tier_mb) << 20;
  o.max_age_s = config.kv_tier_max_age_s;
  auto tier = kvcache::cuda::PinnedHostTier::Create(pool, o);
  if (!tier.ok()) return tier.status().WithContext("kv_host_tier_mb");
  KV_LOG_INFO << "KV tier below the GPU pool: pinned host " << config.kv_host_tier_mb
              << " MiB (write-through, fetched layer by layer)";
  return std::unique_ptr<kvcache::PoolTier>(std::move(tier).value());
#else
  return NotSupported("kv_host_tier_mb with a GPU pool: this build has no CUDA");
#endif
}

}  // namespace kvstream::daemon
