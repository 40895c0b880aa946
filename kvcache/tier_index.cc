#include "kvcache/tier_index.h"

#include <cmath>
#include <cstring>

namespace kvstream::kvcache {

size_t KeyHasher::operator()(const BlockKey& k) const {
  size_t h;
  std::memcpy(&h, k.data(), sizeof(h));  // SHA-256 output: already uniform
  return h;
}

TierIndex::TierIndex(const Options& options)
    : options_([&] {
        Options o = options;
        if (!(o.low_watermark > 0 && o.low_watermark <= 1)) o.low_watermark = 0.9;
        return o;
      }()) {}

const TierIndex::Entry* TierIndex::Find(const BlockKey& key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &it->second.entry;
}

bool TierIndex::Expired(const Entry& e) const {
  return options_.max_age_s > 0 &&
         Clock::now() - e.written > std::chrono::seconds(options_.max_age_s);
}

bool TierIndex::Contains(const BlockKey& key) const {
  const Entry* e = Find(key);
  return e != nullptr && !Expired(*e);
}

void TierIndex::Touch(const BlockKey& key) {
  auto it = index_.find(key);
  if (it != index_.end()) lru_.splice(lru_.begin(), lru_, it->second.lru);
}

template <typename Pred>
uint64_t TierIndex::EvictWhile(Pred pred, const OnEvict& on_evict) {
  uint64_t evicted = 0;
  auto it = lru_.end();
  while (pred() && it != lru_.begin()) {
    --it;
    auto node = index_.find(*it);
    if (node->second.entry.refs > 0) continue;  // in use: stays
    const BlockKey key = *it;
    const Entry e = node->second.entry;
    it = lru_.erase(it);
    index_.erase(node);
    used_ -= e.bytes;
    ++evicted;
    if (on_evict) on_evict(key, e);
  }
  return evicted;
}

bool TierIndex::Reserve(uint64_t bytes, const OnEvict& on_evict) {
  if (used_ + bytes > options_.capacity_bytes) {
    // Down to the low watermark at once, so a full tier does not evict on every write.
    const auto low = static_cast<uint64_t>(
        std::floor(double(options_.capacity_bytes) * options_.low_watermark));
    EvictWhile([&] { return used_ + bytes > low; }, on_evict);
  }
  if (used_ + bytes > options_.capacity_bytes) return false;
  used_ += bytes;
  return true;
}

void TierIndex::Unreserve(uint64_t bytes) { used_ -= bytes; }

bool TierIndex::Insert(const BlockKey& key, uint64_t bytes, uint64_t slot,
                       Clock::time_point written) {
  if (index_.count(key) != 0) {
    used_ -= bytes;
    return false;
  }
  lru_.push_front(key);
  index_.emplace(key, Node{Entry{bytes, slot, written, 0}, lru_.begin()});
  return true;
}

void TierIndex::Restore(const BlockKey& key, uint64_t bytes, uint64_t slot,
                        Clock::time_point written) {
  if (index_.count(key) != 0) return;
  lru_.push_back(key);
  index_.emplace(key, Node{Entry{bytes, slot, written, 0}, std::prev(lru_.end())});
  used_ += bytes;
}

std::optional<TierIndex::Entry> TierIndex::Remove(const BlockKey& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return std::nullopt;
  Entry e = it->second.entry;
  lru_.erase(it->second.lru);
  index_.erase(it);
  used_ -= e.bytes;
  return e;
}

uint64_t TierIndex::EvictDownTo(uint64_t bytes, const OnEvict& on_evict) {
  return EvictWhile([&] { return used_ > bytes; }, on_evict);
}

void TierIndex::Clear(const OnEvict& on_evict) {
  while (!lru_.empty()) {
    const BlockKey key = lru_.back();
    if (auto e = Remove(key); e && on_evict) on_evict(key, *e);
  }
}

bool TierIndex::Ref(const BlockKey& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return false;
  ++it->second.entry.refs;
  return true;
}

void TierIndex::Unref(const BlockKey& key) {
  auto it = index_.find(key);
  if (it != index_.end() && it->second.entry.refs > 0) --it->second.entry.refs;
}

}  // namespace kvstream::kvcache
