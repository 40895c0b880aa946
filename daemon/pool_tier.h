// The pinned host tier below a GPU KV pool (kvcache/cuda/pinned_tier.h, docs/kv_tiers.md "The GPU
// path") from a daemon's configuration, for both daemons: the prefill's L2 (and the staging of
// its disk and store tiers), the decode's staging of finished conversations on their way down to
// the shared tier.
//
// Guarantees: null when kv_host_tier_mb is 0 or the pool is in host memory; kNotSupported in a
// build without CUDA; an allocation that fails is an error naming the key. The tier must go
// before the pool, and after every cache staged through it has stopped.
#pragma once

#include <memory>

#include "common/status.h"
#include "daemon/daemon_config.h"
#include "kvcache/pool_tier.h"
#include "model/kv_cache.h"

namespace kvstream::daemon {

Result<std::unique_ptr<kvcache::PoolTier>> CreatePoolTier(const DaemonConfig& config,
                                                          model::KvPool* pool);

}  // namespace kvstream::daemon
