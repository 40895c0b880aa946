#include "kvcache/host_tier.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kvstream::kvcache {

size_t KeyHasher::operator()(const BlockKey& k) const {
  size_t h;
  std::memcpy(&h, k.data(), sizeof(h));  // SHA-256 output: already uniform
  return h;
}

Result<std::unique_ptr<HostTier>> HostTier::Create(const Options& options,
                                                   std::unique_ptr<model::PoolMemory> memory) {
  const size_t slot = size_t(options.layout.num_layers) * options.layout.block_bytes();
  if (slot == 0) return InvalidArgument("host KV tier: empty layout");
  const size_t bytes = std::min(options.capacity_bytes, memory ? memory->size() : 0);
  const size_t slots = bytes / slot;
  if (slots == 0)
    return InvalidArgument("host KV tier: " + std::to_string(options.capacity_bytes) +
                           " bytes hold no block of " + std::to_string(slot) + " bytes");
  if (slots > (1u << 30)) return InvalidArgument("host KV tier: too many slots");
  return std::unique_ptr<HostTier>(new HostTier(options, std::move(memory), int(slots)));
}

HostTier::HostTier(const Options& options, std::unique_ptr<model::PoolMemory> memory, int slots)
    : options_([&] {
        Options o = options;
        if (!(o.low_watermark > 0 && o.low_watermark <= 1)) o.low_watermark = 0.9;
        return o;
      }()),
      block_bytes_(options.layout.block_bytes()),
      slot_bytes_(size_t(options.layout.num_layers) * block_bytes_),
      memory_(std::move(memory)),
      slots_(slots) {
  free_.reserve(slots);
  for (int i = slots - 1; i >= 0; --i) free_.push_back(i);
  stats_.capacity_bytes = uint64_t(slots) * slot_bytes_;
}

std::byte* HostTier::SlotPtr(int slot) const {
  return static_cast<std::byte*>(memory_->data()) + size_t(slot) * slot_bytes_;
}

bool HostTier::ExpiredLocked(const Entry& e) const {
  return options_.max_age_s > 0 &&
         Clock::now() - e.written > std::chrono::seconds(options_.max_age_s);
}

void HostTier::EraseLocked(const BlockKey& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  free_.push_back(it->second.slot);
  lru_.erase(it->second.lru);
  index_.erase(it);
}

bool HostTier::Contains(const BlockKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(key);
  return it != index_.end() && !ExpiredLocked(it->second);
}

Status HostTier::Get(const BlockKey& key, std::span<const std::span<std::byte>> layers) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(key);
  if (it != index_.end() && ExpiredLocked(it->second)) {
    EraseLocked(key);
    ++stats_.evicted_blocks;
    it = index_.end();
  }
  if (it == index_.end()) {
    ++stats_.miss_blocks;
    return NotFound("host KV tier: block " + KeyHex(key).substr(0, 16) + " not held");
  }
  if (layers.size() != size_t(options_.layout.num_layers)) {
    ++stats_.read_failures;
    return InvalidArgument("host KV tier: wrong number of layers asked for");
  }
  const std::byte* src = SlotPtr(it->second.slot);
  for (size_t l = 0; l < layers.size(); ++l) {
    if (layers[l].size() != block_bytes_) {
      ++stats_.read_failures;
      return InvalidArgument("host KV tier: a layer buffer of the wrong size");
    }
    std::memcpy(layers[l].data(), src + l * block_bytes_, block_bytes_);
  }
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  ++stats_.hit_blocks;
  stats_.bytes_read += slot_bytes_;
  return OkStatus();
}

Status HostTier::Put(const BlockHeader& header, std::span<const std::span<const std::byte>> layers) {
  if (!(header.layout == options_.layout) || layers.size() != size_t(options_.layout.num_layers))
    return InvalidArgument("host KV tier: a block of another layout");
  for (const auto& l : layers)
    if (l.size() != block_bytes_) return InvalidArgument("host KV tier: a layer of the wrong size");
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(header.key);
  if (it != index_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    return OkStatus();
  }
  if (free_.empty()) {
    // Down to the low watermark at once, so a full tier does not evict on every Put.
    const int low = std::max(0, static_cast<int>(std::floor(slots_ * options_.low_watermark)) - 1);
    while (!lru_.empty() && index_.size() > size_t(low)) {
      EraseLocked(lru_.back());
      ++stats_.evicted_blocks;
    }
  }
  if (free_.empty()) {
    ++stats_.write_failures;
    return ResourceExhausted("host KV tier: no free slot");
  }
  const int slot = free_.back();
  free_.pop_back();
  std::byte* dst = SlotPtr(slot);
  for (size_t l = 0; l < layers.size(); ++l) std::memcpy(dst + l * block_bytes_, layers[l].data(), block_bytes_);
  lru_.push_front(header.key);
  index_.emplace(header.key, Entry{slot, Clock::now(), lru_.begin()});
  ++stats_.written_blocks;
  stats_.bytes_written += slot_bytes_;
  return OkStatus();
}

void HostTier::Erase(const BlockKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  EraseLocked(key);
}

void HostTier::EraseAll() {
  std::lock_guard<std::mutex> lock(mu_);
  while (!lru_.empty()) EraseLocked(lru_.back());
}

TierStats HostTier::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  TierStats s = stats_;
  s.entries = index_.size();
  s.bytes_used = uint64_t(index_.size()) * slot_bytes_;
  return s;
}

}  // namespace kvstream::kvcache
