#include "decode/prefill_router.h"

#include <algorithm>
#include <cstring>

namespace kvstream::decode {
namespace {

// splitmix64's finalizer: a bijection whose output bits each depend on every input bit.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t HashAddress(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a, then mixed
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return Mix(h);
}

}  // namespace

Result<RoutePolicy> ParseRoutePolicy(std::string_view name) {
  if (name == "prefix") return RoutePolicy::kPrefix;
  if (name == "least_loaded") return RoutePolicy::kLeastLoaded;
  return InvalidArgument("prefill_routing must be prefix or least_loaded, got '" +
                         std::string(name) + "'");
}

PrefillRouter::PrefillRouter(RoutePolicy policy, std::vector<std::string> addresses,
                             kvcache::BlockKey root, int block_size, int route_blocks, int slack)
    : policy_(policy),
      root_(root),
      block_size_(std::max(1, block_size)),
      route_blocks_(std::max(1, route_blocks)),
      slack_(std::max(1, slack)) {
  for (const std::string& a : addresses) peer_hash_.push_back(HashAddress(a));
}

std::optional<uint64_t> PrefillRouter::RouteKey(std::span<const int32_t> prefix) const {
  if (policy_ != RoutePolicy::kPrefix) return std::nullopt;
  const size_t full = prefix.size() / size_t(block_size_);
  if (full == 0) return std::nullopt;
  const size_t blocks = std::min(full, size_t(route_blocks_));
  const std::vector<kvcache::BlockKey> keys =
      kvcache::ChainKeys(root_, prefix.first(blocks * size_t(block_size_)), block_size_);
  uint64_t k = 0;
  std::memcpy(&k, keys.back().data(), sizeof(k));
  return k;
}

std::vector<size_t> PrefillRouter::Rank(uint64_t key) const {
  std::vector<std::pair<uint64_t, size_t>> scored;
  for (size_t i = 0; i < peer_hash_.size(); ++i) scored.push_back({Mix(key ^ peer_hash_[i]), i});
  // Highest score first; equal scores (equal addresses) by index.
  std::sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  std::vector<size_t> order;
  for (const auto& s : scored) order.push_back(s.second);
  return order;
}

size_t PrefillRouter::Pick(std::optional<uint64_t> key, std::span<const PrefillState> states,
                           uint64_t rotate) const {
  const size_t n = states.size();
  if (n <= 1) return 0;
  // The least-loaded ready prefill, from a rotating start (ties round robin).
  size_t best = n;
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (rotate + k) % n;
    if (!states[i].ready) continue;
    if (best == n || states[i].loads_in_flight < states[best].loads_in_flight) best = i;
  }
  if (best == n) {  // none ready: round robin (the load retries the handshake)
    round_robin_.fetch_add(1, std::memory_order_relaxed);
    return rotate % n;
  }
  if (key && peer_hash_.size() == n) {
    const int limit = states[best].loads_in_flight + slack_;
    const std::vector<size_t> rank = Rank(*key);
    for (size_t i : rank) {
      if (!states[i].ready || states[i].loads_in_flight >= limit) continue;
      by_prefix_.fetch_add(1, std::memory_order_relaxed);
      if (i != rank.front()) {
        std::atomic<uint64_t>& moved = states[rank.front()].ready ? moved_busy_ : moved_down_;
        moved.fetch_add(1, std::memory_order_relaxed);
      }
      return i;
    }
  }
  by_load_.fetch_add(1, std::memory_order_relaxed);
  return best;
}

RouteStats PrefillRouter::stats() const {
  RouteStats s;
  s.by_prefix = by_prefix_.load(std::memory_order_relaxed);
  s.moved_down = moved_down_.load(std::memory_order_relaxed);
  s.moved_busy = moved_busy_.load(std::memory_order_relaxed);
  s.by_load = by_load_.load(std::memory_order_relaxed);
  s.round_robin = round_robin_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace kvstream::decode
