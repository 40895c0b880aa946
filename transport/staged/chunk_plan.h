// The host-staged transport's chunk size per write (transport/staged/). No CUDA, no UCX: tested
// on the CPU.
//
// A write moves through a two-stage pipeline (device -> host, then host -> device) in chunks.
// With the same rate r both ways, chunks of size s take (bytes + s) / r plus latency that does
// not depend on s (the first chunk's host -> device copy starts only after its device -> host
// copy, the last one's ends after it), and each chunk costs a fixed overhead o (a copy, an
// announcement, a credit). Their sum is smallest at s = sqrt(bytes * o * r): `fill` is o * r.
// Bytes queued ahead of the write (not started yet) hide its fill, so they count as its own.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace kvstream::transport::staged {

// sqrt((queued + bytes) * fill) rounded up to 64 KiB, at least 1 MiB, at most `cap`; `cap` when
// fill is 0.
inline uint64_t AdaptiveChunkBytes(uint64_t queued, uint64_t bytes, uint64_t fill, uint64_t cap) {
  if (fill == 0) return cap;
  constexpr uint64_t kMin = 1 << 20, kAlign = 64 << 10;
  const long double want = std::sqrt(static_cast<long double>(queued) * static_cast<long double>(fill) +
                                     static_cast<long double>(bytes) * static_cast<long double>(fill));
  uint64_t c = want >= static_cast<long double>(cap) ? cap : static_cast<uint64_t>(want);
  c = (c + kAlign - 1) / kAlign * kAlign;
  return std::min(cap, std::max(kMin, c));
}

}  // namespace kvstream::transport::staged
