// The prefill's KV tiers below its pool from its configuration (docs/kv_tiers.md):
// kv_host_tier_mb (L2, host memory), kv_disk_tier_dir / kv_disk_tier_mb (L3, files keyed by
// kv_tier_secret_file's cluster secret), kv_tier_max_age_s, kv_disk_tier_erase, kv_store_*
// (L4, Redis: docs/kv_store.md).
//
// Guarantees: with none of them set, a TieredCache without tiers (every call a no-op). A disk
// or store tier without a readable secret of at least 16 bytes, an unusable directory, a store
// that refuses our AUTH or a pool on a GPU (the copies are host memcpy for now) is an error
// naming the key, never a silent no-op. A store that is down at start only warns (misses).
#pragma once

#include <memory>

#include "common/status.h"
#include "daemon/daemon_config.h"
#include "kvcache/tiered_cache.h"
#include "model/config.h"

namespace kvstream::prefill {

Result<std::unique_ptr<kvcache::TieredCache>> CreateKvTiers(const daemon::DaemonConfig& config,
                                                            const model::ModelConfig& model,
                                                            model::KvPool* pool);

}  // namespace kvstream::prefill
