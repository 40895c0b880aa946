// Monotonic clock and deadlines. Every wait in kvstream takes a Deadline.
#pragma once

#include <chrono>
#include <cstdint>

namespace kvstream {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

inline Deadline DeadlineAfter(std::chrono::nanoseconds d) { return Clock::now() + d; }
inline Deadline DeadlineAfterMs(int64_t ms) { return Clock::now() + std::chrono::milliseconds(ms); }
inline bool Expired(Deadline d) { return Clock::now() >= d; }
inline double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}
inline int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch())
      .count();
}

}  // namespace kvstream
