// The host-staged receiver's bookkeeping of its staging slots (transport/staged/): which writer
// each slot is granted to, which slots hold a chunk being copied to the device, and when the
// slots of a writer that went away may be handed to another. No CUDA, no UCX: the receiver
// thread drives it (single-threaded; not thread-safe), and it is tested on the CPU.
//
// Slot life: free -> granted to a writer (a credit) -> busy (a chunk arrived, its copy to the
// device runs) -> granted again (the credit goes back to the same writer) ... until the writer
// leaves:
//  - goodbye (RemoveWriter): the writer has drained; its idle slots are free at once, a busy
//    one when its copy ends.
//  - lost (MarkLost: its endpoint failed, or it stopped answering): its slots are not reused
//    until each is idle AND it is safe that nothing more lands in them: the writer process is
//    known to have exited (`exited`), or `quarantine` has passed since it was lost (a writer
//    that copies straight into the slots, or a put still on its way, must not write into a slot
//    already granted to someone else). Reclaim() applies that rule.
// Writers that got fewer than `per_writer` slots wait in arrival order and get freed slots first.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <vector>

namespace kvstream::transport::staged {

class SlotLedger {
 public:
  using Clock = std::chrono::steady_clock;
  struct Grant {
    uint32_t writer;
    uint32_t slot;
    bool operator==(const Grant&) const = default;
  };

  SlotLedger(uint32_t slots, uint32_t per_writer, Clock::duration quarantine);

  // A new writer (id != 0, not known yet): grants it free slots, up to per_writer, and queues it
  // for more when it got fewer. Returns the slots granted now; empty for a bad or known id.
  std::vector<uint32_t> AddWriter(uint32_t writer);
  // A chunk arrived in `slot` from `writer`: true, and the slot is busy, when the slot is granted
  // to that writer, the writer is live, and the slot is not busy already. False: drop the chunk.
  bool BeginChunk(uint32_t writer, uint32_t slot);
  // The chunk in `slot` is done with (copied or rejected). True when the slot goes back to its
  // live owner (send it the credit); false when the owner left (the slot is freed or awaits
  // Reclaim) or the slot was not busy.
  bool EndChunk(uint32_t slot);
  // The writer said goodbye (its chunks have all ended). Its slots are freed (busy ones when
  // they end) and it is forgotten. Returns grants to waiting writers.
  std::vector<Grant> RemoveWriter(uint32_t writer);
  // The writer is lost at `now`: its chunks are dropped from now on, its slots held until
  // Reclaim finds them safe. No effect on an unknown or already lost writer.
  void MarkLost(uint32_t writer, Clock::time_point now);
  // Frees the slots of lost writers that are idle and either exited(writer) says the process is
  // gone or the quarantine has passed; forgets a lost writer once it holds no slot. Then hands
  // free slots to waiting writers. Returns those grants.
  std::vector<Grant> Reclaim(Clock::time_point now, const std::function<bool(uint32_t)>& exited);

  bool known(uint32_t writer) const { return writers_.count(writer) != 0; }
  bool lost(uint32_t writer) const;
  uint32_t held(uint32_t writer) const;  // slots granted to (or still held by) the writer
  uint32_t free_slots() const { return static_cast<uint32_t>(free_.size()); }
  uint32_t busy_slots() const;
  std::vector<uint32_t> writers() const;
  std::vector<uint32_t> lost_writers() const;

 private:
  struct Slot {
    uint32_t owner = 0;  // 0 = free
    bool busy = false;
  };
  struct Writer {
    uint32_t held = 0;
    bool lost = false;
    Clock::time_point lost_at{};
  };
  void Free(uint32_t slot);
  std::vector<Grant> GrantWaiting();
  void GrantTo(uint32_t writer, Writer& w, std::vector<uint32_t>* out);

  const uint32_t per_writer_;
  const Clock::duration quarantine_;
  std::vector<Slot> slots_;
  std::deque<uint32_t> free_;
  std::map<uint32_t, Writer> writers_;
  std::deque<uint32_t> waiting_;  // live writers holding fewer than per_writer_ slots
};

}  // namespace kvstream::transport::staged
