// One-launch copy of many (src, dst, length) runs between any memory a kernel can address
// through UVA: device memory, peer device memory mapped through CUDA IPC, mapped pinned host
// memory. Used by the GPU backends when a write has many scattered runs (a request's KV blocks
// in a paged pool): one launch instead of one cudaMemcpyAsync per run.
//
// Guarantees:
//  - `table` must live in mapped pinned host memory (PinnedBuffer) or device memory and must
//    stay unchanged until the launch has completed on `stream` (the kernel reads it).
//  - Runs must not overlap each other on the destination side; each is copied exactly once.
//  - Returns the launch error as a Status (kInternal); never blocks the host.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/status.h"

namespace kvstream::transport::cuda {

struct CopyRun {
  uint64_t src = 0;     // UVA address
  uint64_t dst = 0;     // UVA address
  uint64_t length = 0;  // bytes
};

// Runs longer than this are split into pieces so that one large run spreads over many CTAs.
inline constexpr uint64_t kScatterPieceBytes = 256 * 1024;

// Number of table entries SplitRuns produces for `runs` (each run cut into pieces).
size_t ScatterTableEntries(const CopyRun* runs, size_t n);
// Writes the pieces of `runs` into `table` (capacity >= ScatterTableEntries(runs, n)).
size_t SplitRuns(const CopyRun* runs, size_t n, CopyRun* table);

// Launches the copy of table[0..entries) on `stream` (one CTA per entry).
Status LaunchScatterCopy(const CopyRun* table, size_t entries, cudaStream_t stream);

// Launches the copy of table[0..runs) unsplit: a (runs x pieces_per_run) grid, CTA (x, y) copies
// bytes [y*piece_bytes, (y+1)*piece_bytes) of run x (nothing when the run is shorter). Saves the
// host from writing one table entry per piece. piece_bytes: a multiple of 16, > 0;
// pieces_per_run <= 65535.
Status LaunchScatterCopyPieces(const CopyRun* table, size_t runs, uint64_t piece_bytes,
                               uint32_t pieces_per_run, cudaStream_t stream);

}  // namespace kvstream::transport::cuda
