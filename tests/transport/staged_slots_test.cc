// The host-staged receiver's slot bookkeeping (transport/staged/slot_ledger.h), on the CPU:
// grants, credits going back to their writer, goodbye, and the defect it fixes — a writer that
// dies without a goodbye must not keep its slots (capacity shrinking per lost writer until a
// restart); they come back once idle and safe (process gone, or the quarantine over).
#include "transport/staged/slot_ledger.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace kvstream::transport::staged {
namespace {

using Clock = SlotLedger::Clock;
using std::chrono::seconds;

constexpr uint32_t kSlots = 12;
constexpr uint32_t kPerWriter = 6;

std::vector<uint32_t> Slots(const std::vector<SlotLedger::Grant>& g, uint32_t writer) {
  std::vector<uint32_t> out;
  for (const auto& x : g) {
    if (x.writer == writer) out.push_back(x.slot);
  }
  return out;
}

TEST(SlotLedger, GrantsUpToPerWriterAndQueuesTheRest) {
  SlotLedger l(kSlots, kPerWriter, seconds(2));
  EXPECT_EQ(l.AddWriter(1).size(), kPerWriter);
  EXPECT_EQ(l.AddWriter(2).size(), kPerWriter);
  EXPECT_TRUE(l.AddWriter(3).empty());  // nothing left: waits
  EXPECT_EQ(l.free_slots(), 0u);
  EXPECT_TRUE(l.AddWriter(0).empty());  // bad id
  EXPECT_TRUE(l.AddWriter(1).empty());  // known id
  EXPECT_EQ(l.held(1), kPerWriter);
  // Writer 1 leaves: writer 3 gets its slots.
  auto g = l.RemoveWriter(1);
  EXPECT_EQ(Slots(g, 3).size(), kPerWriter);
  EXPECT_EQ(l.held(3), kPerWriter);
  EXPECT_FALSE(l.known(1));
}

TEST(SlotLedger, ChunksOnlyInOwnIdleSlotsAndCreditsGoBack) {
  SlotLedger l(kSlots, kPerWriter, seconds(2));
  auto a = l.AddWriter(7);
  auto b = l.AddWriter(8);
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  EXPECT_FALSE(l.BeginChunk(7, b[0]));  // someone else's slot
  EXPECT_FALSE(l.BeginChunk(9, a[0]));  // unknown writer
  EXPECT_FALSE(l.BeginChunk(7, kSlots)); // out of range
  EXPECT_TRUE(l.BeginChunk(7, a[0]));
  EXPECT_FALSE(l.BeginChunk(7, a[0]));  // already busy
  EXPECT_EQ(l.busy_slots(), 1u);
  EXPECT_TRUE(l.EndChunk(a[0]));        // credit back to writer 7
  EXPECT_FALSE(l.EndChunk(a[0]));       // not busy any more
  EXPECT_TRUE(l.BeginChunk(7, a[0]));   // reusable by its owner
}

TEST(SlotLedger, GoodbyeFreesBusySlotsWhenTheirCopyEnds) {
  SlotLedger l(kSlots, kPerWriter, seconds(2));
  auto a = l.AddWriter(1);
  l.AddWriter(2);
  EXPECT_TRUE(l.AddWriter(3).empty());
  ASSERT_TRUE(l.BeginChunk(1, a[0]));
  auto g = l.RemoveWriter(1);
  EXPECT_EQ(Slots(g, 3).size(), kPerWriter - 1);  // the busy slot is not free yet
  EXPECT_FALSE(l.EndChunk(a[0]));                   // owner gone: freed, no credit
  EXPECT_EQ(l.free_slots(), 1u);
  g = l.Reclaim(Clock::now(), nullptr);              // hands it to the waiting writer
  EXPECT_EQ(Slots(g, 3), std::vector<uint32_t>{a[0]});
  EXPECT_EQ(l.held(3), kPerWriter);
}

// The defect: writers killed without a goodbye kept their slots forever; after two of them a
// third writer got nothing. Now their slots return after the quarantine.
TEST(SlotLedger, LostWritersSlotsComeBackAfterTheQuarantine) {
  SlotLedger l(kSlots, kPerWriter, seconds(2));
  const auto t0 = Clock::now();
  l.AddWriter(1);
  l.AddWriter(2);
  l.MarkLost(1, t0);
  l.MarkLost(2, t0);
  EXPECT_TRUE(l.lost(1));
  auto never = [](uint32_t) { return false; };
  EXPECT_TRUE(l.Reclaim(t0 + seconds(1), never).empty());  // still in quarantine
  EXPECT_EQ(l.free_slots(), 0u);
  EXPECT_TRUE(l.AddWriter(3).empty());                      // waits
  auto g = l.Reclaim(t0 + seconds(2), never);
  EXPECT_EQ(Slots(g, 3).size(), kPerWriter);
  EXPECT_EQ(l.free_slots(), kSlots - kPerWriter);
  EXPECT_FALSE(l.known(1));
  EXPECT_FALSE(l.known(2));
  EXPECT_EQ(l.AddWriter(4).size(), kPerWriter);  // full capacity again
  // Many writers lost in turn never shrink the pool.
  for (uint32_t id = 10; id < 40; ++id) {
    l.RemoveWriter(4);
    ASSERT_EQ(l.AddWriter(id).size(), kPerWriter) << id;
    l.MarkLost(id, t0);
    l.Reclaim(t0 + seconds(3), never);
    ASSERT_EQ(l.free_slots(), kSlots - kPerWriter) << id;
    l.AddWriter(4);
  }
}

TEST(SlotLedger, ExitedWriterIsReclaimedAtOnceButNotItsBusySlots) {
  SlotLedger l(kSlots, kPerWriter, seconds(60));
  const auto t0 = Clock::now();
  auto a = l.AddWriter(5);
  ASSERT_TRUE(l.BeginChunk(5, a[1]));
  l.MarkLost(5, t0);
  EXPECT_FALSE(l.BeginChunk(5, a[2]));  // a lost writer's chunks are dropped
  std::set<uint32_t> asked;
  auto exited = [&](uint32_t w) {
    asked.insert(w);
    return true;
  };
  l.Reclaim(t0, exited);
  EXPECT_EQ(asked, std::set<uint32_t>{5});
  EXPECT_EQ(l.free_slots(), kSlots - 1);  // the busy slot stays until its copy ends
  EXPECT_EQ(l.held(5), 1u);
  EXPECT_FALSE(l.EndChunk(a[1]));          // no credit to a lost writer
  EXPECT_EQ(l.free_slots(), kSlots - 1);  // ... and freed only by Reclaim
  l.Reclaim(t0, exited);
  EXPECT_EQ(l.free_slots(), kSlots);
  EXPECT_FALSE(l.known(5));
  EXPECT_EQ(l.busy_slots(), 0u);
}

TEST(SlotLedger, LostWriterAliveKeepsSlotsUntilQuarantineEnds) {
  SlotLedger l(kSlots, kPerWriter, seconds(2));
  const auto t0 = Clock::now();
  l.AddWriter(5);
  l.MarkLost(5, t0);
  l.MarkLost(5, t0 + seconds(10));  // a second report does not restart (or move) the clock
  auto alive = [](uint32_t) { return false; };
  l.Reclaim(t0 + seconds(1), alive);
  EXPECT_EQ(l.held(5), kPerWriter);
  l.Reclaim(t0 + seconds(2), alive);
  EXPECT_EQ(l.held(5), 0u);
  EXPECT_EQ(l.free_slots(), kSlots);
}

TEST(SlotLedger, EverySlotAccountedForUnderRandomChurn) {
  SlotLedger l(kSlots, 4, seconds(1));
  auto t = Clock::now();
  uint64_t x = 12345;
  auto rnd = [&] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  uint32_t next_id = 1;
  std::map<uint32_t, std::set<uint32_t>> busy;  // writer -> busy slots, as the receiver sees it
  for (int step = 0; step < 5000; ++step) {
    t += std::chrono::milliseconds(rnd() % 300);
    switch (rnd() % 6) {
      case 0:
        l.AddWriter(next_id++);
        break;
      case 1: {  // a chunk in some slot the writer holds
        auto ws = l.writers();
        if (ws.empty()) break;
        uint32_t w = ws[rnd() % ws.size()];
        uint32_t s = static_cast<uint32_t>(rnd() % kSlots);
        if (l.BeginChunk(w, s)) busy[w].insert(s);
        break;
      }
      case 2: {  // a copy ends
        if (busy.empty()) break;
        auto it = busy.begin();
        std::advance(it, static_cast<long>(rnd() % busy.size()));
        uint32_t s = *it->second.begin();
        l.EndChunk(s);
        it->second.erase(s);
        if (it->second.empty()) busy.erase(it);
        break;
      }
      case 3: {
        auto ws = l.writers();
        if (!ws.empty()) l.MarkLost(ws[rnd() % ws.size()], t);
        break;
      }
      case 4: {  // goodbye only from a live writer with nothing busy (as the protocol does)
        auto ws = l.writers();
        if (ws.empty()) break;
        uint32_t w = ws[rnd() % ws.size()];
        if (!l.lost(w) && !busy.count(w)) l.RemoveWriter(w);
        break;
      }
      default:
        l.Reclaim(t, [&](uint32_t w) { return w % 3 == 0; });
    }
    uint32_t held = 0;
    for (uint32_t w : l.writers()) held += l.held(w);
    ASSERT_EQ(held + l.free_slots(), kSlots) << "step " << step;
  }
  // Everyone goes away: every slot comes back.
  for (auto& [w, ss] : busy) {
    for (uint32_t s : ss) l.EndChunk(s);
  }
  for (uint32_t w : l.writers()) l.MarkLost(w, t);
  l.Reclaim(t + seconds(1), nullptr);
  EXPECT_EQ(l.free_slots(), kSlots);
  EXPECT_TRUE(l.writers().empty());
}

}  // namespace
}  // namespace kvstream::transport::staged
