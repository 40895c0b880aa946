#include "prefill/prompt_cache.h"

#include <algorithm>

namespace kvstream::prefill {

uint64_t HashTokens(std::span<const int32_t> tokens) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t t : tokens) {
    uint32_t u = static_cast<uint32_t>(t);
    for (int i = 0; i < 4; ++i) {
      h ^= (u >> (8 * i)) & 0xff;
      h *= 0x100000001b3ull;
    }
  }
  return h ^ tokens.size();
}

PromptCache::PromptCache(model::BlockAllocator* allocator, int budget_blocks)
    : allocator_(allocator), budget_(std::max(0, budget_blocks)) {}

PromptCache::~PromptCache() { Clear(/*closing=*/true); }

PromptCache::List::iterator PromptCache::FindLocked(uint64_t hash,
                                                    std::span<const int32_t> tokens) {
  auto [b, e] = index_.equal_range(hash);
  for (auto it = b; it != e; ++it) {
    const Entry& entry = *it->second;
    if (std::equal(entry.tokens.begin(), entry.tokens.end(), tokens.begin(), tokens.end()))
      return it->second;
  }
  return lru_.end();
}

bool PromptCache::InUseLocked(const Entry& e) const {
  // The cache holds one reference per block; more means a write's lease still reads it.
  for (int32_t id : e.ids)
    if (allocator_->refcount(id) > 1) return true;
  return false;
}

void PromptCache::EraseLocked(List::iterator it) {
  auto [b, e] = index_.equal_range(it->hash);
  for (auto i = b; i != e; ++i) {
    if (i->second == it) {
      index_.erase(i);
      break;
    }
  }
  allocator_->Release(it->ids).IgnoreError();
  blocks_ -= static_cast<int>(it->ids.size());
  lru_.erase(it);
}

template <typename Pred>
bool PromptCache::EvictUntilLocked(Pred pred) {
  auto it = lru_.end();
  while (!pred() && it != lru_.begin()) {
    --it;
    if (InUseLocked(*it)) continue;
    auto victim = it++;  // `it` stays valid: it points past the victim
    EraseLocked(victim);
    ++stats_.evictions;
  }
  return pred();
}

std::optional<model::BlockLease> PromptCache::Lookup(std::span<const int32_t> tokens,
                                                     bool count_miss) {
  if (!enabled() || tokens.empty()) return std::nullopt;
  const uint64_t h = HashTokens(tokens);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = FindLocked(h, tokens);
  if (it == lru_.end()) {
    if (count_miss) ++stats_.misses;
    return std::nullopt;
  }
  if (!allocator_->Ref(it->ids).ok()) return std::nullopt;  // cannot happen: the cache holds them
  lru_.splice(lru_.begin(), lru_, it);
  ++stats_.hits;
  return model::BlockLease(allocator_, it->ids);
}

bool PromptCache::Insert(std::span<const int32_t> tokens, const std::vector<int32_t>& ids) {
  const int n = static_cast<int>(ids.size());
  if (!enabled() || tokens.empty() || n == 0 || n > budget_) return false;
  const uint64_t h = HashTokens(tokens);
  std::lock_guard<std::mutex> lock(mu_);
  if (closing_ || FindLocked(h, tokens) != lru_.end()) return false;
  if (!EvictUntilLocked([&] { return blocks_ + n <= budget_; })) return false;
  if (!allocator_->Ref(ids).ok()) return false;
  lru_.push_front(Entry{h, std::vector<int32_t>(tokens.begin(), tokens.end()), ids});
  index_.emplace(h, lru_.begin());
  blocks_ += n;
  ++stats_.inserts;
  return true;
}

int PromptCache::EvictForAllocation(int free_blocks) {
  std::lock_guard<std::mutex> lock(mu_);
  const int before = blocks_;
  EvictUntilLocked([&] { return allocator_->free_count() >= free_blocks; });
  return before - blocks_;
}

void PromptCache::Clear(bool closing) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closing) closing_ = true;
  while (!lru_.empty()) EraseLocked(std::prev(lru_.end()));
}

PromptCache::Stats PromptCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s = stats_;
  s.entries = static_cast<int>(lru_.size());
  s.blocks = blocks_;
  return s;
}

}  // namespace kvstream::prefill
