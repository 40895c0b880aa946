#include "kvcache/store_tier.h"

#include <cstring>

#include "common/log.h"

namespace kvstream::kvcache {

StoreTier::StoreTier(StoreTierOptions options) : options_(std::move(options)) {}

Result<std::unique_ptr<StoreTier>> StoreTier::Open(StoreTierOptions options) {
  if (options.secret.size() < kMinSecretBytes)
    return InvalidArgument("kv store: the cluster secret must be at least " +
                           std::to_string(kMinSecretBytes) + " bytes");
  options.redis.verify = nullptr;  // Read() decodes (and so verifies) each entry once
  std::unique_ptr<StoreTier> tier(new StoreTier(std::move(options)));
  KV_ASSIGN_OR_RETURN(tier->store_, RedisStore::Open(tier->options_.redis));
  tier->writer_ = std::thread([t = tier.get()] { t->WriterLoop(); });
  return tier;
}

StoreTier::~StoreTier() {
  if (!Flush(DeadlineAfter(options_.flush_on_close))) {
    KV_LOG_WARN << "kv store: " << stats().pending_blocks
                << " blocks not written down at shutdown (dropped)";
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
}

bool StoreTier::Write(const BlockHeader& header, std::vector<std::byte> payload) {
  const size_t expected = static_cast<size_t>(header.layout.num_layers) * header.layout.block_bytes();
  if (!(header.layout == options_.identity.layout) || header.root != options_.identity.root ||
      payload.size() != expected) {
    dropped_blocks_++;
    return false;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ || pending_bytes_ + payload.size() > options_.max_pending_bytes) {
      dropped_blocks_++;
      return false;
    }
    pending_bytes_ += payload.size();
    queue_.push_back(Pending{header, std::move(payload)});
  }
  cv_.notify_one();
  return true;
}

void StoreTier::WriterLoop() {
  constexpr size_t kBatch = 64;
  while (true) {
    std::vector<Pending> batch;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping
      while (!queue_.empty() && batch.size() < kBatch) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      writing_ = true;
    }
    std::vector<std::string> keys;
    for (const Pending& p : batch) keys.push_back(StoreKey(p.header.key));
    Status status;
    const std::vector<bool> present = store_->Exists(keys, &status);
    for (size_t i = 0; i < batch.size(); ++i) {
      Pending& p = batch[i];
      if (present[i]) {
        skipped_present_++;
        continue;
      }
      std::vector<std::span<const std::byte>> layers;
      const size_t per_layer = p.header.layout.block_bytes();
      for (int l = 0; l < p.header.layout.num_layers; ++l)
        layers.emplace_back(p.payload.data() + per_layer * l, per_layer);
      auto encoded = EncodeBlock(p.header, layers, options_.secret);
      Status st = encoded.status();
      if (st.ok())
        st = store_->Put(keys[i], std::string_view(reinterpret_cast<const char*>(encoded->data()),
                                                   encoded->size()));
      if (st.ok()) {
        written_blocks_++;
        written_bytes_ += encoded->size();
      } else {
        write_failures_++;
        KV_LOG_DEBUG << "kv store: a block not written down: " << st.ToString();
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const Pending& p : batch) pending_bytes_ -= p.payload.size();
      writing_ = false;
    }
    idle_cv_.notify_all();
  }
}

bool StoreTier::Flush(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_cv_.wait_until(lock, deadline, [&] { return queue_.empty() && !writing_; });
}

std::vector<bool> StoreTier::Present(std::span<const BlockKey> keys) {
  std::vector<std::string> k;
  k.reserve(keys.size());
  for (const BlockKey& key : keys) k.push_back(StoreKey(key));
  return store_->Exists(k);
}

std::optional<std::vector<std::byte>> StoreTier::Read(const BlockKey& key) {
  auto got = store_->Get(StoreKey(key));
  if (!got.ok() || !got->has_value()) {
    read_misses_++;
    return std::nullopt;
  }
  const std::string& value = **got;
  const DecodedBlock d = DecodeBlock(std::as_bytes(std::span(value.data(), value.size())),
                                     options_.identity, &key, options_.secret);
  if (!d.ok()) {
    read_misses_++;
    verify_failures_++;
    KV_LOG_WARN << "kv store: block " << KeyHex(key) << " refused: " << d.message;
    return std::nullopt;
  }
  read_hits_++;
  read_bytes_ += value.size();
  return std::vector<std::byte>(d.payload.begin(), d.payload.end());
}

StoreTierStats StoreTier::stats() const {
  StoreTierStats s;
  s.written_blocks = written_blocks_, s.written_bytes = written_bytes_;
  s.skipped_present = skipped_present_, s.dropped_blocks = dropped_blocks_;
  s.write_failures = write_failures_, s.read_hits = read_hits_, s.read_misses = read_misses_;
  s.read_bytes = read_bytes_, s.verify_failures = verify_failures_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s.pending_blocks = queue_.size() + (writing_ ? 1 : 0);
  }
  s.redis = store_->stats();
  return s;
}

Status StoreKvTier::Get(const BlockKey& key, std::span<const std::span<std::byte>> layers) {
  const model::KvLayout& layout = store_->identity().layout;
  if (layers.size() != size_t(layout.num_layers))
    return InvalidArgument("store KV tier: wrong number of layers asked for");
  for (const auto& l : layers)
    if (l.size() != layout.block_bytes())
      return InvalidArgument("store KV tier: a layer buffer of the wrong size");
  std::optional<std::vector<std::byte>> payload = store_->Read(key);
  if (!payload) return NotFound("store KV tier: block " + KeyHex(key).substr(0, 16) + " not read");
  for (size_t l = 0; l < layers.size(); ++l)
    std::memcpy(layers[l].data(), payload->data() + l * layout.block_bytes(), layout.block_bytes());
  return OkStatus();
}

Status StoreKvTier::Put(const BlockHeader& header,
                        std::span<const std::span<const std::byte>> layers) {
  std::vector<std::byte> payload;
  for (const auto& l : layers) payload.insert(payload.end(), l.begin(), l.end());
  if (!store_->Write(header, std::move(payload)))
    return ResourceExhausted("store KV tier: block dropped (queue full or another layout)");
  return OkStatus();
}

void StoreKvTier::EraseAll() {
  auto erased = store_->EraseAll();
  if (!erased.ok()) {
    KV_LOG_WARN << "kv store: erase-everything failed: " << erased.status().ToString();
  }
}

TierStats StoreKvTier::stats() const {
  const StoreTierStats s = store_->stats();
  TierStats t;
  t.hit_blocks = s.read_hits;
  t.read_failures = s.verify_failures;
  t.miss_blocks = s.read_misses - s.verify_failures;
  t.bytes_read = s.read_bytes;
  t.bytes_written = s.written_bytes;
  t.written_blocks = s.written_blocks;
  t.write_failures = s.write_failures + s.dropped_blocks;
  return t;
}

}  // namespace kvstream::kvcache
