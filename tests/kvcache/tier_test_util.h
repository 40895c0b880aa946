// Shared by the KV tier unit tests: a small KV layout, a host tier of so many blocks of it, and a
// tier wrapper whose Puts can be held (GatedTier).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>

#include "kvcache/host_tier.h"

namespace kvstream::kvcache::testing {

inline model::KvLayout Layout() {
  model::KvLayout l;
  l.num_layers = 2;
  l.num_kv_heads = 1;
  l.head_dim = 4;
  l.block_size = 4;
  return l;
}

inline std::unique_ptr<HostTier> Host(int blocks, int64_t max_age_s = 0) {
  HostTier::Options o;
  o.layout = Layout();
  o.capacity_bytes = size_t(blocks) * Layout().num_layers * Layout().block_bytes();
  o.max_age_s = max_age_s;
  auto mem = model::AllocateHostPoolMemory(o.capacity_bytes);
  EXPECT_TRUE(mem.ok());
  auto t = HostTier::Create(o, std::move(mem).value());
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return std::move(t).value();
}

// Wraps a tier: counts the Puts in flight (and the most at once) and holds them while closed.
class GatedTier final : public KvTier {
 public:
  explicit GatedTier(std::unique_ptr<KvTier> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return inner_->name(); }
  bool slow() const override { return inner_->slow(); }
  bool Contains(const BlockKey& k) override { return inner_->Contains(k); }
  Status Get(const BlockKey& k, std::span<const std::span<std::byte>> layers) override {
    return inner_->Get(k, layers);
  }
  Status Put(const BlockHeader& h, std::span<const std::span<const std::byte>> layers) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++entered_;
      max_in_flight_ = std::max(max_in_flight_, ++in_flight_);
      cv_.notify_all();
      cv_.wait(lock, [&] { return open_; });
    }
    Status s = inner_->Put(h, layers);
    std::lock_guard<std::mutex> lock(mu_);
    --in_flight_;
    return s;
  }
  bool Pin(const BlockKey& k) override { return inner_->Pin(k); }
  void Unpin(const BlockKey& k) override { inner_->Unpin(k); }
  void Erase(const BlockKey& k) override { inner_->Erase(k); }
  void EraseAll() override { inner_->EraseAll(); }
  TierStats stats() const override { return inner_->stats(); }

  void SetOpen(bool open) {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = open;
    cv_.notify_all();
  }
  bool WaitEntered(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return entered_ >= n; });
  }
  int entered() {
    std::lock_guard<std::mutex> lock(mu_);
    return entered_;
  }
  int max_in_flight() {
    std::lock_guard<std::mutex> lock(mu_);
    return max_in_flight_;
  }

 private:
  std::unique_ptr<KvTier> inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
  int entered_ = 0, in_flight_ = 0, max_in_flight_ = 0;
};

}  // namespace kvstream::kvcache::testing
