// Device side of the per-CTA timestamps (paged_attention_timeline.h): compiled in only with
// KVSTREAM_PA_TIMELINE (target kvstream_kernels_attention_timeline). KVSTREAM_TL(code) expands to
// `code` in that build and to nothing otherwise. Included only by paged_attention.cu.
#pragma once

#include "kernels/paged_attention_timeline.h"

#ifdef KVSTREAM_PA_TIMELINE
namespace kvstream::kernels::paged_decode {
// In constant memory: a mark reads it through the constant cache, which the KV loads do not
// evict (docs/kernels.md says what a global variable cost). Internal linkage: one copy per
// translation unit, and paged_attention.cu is the only one.
static __constant__ unsigned long long* g_timeline = nullptr;
__device__ __forceinline__ unsigned long long* TimelineRow(long base) {
  const long cta = blockIdx.x + long(gridDim.x) * (blockIdx.y + long(gridDim.y) * blockIdx.z);
  if (g_timeline == nullptr || cta >= timeline::kMaxMainCtas) return nullptr;
  return g_timeline + (base + cta) * timeline::kMainSlots;
}
// Thread 0: event `ev` of this CTA (main kernel: base 0; combine: kMaxMainCtas).
__device__ __forceinline__ void TimelineMark(int ev, long base = 0) {
  if (threadIdx.x != 0) return;
  unsigned long long* r = TimelineRow(base);
  if (r == nullptr) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  r[ev] = t;
  if (base == 0 && ev <= timeline::kWritten) r[timeline::kClock + ev] = clock64();
}
__device__ __forceinline__ void TimelineValue(int slot, unsigned long long v, long base = 0) {
  unsigned long long* r = TimelineRow(base);
  if (r != nullptr) r[slot] = v;
}
__device__ __forceinline__ unsigned SmId() {
  unsigned id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}
}  // namespace kvstream::kernels::paged_decode
#define KVSTREAM_TL(...) __VA_ARGS__
#else
#define KVSTREAM_TL(...)
#endif

