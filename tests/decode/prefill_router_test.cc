// decode/prefill_router.h: the rendezvous hash's spread and stickiness, the load-aware
// fallback, prefills going down and coming back moving only their own keys, the route key
// (the tiers' key chain of the first blocks), the choices counted by how they were made.
#include "decode/prefill_router.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>

namespace kvstream::decode {
namespace {

kvcache::BlockKey Root() {
  model::KvLayout layout;
  layout.num_layers = 2;
  layout.num_kv_heads = 2;
  layout.head_dim = 8;
  layout.block_size = 16;
  return kvcache::RootKey(42, layout, "");
}

std::vector<std::string> Peers(int n) {
  std::vector<std::string> p;
  for (int i = 0; i < n; ++i) p.push_back("10.0.0." + std::to_string(i + 1) + ":7000");
  return p;
}

PrefillRouter Router(int n, RoutePolicy policy = RoutePolicy::kPrefix, int slack = 4) {
  return PrefillRouter(policy, Peers(n), Root(), 16, 4, slack);
}

std::vector<PrefillState> AllReady(int n) { return std::vector<PrefillState>(n, {true, 0}); }

std::vector<uint64_t> Keys(int count) {
  std::mt19937_64 rng(7);
  std::vector<uint64_t> k(count);
  for (auto& x : k) x = rng();
  return k;
}

TEST(PrefillRouterTest, ParsesThePolicyNames) {
  EXPECT_EQ(ParseRoutePolicy("prefix").value(), RoutePolicy::kPrefix);
  EXPECT_EQ(ParseRoutePolicy("least_loaded").value(), RoutePolicy::kLeastLoaded);
  for (const char* bad : {"", "Prefix", "random", "prefix ", "least-loaded"})
    EXPECT_FALSE(ParseRoutePolicy(bad).ok()) << bad;
}

TEST(PrefillRouterTest, SpreadsKeysEvenlyOverThePrefills) {
  for (int n : {2, 3, 5, 8}) {
    const PrefillRouter router = Router(n);
    std::vector<int> count(n, 0);
    const int kKeys = 20000;
    for (uint64_t k : Keys(kKeys)) ++count[router.Pick(k, AllReady(n), 0)];
    for (int i = 0; i < n; ++i) {
      EXPECT_NEAR(double(count[i]) / kKeys, 1.0 / n, 0.1 / n) << n << " prefills, #" << i;
    }
  }
}

TEST(PrefillRouterTest, SameKeySamePrefillWhateverTheRotationOrTheListOrder) {
  const PrefillRouter router = Router(5);
  auto reversed = Peers(5);
  std::reverse(reversed.begin(), reversed.end());
  const PrefillRouter other(RoutePolicy::kPrefix, reversed, Root(), 16, 4, 4);
  for (uint64_t k : Keys(500)) {
    const size_t first = router.Pick(k, AllReady(5), 0);
    for (uint64_t rot : {1, 2, 3, 17}) EXPECT_EQ(router.Pick(k, AllReady(5), rot), first);
    // Another decode listing the same prefills in another order picks the same address.
    EXPECT_EQ(4 - other.Pick(k, AllReady(5), 0), first);
  }
}

TEST(PrefillRouterTest, APrefillGoingDownMovesOnlyItsKeysToTheirNextInRank) {
  const int n = 5;
  const PrefillRouter router = Router(n);
  const auto keys = Keys(5000);
  std::vector<size_t> before;
  for (uint64_t k : keys) before.push_back(router.Pick(k, AllReady(n), 0));
  auto states = AllReady(n);
  states[2].ready = false;
  int moved = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const size_t now = router.Pick(keys[i], states, 0);
    EXPECT_NE(now, 2u);
    if (before[i] == 2) {
      ++moved;
      EXPECT_EQ(now, router.Rank(keys[i])[1]);  // its second choice
    } else {
      EXPECT_EQ(now, before[i]) << "a key of a live prefill moved";
    }
  }
  EXPECT_NEAR(double(moved) / keys.size(), 1.0 / n, 0.05);
  // It comes back: every key is where it was.
  for (size_t i = 0; i < keys.size(); ++i)
    EXPECT_EQ(router.Pick(keys[i], AllReady(n), 0), before[i]);
}

TEST(PrefillRouterTest, AddingAPrefillTakesOnlyItsShareFromTheOthers) {
  const PrefillRouter four = Router(4), five = Router(5);  // the same first four addresses
  int moved = 0;
  const auto keys = Keys(5000);
  for (uint64_t k : keys) {
    const size_t a = four.Pick(k, AllReady(4), 0), b = five.Pick(k, AllReady(5), 0);
    if (a != b) {
      ++moved;
      EXPECT_EQ(b, 4u) << "a key moved between two old prefills";
    }
  }
  EXPECT_NEAR(double(moved) / keys.size(), 0.2, 0.05);
}

TEST(PrefillRouterTest, AnOverloadedPrefillPassesItsKeysToTheNextInRankOnly) {
  const int n = 3;
  const PrefillRouter router = Router(n, RoutePolicy::kPrefix, /*slack=*/4);
  for (uint64_t k : Keys(300)) {
    const auto rank = router.Rank(k);
    auto states = AllReady(n);
    states[rank[0]].loads_in_flight = 3;  // below the slack: stays
    EXPECT_EQ(router.Pick(k, states, 0), rank[0]);
    states[rank[0]].loads_in_flight = 4;  // least loaded + slack: passed over
    EXPECT_EQ(router.Pick(k, states, 0), rank[1]);
    states[rank[1]].loads_in_flight = 4;
    EXPECT_EQ(router.Pick(k, states, 0), rank[2]);
    // Every prefill busy alike: the first in rank again.
    for (auto& s : states) s.loads_in_flight = 9;
    EXPECT_EQ(router.Pick(k, states, 0), rank[0]);
  }
}

TEST(PrefillRouterTest, NoneReadyOrNoKeyFallsBackToLoadAndRoundRobin) {
  const int n = 3;
  const PrefillRouter router = Router(n);
  std::vector<PrefillState> states = {{true, 5}, {true, 1}, {false, 0}};
  EXPECT_EQ(router.Pick(std::nullopt, states, 0), 1u);  // no key: least loaded ready
  std::vector<PrefillState> down(n, {false, 0});
  for (uint64_t rot = 0; rot < 6; ++rot) EXPECT_EQ(router.Pick(123, down, rot), rot % n);
  // least_loaded ignores keys; ties go round robin.
  const PrefillRouter ll = Router(n, RoutePolicy::kLeastLoaded);
  std::map<size_t, int> seen;
  for (uint64_t rot = 0; rot < 6; ++rot) ++seen[ll.Pick(ll.RouteKey(std::vector<int32_t>(64, 1)), AllReady(n), rot)];
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_EQ(router.Pick(99, std::vector<PrefillState>{{true, 0}}, 5), 0u);  // one prefill
}

TEST(PrefillRouterTest, CountsEveryChoiceByHowItWasMade) {
  const int n = 3;
  const PrefillRouter router = Router(n, RoutePolicy::kPrefix, /*slack=*/4);
  const uint64_t key = 12345;
  const auto rank = router.Rank(key);
  EXPECT_EQ(router.Pick(key, AllReady(n), 0), rank[0]);  // by prefix, first in rank
  auto states = AllReady(n);
  states[rank[0]].ready = false;  // its prefill down: moved
  EXPECT_EQ(router.Pick(key, states, 0), rank[1]);
  states = AllReady(n);
  states[rank[0]].loads_in_flight = 4;  // overloaded: moved
  EXPECT_EQ(router.Pick(key, states, 0), rank[1]);
  router.Pick(std::nullopt, AllReady(n), 0);                 // no key: by load
  router.Pick(key, std::vector<PrefillState>(n, {false, 0}), 1);  // none ready
  router.Pick(key, std::vector<PrefillState>{{true, 0}}, 0);  // one prefill: no choice
  const RouteStats s = router.stats();
  EXPECT_EQ(s.by_prefix, 3u);
  EXPECT_EQ(s.moved_down, 1u);
  EXPECT_EQ(s.moved_busy, 1u);
  EXPECT_EQ(s.by_load, 1u);
  EXPECT_EQ(s.round_robin, 1u);
  // least_loaded never routes by prefix.
  const PrefillRouter ll = Router(n, RoutePolicy::kLeastLoaded);
  ll.Pick(ll.RouteKey(std::vector<int32_t>(64, 1)), AllReady(n), 0);
  EXPECT_EQ(ll.stats().by_load, 1u);
  EXPECT_EQ(ll.stats().by_prefix, 0u);
}

TEST(PrefillRouterTest, RouteKeyIsTheTiersKeyOfTheFirstBlocks) {
  const PrefillRouter router = Router(3);  // block 16, route_blocks 4
  std::vector<int32_t> turn1(70), turn2;
  for (size_t i = 0; i < turn1.size(); ++i) turn1[i] = int32_t(i * 7 % 500);
  turn2 = turn1;
  for (int i = 0; i < 40; ++i) turn2.push_back(i);
  // Prompts shorter than one block have no key; a conversation's turns share theirs.
  EXPECT_FALSE(router.RouteKey(std::vector<int32_t>(15, 3)).has_value());
  ASSERT_TRUE(router.RouteKey(turn1).has_value());
  EXPECT_EQ(router.RouteKey(turn1), router.RouteKey(turn2));
  // The key is the prefix chain's: block 4's key (first 8 bytes) under the same root.
  const auto chain = kvcache::ChainKeys(Root(), std::span<const int32_t>(turn1).first(64), 16);
  uint64_t want = 0;
  std::memcpy(&want, chain[3].data(), 8);
  EXPECT_EQ(*router.RouteKey(turn1), want);
  // Fewer full blocks than route_blocks: the last full one's key, so it differs from a turn
  // with more (a first turn under route_blocks blocks may move once).
  std::vector<int32_t> short_prompt(turn1.begin(), turn1.begin() + 40);
  std::memcpy(&want, chain[1].data(), 8);
  EXPECT_EQ(*router.RouteKey(short_prompt), want);
  // A token changed in the first blocks changes the key; one after them does not.
  auto changed = turn2;
  changed[10] ^= 1;
  EXPECT_NE(router.RouteKey(changed), router.RouteKey(turn2));
  changed = turn2;
  changed[80] ^= 1;
  EXPECT_EQ(router.RouteKey(changed), router.RouteKey(turn2));
  // Another model (root) gives other keys.
  const PrefillRouter other(RoutePolicy::kPrefix, Peers(3), kvcache::RootKey(43, {}, ""), 16, 4, 4);
  EXPECT_NE(other.RouteKey(turn1), router.RouteKey(turn1));
}

}  // namespace
}  // namespace kvstream::decode
