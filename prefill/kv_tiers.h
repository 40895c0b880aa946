// The prefill's KV tiers below its pool from its configuration (docs/kv_tiers.md):
// kv_host_tier_mb (L2, host memory), kv_disk_tier_dir / kv_disk_tier_mb (L3, files keyed by
// kv_tier_secret_file's cluster secret), kv_tier_max_age_s, kv_disk_tier_erase, kv_store_*
// (L4, Redis: docs/kv_store.md). kv_tier_write_policy is the server's (prefill_server.h).
//
// Guarantees: with none of them set, a TieredCache without tiers (every call a no-op). A disk
// or store tier without a readable secret of at least 16 bytes, an unusable directory, a store
// that refuses our AUTH or a disk or store tier over a pool on a GPU without a pinned host tier
// is an error naming the key, never a silent no-op. A store that is down at start only warns
// (misses). With a pool on a GPU, kv_host_tier_mb is the pinned host tier of
// daemon::CreatePoolTier (daemon/pool_tier.h) instead, passed here as `pool_tier`: the cache is
// then staged through it (first tier: its staging view; kvcache/tiered_cache.h), and the
// server must stop the cache before the pool tier goes.
#pragma once

#include <memory>

#include "common/status.h"
#include "daemon/daemon_config.h"
#include "kvcache/pool_tier.h"
#include "kvcache/tiered_cache.h"
#include "model/config.h"

namespace kvstream::prefill {

Result<std::unique_ptr<kvcache::TieredCache>> CreateKvTiers(const daemon::DaemonConfig& config,
                                                            const model::ModelConfig& model,
                                                            model::KvPool* pool,
                                                            kvcache::PoolTier* pool_tier = nullptr);

}  // namespace kvstream::prefill
