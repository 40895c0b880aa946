#include "transport/staged/slot_ledger.h"

#include <algorithm>

namespace kvstream::transport::staged {

SlotLedger::SlotLedger(uint32_t slots, uint32_t per_writer, Clock::duration quarantine)
    : per_writer_(per_writer), quarantine_(quarantine), slots_(slots) {
  for (uint32_t s = 0; s < slots; ++s) free_.push_back(s);
}

void SlotLedger::GrantTo(uint32_t writer, Writer& w, std::vector<uint32_t>* out) {
  while (w.held < per_writer_ && !free_.empty()) {
    const uint32_t s = free_.front();
    free_.pop_front();
    slots_[s] = Slot{writer, false};
    ++w.held;
    out->push_back(s);
  }
}

std::vector<uint32_t> SlotLedger::AddWriter(uint32_t writer) {
  std::vector<uint32_t> got;
  if (writer == 0 || writers_.count(writer)) return got;
  Writer& w = writers_[writer];
  GrantTo(writer, w, &got);
  if (w.held < per_writer_) waiting_.push_back(writer);
  return got;
}

bool SlotLedger::BeginChunk(uint32_t writer, uint32_t slot) {
  if (slot >= slots_.size() || writer == 0) return false;
  Slot& s = slots_[slot];
  auto it = writers_.find(writer);
  if (s.owner != writer || s.busy || it == writers_.end() || it->second.lost) return false;
  s.busy = true;
  return true;
}

bool SlotLedger::EndChunk(uint32_t slot) {
  if (slot >= slots_.size() || !slots_[slot].busy) return false;
  Slot& s = slots_[slot];
  s.busy = false;
  auto it = writers_.find(s.owner);
  if (it != writers_.end() && !it->second.lost) return true;
  // Owner said goodbye: free now. Owner lost: Reclaim decides.
  if (it == writers_.end()) Free(slot);
  return false;
}

void SlotLedger::Free(uint32_t slot) {
  slots_[slot] = Slot{};
  free_.push_back(slot);
}

std::vector<SlotLedger::Grant> SlotLedger::RemoveWriter(uint32_t writer) {
  auto it = writers_.find(writer);
  if (it == writers_.end()) return {};
  writers_.erase(it);
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), writer), waiting_.end());
  for (uint32_t s = 0; s < slots_.size(); ++s) {
    if (slots_[s].owner == writer && !slots_[s].busy) Free(s);
  }
  return GrantWaiting();
}

void SlotLedger::MarkLost(uint32_t writer, Clock::time_point now) {
  auto it = writers_.find(writer);
  if (it == writers_.end() || it->second.lost) return;
  it->second.lost = true;
  it->second.lost_at = now;
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), writer), waiting_.end());
}

std::vector<SlotLedger::Grant> SlotLedger::Reclaim(Clock::time_point now,
                                                   const std::function<bool(uint32_t)>& exited) {
  for (auto it = writers_.begin(); it != writers_.end();) {
    Writer& w = it->second;
    if (!w.lost) {
      ++it;
      continue;
    }
    const bool safe = now - w.lost_at >= quarantine_ || (exited && exited(it->first));
    if (safe) {
      for (uint32_t s = 0; s < slots_.size(); ++s) {
        if (slots_[s].owner == it->first && !slots_[s].busy) {
          Free(s);
          --w.held;
        }
      }
    }
    if (w.held == 0) {
      it = writers_.erase(it);
    } else {
      ++it;
    }
  }
  return GrantWaiting();
}

std::vector<SlotLedger::Grant> SlotLedger::GrantWaiting() {
  std::vector<Grant> grants;
  while (!waiting_.empty() && !free_.empty()) {
    const uint32_t id = waiting_.front();
    Writer& w = writers_[id];
    std::vector<uint32_t> got;
    GrantTo(id, w, &got);
    for (uint32_t s : got) grants.push_back({id, s});
    if (w.held >= per_writer_) waiting_.pop_front();
  }
  return grants;
}

bool SlotLedger::lost(uint32_t writer) const {
  auto it = writers_.find(writer);
  return it != writers_.end() && it->second.lost;
}

uint32_t SlotLedger::held(uint32_t writer) const {
  auto it = writers_.find(writer);
  return it == writers_.end() ? 0 : it->second.held;
}

uint32_t SlotLedger::busy_slots() const {
  return static_cast<uint32_t>(
      std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.busy; }));
}

std::vector<uint32_t> SlotLedger::writers() const {
  std::vector<uint32_t> out;
  for (const auto& [id, w] : writers_) out.push_back(id);
  return out;
}

std::vector<uint32_t> SlotLedger::lost_writers() const {
  std::vector<uint32_t> out;
  for (const auto& [id, w] : writers_) {
    if (w.lost) out.push_back(id);
  }
  return out;
}

}  // namespace kvstream::transport::staged
