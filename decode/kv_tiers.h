// The decode's use of its KV tiers (docs/kv_tiers.md): the shared store, staged through a pinned
// host tier on a GPU pool.
//  - LoadPrefixFromTiers: before the prefill is asked, the blocks of the prompt found in the
//    tiers are loaded into the request's own blocks, and the prefill is told to write only the
//    rest (PrefillRequest.skip_blocks).
//  - WriteDownConversation: a finished conversation (prompt and answer) written down, so that
//    the next turn's prefix, the answer included, is found there.
//
// Guarantees of LoadPrefixFromTiers:
//  - The request ends up with exactly as many blocks as it was admitted with: the first
//    `tokens / block_size` of them hold the loaded prefix (whole, verified blocks only: a read
//    that fails or comes late is a miss, never KV of other tokens), the others are fresh. The
//    loaded blocks are the admitted ones given back and taken again (make_room), or free blocks
//    of the pool, with the surplus admitted blocks returned; when the pool ran short of the
//    difference the load is dropped (tokens = 0) rather than the request failing.
//  - On a GPU pool the copies from the pinned tier are still in flight on return: `prefetch`
//    says, layer by layer, when they have landed (the first step waits for them on the GPU); the
//    pinned tier holds its own references on the blocks until its copies complete, so a request
//    that ends early never frees a block a copy still writes.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/time.h"
#include "kvcache/pool_tier.h"
#include "kvcache/tiered_cache.h"
#include "model/kv_cache.h"

namespace kvstream::decode {

struct TierLoad {
  int tokens = 0;  // prompt tokens whose KV the first blocks hold (0: nothing loaded)
  std::unique_ptr<kvcache::PoolPrefetch> prefetch;  // GPU pool: the copies in flight
};

// `ids`: the request's admitted blocks (its whole allocation), in order; replaced by the
// request's blocks afterwards (same count). `tokens`: the tokens whose KV the request loads
// (the prompt but its last token). `staging`: the pinned tier `tiers` is staged through (GPU
// pools), else null.
TierLoad LoadPrefixFromTiers(kvcache::TieredCache* tiers, kvcache::PoolTier* staging,
                             model::KvPool* pool, const kvcache::BlockKey& root,
                             std::span<const int32_t> tokens, std::vector<int32_t>* ids,
                             Deadline deadline);

// Queues (never waits) the write-down of `tokens` (prompt, then answer) whose first `cached`
// tokens' KV is in blocks[0...]: full blocks only (a partial block no next turn matches). The
// tiers take references of their own on the blocks; with `staging` the blocks go to it on the
// GPU first, then from it to the slower tiers once that copy is complete.
void WriteDownConversation(kvcache::TieredCache* tiers, kvcache::PoolTier* staging,
                           const kvcache::BlockKey& root, int block_size,
                           std::vector<int32_t> tokens, int cached,
                           const std::vector<int32_t>& blocks);

}  // namespace kvstream::decode
