// Per-CTA timestamps of the paged decode-attention kernels - an instrumentation build only.
//
// kernels/paged_attention.cu compiled with KVSTREAM_PA_TIMELINE=1 (CMake target
// kvstream_kernels_attention_timeline; the normal library kvstream_kernels_attention has none
// of this code) records, for every CTA of every launch, while a buffer is set:
//   main kernel, CTA c (linear index blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y *
//   blockIdx.z)), row c of kMainSlots words:
//     [kEntry]      %globaltimer (ns) at the CTA's start
//     [kWaited]     after griddepcontrol.wait (the previous grid in the stream complete)
//     [kFirstData]  warp 0's first unit scored (its first K loads arrived)
//     [kWarp0Done]  warp 0 through its units
//     [kAllDone]    every warp through its units (after the CTA barrier)
//     [kWeighted]   the CTA merge's per-(warp, head) weights computed (after its barrier)
//     [kWritten]    thread 0 done writing its part of the CTA's output or partial
//     [kSm]         %smid
//     [kUnits]      units warp 0 processed
//     [kWarpDone + w]  warp w through its units (w < 16)
//     [kClock + e]  clock64() at event e (kEntry..kWritten), per-SM cycles
//     [kMerged]     fused schedules: the last CTA of a (sequence, KV head, chunk) done merging
//                   the splits; cluster schedules: every CTA done with the cluster merge
//   combine kernel (> 8 splits), CTA c: row kMaxMainCtas + c: [kEntry], [kWaited], [kWritten]
//   (thread 0 done), [kSm].
// Rows of CTAs beyond kMaxMainCtas / kMaxCombineCtas are not recorded. Each launch overwrites
// the rows of the CTAs it runs, so after back-to-back launches the buffer holds the last one.
// The timestamps cost a few instructions and registers: compare the instrumented build's
// call time with the normal one before reading its phases as the normal kernel's.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace kvstream::kernels::timeline {

enum Slot : int {
  kEntry = 0,
  kWaited = 1,
  kFirstData = 2,
  kWarp0Done = 3,
  kAllDone = 4,
  kWritten = 5,
  kSm = 6,
  kUnits = 7,
  kWarpDone = 8,   // + warp, 16 slots
  kClock = 24,     // + event kEntry..kWritten
  kMerged = 30,
  kWeighted = 31,
  kMainSlots = 32,
};
constexpr int kMaxMainCtas = 8192;
constexpr int kMaxCombineCtas = 8192;
// Words (unsigned long long) of the buffer: main rows, then combine rows (kMainSlots each).
constexpr size_t kBufferWords = size_t(kMaxMainCtas + kMaxCombineCtas) * kMainSlots;

// Sets the device buffer (kBufferWords words, device memory) the kernels write to; null
// stops recording. Synchronizes the device. Returns cudaErrorNotSupported in a build without
// KVSTREAM_PA_TIMELINE (without touching the device).
cudaError_t SetBuffer(unsigned long long* device_buffer);

}  // namespace kvstream::kernels::timeline
