// The shared KV tier (L4, docs/kv_store.md) from a daemon's configuration, for both daemons: the
// prefill reads and writes it below its pool (prefill/kv_tiers.h), the decode writes its
// finished conversations down to it (docs/kv_tiers.md).
//
// Guarantees: null when kv_store_redis is empty. A store that refuses our AUTH is an error
// naming the key; one that is down at start only warns (its reads miss, its writes are dropped,
// counted, until it answers). Every entry carries the identity (root key of `model_hash` and
// `layout`, no salt) and an HMAC keyed by `secret` (kvcache/block_codec.h).
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "daemon/daemon_config.h"
#include "kvcache/tier.h"
#include "model/kv_cache.h"
#include "proto/kvstream.pb.h"

namespace kvstream::daemon {

Result<std::unique_ptr<kvcache::KvTier>> CreateStoreKvTier(const DaemonConfig& config,
                                                           uint64_t model_hash,
                                                           const model::KvLayout& layout,
                                                           const std::string& secret);

// One tier's figures as Stats reports them.
void FillKvTierStats(std::string_view name, const kvcache::TierStats& t,
                     kvstream::v1::KvTierStats* out);

}  // namespace kvstream::daemon
