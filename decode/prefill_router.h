// Which prefill daemon a request's KV load goes to, when the decode has several (--peer a,b,...).
//
// kLeastLoaded: the ready prefill with the fewest loads in flight (ties go round robin from
// `rotate`).
// kPrefix (the default): the prefill most likely to hold the prompt's prefix. The route key is
// the prefix-directory key (kvcache/prefix_key.h, the chain the tiers use) of the prompt's
// min(route_blocks, full blocks)-th block, so every turn of a conversation (and every prompt
// starting with the same route_blocks blocks) has the same key. The prefills are ranked for
// that key by rendezvous (highest random weight) hashing of (key, address): the first in that
// order that is ready and not overloaded takes the load. Overloaded: its loads in flight are at
// least the least-loaded ready prefill's + slack. Guarantees:
//  - The same key and the same set of ready, not overloaded prefills give the same prefill, in
//    every decode given the same addresses (in any order).
//  - A prefill going down (or becoming overloaded) moves only the keys it ranked first, each to
//    its next in rank; one coming back takes back exactly those.
//  - A prefix with no full block has no key: least loaded. No prefill ready: rotate % n.
//  - Every choice among several prefills is counted (stats(), thread-safe): by prefix (and of
//    those, moved off the first-ranked prefill because it was not ready or overloaded), by
//    load, round robin.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "kvcache/prefix_key.h"

namespace kvstream::decode {

enum class RoutePolicy { kPrefix, kLeastLoaded };
// "prefix" | "least_loaded".
Result<RoutePolicy> ParseRoutePolicy(std::string_view name);

struct PrefillState {
  bool ready = false;      // its last handshake is valid
  int loads_in_flight = 0;
};

// Choices of Pick among several prefills, since the router was made.
struct RouteStats {
  uint64_t by_prefix = 0;    // to the first ready, not overloaded prefill in the key's rank
  uint64_t moved_down = 0;   // of by_prefix: the first-ranked prefill was not ready
  uint64_t moved_busy = 0;   // of by_prefix: the first-ranked prefill was overloaded
  uint64_t by_load = 0;      // no key: the least loaded ready prefill
  uint64_t round_robin = 0;  // no prefill ready
};

class PrefillRouter {
 public:
  // `addresses`: the prefills, as --peer lists them (at least one). `root`: the key chain's root
  // (kvcache::RootKey of the model and layout, as the prefill computes it). route_blocks >= 1,
  // slack >= 1, block_size >= 1.
  PrefillRouter(RoutePolicy policy, std::vector<std::string> addresses, kvcache::BlockKey root,
                int block_size, int route_blocks, int slack);

  RoutePolicy policy() const { return policy_; }
  // The route key of a request whose prefill computes `prefix` (nullopt: no full block, or the
  // least_loaded policy).
  std::optional<uint64_t> RouteKey(std::span<const int32_t> prefix) const;
  // The index of the prefill for a request with `key`; states[i] is addresses[i]'s.
  size_t Pick(std::optional<uint64_t> key, std::span<const PrefillState> states,
              uint64_t rotate) const;
  // The prefills' indices in rendezvous order for `key`, best first.
  std::vector<size_t> Rank(uint64_t key) const;
  RouteStats stats() const;

 private:
  RoutePolicy policy_;
  std::vector<uint64_t> peer_hash_;  // one per address
  kvcache::BlockKey root_;
  int block_size_;
  int route_blocks_;
  int slack_;
  mutable std::atomic<uint64_t> by_prefix_{0}, moved_down_{0}, moved_busy_{0}, by_load_{0},
      round_robin_{0};
};

}  // namespace kvstream::decode
