#include "kvcache/host_tier.h"

#include <algorithm>
#include <cstring>

namespace kvstream::kvcache {

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
    : options_(options),
      block_bytes_(options.layout.block_bytes()),
      slot_bytes_(size_t(options.layout.num_layers) * block_bytes_),
      memory_(std::move(memory)),
      index_({uint64_t(slots) * slot_bytes_, options.low_watermark, options.max_age_s}) {
  free_.reserve(slots);
  for (int i = slots - 1; i >= 0; --i) free_.push_back(i);
  stats_.capacity_bytes = index_.capacity();
}

std::byte* HostTier::SlotPtr(uint64_t slot) const {
  return static_cast<std::byte*>(memory_->data()) + size_t(slot) * slot_bytes_;
}

void HostTier::EraseLocked(const BlockKey& key) {
  if (auto e = index_.Remove(key)) free_.push_back(int(e->slot));
}

bool HostTier::Contains(const BlockKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return index_.Contains(key);
}

Status HostTier::Get(const BlockKey& key, std::span<const std::span<std::byte>> layers) {
  std::lock_guard<std::mutex> lock(mu_);
  const TierIndex::Entry* e = index_.Find(key);
  if (e != nullptr && index_.Expired(*e) && e->refs == 0) {
    EraseLocked(key);
    ++stats_.evicted_blocks;
    e = nullptr;
  }
  if (e == nullptr) {
    ++stats_.miss_blocks;
    return NotFound("host KV tier: block " + KeyHex(key).substr(0, 16) + " not held");
  }
  if (layers.size() != size_t(options_.layout.num_layers)) {
    ++stats_.read_failures;
    return InvalidArgument("host KV tier: wrong number of layers asked for");
  }
  const std::byte* src = SlotPtr(e->slot);
  for (size_t l = 0; l < layers.size(); ++l) {
    if (layers[l].size() != block_bytes_) {
      ++stats_.read_failures;
      return InvalidArgument("host KV tier: a layer buffer of the wrong size");
    }
    std::memcpy(layers[l].data(), src + l * block_bytes_, block_bytes_);
  }
  index_.Touch(key);
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
  if (index_.Find(header.key) != nullptr) {
    index_.Touch(header.key);
    return OkStatus();
  }
  const bool room = index_.Reserve(slot_bytes_, [&](const BlockKey&, const TierIndex::Entry& e) {
    free_.push_back(int(e.slot));
    ++stats_.evicted_blocks;
  });
  if (!room || free_.empty()) {
    if (room) index_.Unreserve(slot_bytes_);
    ++stats_.write_failures;
    return ResourceExhausted("host KV tier: no free slot");
  }
  const int slot = free_.back();
  free_.pop_back();
  std::byte* dst = SlotPtr(slot);
  for (size_t l = 0; l < layers.size(); ++l) std::memcpy(dst + l * block_bytes_, layers[l].data(), block_bytes_);
  index_.Insert(header.key, slot_bytes_, uint64_t(slot), TierIndex::Clock::now());
  ++stats_.written_blocks;
  stats_.bytes_written += slot_bytes_;
  return OkStatus();
}

bool HostTier::Pin(const BlockKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return index_.Ref(key);
}

void HostTier::Unpin(const BlockKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  index_.Unref(key);
}

void HostTier::Erase(const BlockKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  EraseLocked(key);
}

void HostTier::EraseAll() {
  std::lock_guard<std::mutex> lock(mu_);
  index_.Clear([&](const BlockKey&, const TierIndex::Entry& e) { free_.push_back(int(e.slot)); });
}

TierStats HostTier::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  TierStats s = stats_;
  s.entries = index_.entries();
  s.bytes_used = index_.used();
  return s;
}

}  // namespace kvstream::kvcache
