// The host-staged transport's chunk copies (transport/staged/): one chunk between scattered
// device memory and its contiguous staging bytes, on the pipeline's CUDA streams.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#include "common/status.h"
#include "transport/cuda/copy_plan.h"
#include "transport/cuda/cuda_util.h"

namespace kvstream::transport::staged {

// Scatter-table entries per staging slot or send buffer: >= pieces after splitting into 256 KiB
// pieces.
inline constexpr size_t kTableEntriesPerSlot = 4096;

// One step of a pipeline thread's busy wait (poll_us == 0): a short pause, then a chance for
// other threads on this core.
inline void SpinPause() {
#if defined(__x86_64__) || defined(__i386__)
  for (int i = 0; i < 16; ++i) __builtin_ia32_pause();
#endif
  std::this_thread::yield();
}

// Device -> pinned staging (writer) or pinned staging -> device (receiver) for one chunk.
// `runs` move between scattered device addresses and the chunk's contiguous staging bytes
// [0, bytes). Few runs: cudaMemcpyAsync each. Many: the copy engine moves the chunk in one
// piece between staging and a device scratch buffer, and the scatter kernel does the
// gathering / scattering device-side (its run table, `table`, is pinned and stays untouched
// until the stream passes it).
//
// Lanes: transfers go on `copy`, kernels on `kernel` (when it differs), so that one chunk's
// kernel runs while the copy engine moves the next chunk instead of between the two copies.
// The caller records the chunk's completion on the stream CopyChunk returns.
enum class Direction { kToHost, kToDevice };
struct Lanes {
  cudaStream_t copy = nullptr;
  cudaStream_t kernel = nullptr;  // == copy: one stream
  cuda::EventPool* events = nullptr;
  // Receive side: a scatter was enqueued on `kernel` since `copy` last waited for it. A chunk
  // copied straight to the device then waits for it first, so that writes still land in the
  // order they were announced (a later write to the same bytes wins).
  bool kernel_ahead = false;
};

Result<cudaStream_t> CopyChunk(Direction dir, const std::vector<cuda::CopyRun>& runs,
                               uint64_t staging, uint64_t bytes, void* scratch,
                               cuda::CopyRun* table, size_t table_cap, Lanes& lanes);

}  // namespace kvstream::transport::staged
