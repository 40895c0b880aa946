#include "decode/kv_tiers.h"

#include <algorithm>

#include "common/log.h"

namespace kvstream::decode {

TierLoad LoadPrefixFromTiers(kvcache::TieredCache* tiers, kvcache::PoolTier* staging,
                             model::KvPool* pool, const kvcache::BlockKey& root,
                             std::span<const int32_t> tokens, std::vector<int32_t>* ids,
                             Deadline deadline) {
  TierLoad out;
  if (tiers == nullptr || !tiers->enabled() || tokens.empty()) return out;
  kvcache::TieredCache::PendingPtr pending = tiers->Prepare(root, tokens, 0, deadline);
  if (!pending) return out;
  model::BlockAllocator& alloc = pool->allocator();
  const size_t need = ids->size();
  // The admitted blocks make room for the loaded ones: the tiers allocate fresh blocks.
  auto make_room = [&](int n) {
    const size_t k = std::min(ids->size(), size_t(std::max(n, 0)));
    if (k == 0) return;
    std::vector<int32_t> back(ids->end() - std::ptrdiff_t(k), ids->end());
    ids->resize(ids->size() - k);
    alloc.Release(back).IgnoreError();
  };
  model::BlockLease loaded(&alloc, {});
  if (staging != nullptr) {
    out.prefetch = tiers->FillFrom(staging, pending.get(), tokens, 0, &loaded, make_room);
    out.tokens = out.prefetch ? out.prefetch->tokens() : 0;
  } else {
    out.tokens = tiers->Fill(pending.get(), 0, &loaded, make_room);
  }
  pending.reset();  // the tiers' entries unpinned
  const int bs = pool->layout().block_size;
  if (out.tokens < static_cast<int>(tokens.size())) out.tokens -= out.tokens % bs;
  // The request's blocks: the loaded ones first, then admitted ones, `need` in all.
  std::vector<int32_t> blocks = loaded.ids();
  size_t take = blocks.size() < need ? std::min(need - blocks.size(), ids->size()) : 0;
  blocks.insert(blocks.end(), ids->begin(), ids->begin() + std::ptrdiff_t(take));
  if (blocks.size() < need) {  // the pool gave the room made to another request meanwhile
    auto more = alloc.Allocate(static_cast<int>(need - blocks.size()));
    if (!more.ok()) {
      // Keep the admitted blocks left, refill them to `need` with the loaded ones: the loaded
      // KV is not used, and no copy may still write into blocks the prefill will write.
      if (out.prefetch) out.prefetch->WaitAll().IgnoreError();
      KV_LOG_DEBUG << "decode tier load dropped: the pool is short of "
                   << need - blocks.size() << " blocks";
      std::vector<int32_t> mine(ids->begin(), ids->end());
      for (int32_t b : loaded.ids()) {
        if (mine.size() >= need) break;
        mine.push_back(b);
      }
      alloc.Ref(std::vector<int32_t>(mine.begin() + std::ptrdiff_t(ids->size()), mine.end()))
          .IgnoreError();
      *ids = std::move(mine);
      out.tokens = 0;
      out.prefetch.reset();
      return out;  // `loaded` releases its references (those not kept gain none)
    }
    blocks.insert(blocks.end(), more->begin(), more->end());
    take = ids->size();  // every admitted block is kept
  }
  // Admitted blocks beyond `need` go back; the loaded ones change hands to the request.
  std::vector<int32_t> surplus(ids->begin() + std::ptrdiff_t(take), ids->end());
  if (!surplus.empty()) alloc.Release(surplus).IgnoreError();
  if (blocks.size() > need) {  // the tiers filled more than the request holds (cannot: tokens < need)
    alloc.Release(std::vector<int32_t>(blocks.begin() + std::ptrdiff_t(need), blocks.end()))
        .IgnoreError();
    blocks.resize(need);
  }
  alloc.Ref(loaded.ids()).IgnoreError();
  *ids = std::move(blocks);
  return out;  // `loaded` drops its own references: the request holds one per block
}

void WriteDownConversation(kvcache::TieredCache* tiers, kvcache::PoolTier* staging,
                           const kvcache::BlockKey& root, int block_size,
                           std::vector<int32_t> tokens, int cached,
                           const std::vector<int32_t>& blocks) {
  if (tiers == nullptr || block_size <= 0 || cached <= 0) return;
  const size_t full = size_t(cached / block_size);
  if (full == 0 || full > blocks.size() || tokens.size() < full * size_t(block_size)) return;
  tokens.resize(full * size_t(block_size));
  std::vector<int32_t> ids(blocks.begin(), blocks.begin() + std::ptrdiff_t(full));
  if (staging == nullptr) {
    tiers->WriteDown(root, tokens, ids);
    return;
  }
  staging->WriteDown(root, tokens, ids,
                     [tiers, root, tokens] { tiers->WriteStaged(root, tokens); });
}

}  // namespace kvstream::decode
