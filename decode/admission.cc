#include "decode/admission.h"

#include <algorithm>
#include <chrono>

namespace kvstream::decode {

Result<std::vector<int32_t>> Admission::Acquire(int need, Deadline deadline,
                                                const std::function<bool()>& cancelled) {
  const auto start = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  if (closed_) return Unavailable(closed_why_);
  if (line_.empty()) {
    auto ids = allocator_->Allocate(need);
    if (ids.ok()) return ids;
  }
  if (static_cast<int>(line_.size()) >= max_queue_)
    return ResourceExhausted("admission queue full: " + std::to_string(line_.size()) +
                             " requests already wait for KV blocks (max_queue " +
                             std::to_string(max_queue_) + ")");
  const uint64_t ticket = next_ticket_++;
  line_.push_back(ticket);
  auto leave = [&] {
    line_.erase(std::find(line_.begin(), line_.end(), ticket));
    cv_.notify_all();
  };
  while (true) {
    if (closed_) {
      leave();
      return Unavailable(closed_why_);
    }
    const bool first = line_.front() == ticket;
    if (first) {
      auto ids = allocator_->Allocate(need);
      if (ids.ok()) {
        leave();
        return ids;
      }
    }
    if (cancelled && cancelled()) {
      leave();
      return Canceled("cancelled while waiting for KV blocks");
    }
    if (Clock::now() >= deadline) {
      const size_t behind = line_.end() - std::find(line_.begin(), line_.end(), ticket) - 1;
      leave();
      const auto waited =
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
      return ResourceExhausted("KV pool full: need " + std::to_string(need) + " blocks, " +
                               std::to_string(allocator_->free_count()) + " free after waiting " +
                               std::to_string(waited) + " ms in the admission queue (" +
                               std::to_string(behind) + " behind)");
    }
    // Blocks come back without a signal here: the first in line looks again soon; the others
    // wake when the line moves (and now and then for their deadline or cancellation).
    const auto nap = first ? std::chrono::milliseconds(2) : std::chrono::milliseconds(20);
    cv_.wait_until(lock, std::min<Deadline>(deadline, Clock::now() + nap));
  }
}

void Admission::Close(std::string why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
    closed_why_ = std::move(why);
  }
  cv_.notify_all();
}

int Admission::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(line_.size());
}

}  // namespace kvstream::decode
