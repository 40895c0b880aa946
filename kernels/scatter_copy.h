// Scatter copy: one launch copies many (src, dst, length) runs between any memory a kernel can
// address through UVA (device memory, peer device memory mapped through CUDA IPC, mapped pinned
// host memory): one launch instead of one cudaMemcpyAsync per run. The GPU transports use it to
// move, pack and unpack a request's scattered KV blocks; the kernels know nothing of transports.
// Kernel templates: scatter_copy.cuh. Host-side run planning: transport/cuda/copy_plan.h.
//
// Guarantees:
//  - `table` must live in mapped pinned host memory (cudaHostAllocMapped) or device memory and must
//    stay unchanged until the launch has completed on `stream` (the kernel reads it).
//  - Runs must not overlap each other on the destination side; each is copied exactly once.
//  - Returns the launch error as a Status (kInternal); never blocks the host.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"

namespace kvstream::kernels {

struct CopyRun {
  uint64_t src = 0;     // UVA address
  uint64_t dst = 0;     // UVA address
  uint64_t length = 0;  // bytes
};

// Runs longer than this are split into pieces so that one large run spreads over many CTAs.
inline constexpr uint64_t kScatterPieceBytes = 256 * 1024;

// Loads every scatter-copy kernel into the current device's context now. Under CUDA's lazy
// module loading (the default since 12.2) a kernel is loaded at its first launch, and that load
// waits for the kernels already running in the context: a transport's first Write() issued while
// the process computes would block the host until the compute drains. Transports call this
// once when they are created. Returns the CUDA error as a Status.
Status PreloadScatterKernels();

// Launches the copy of table[0..entries) on `stream` (one CTA per entry).
Status LaunchScatterCopy(const CopyRun* table, size_t entries, cudaStream_t stream);

// Launches the copy of table[0..runs) unsplit: a (runs x pieces_per_run) grid, CTA (x, y) copies
// bytes [y*piece_bytes, (y+1)*piece_bytes) of run x (nothing when the run is shorter). Saves the
// host from writing one table entry per piece. piece_bytes: a multiple of 16, > 0;
// pieces_per_run <= 65535.
Status LaunchScatterCopyPieces(const CopyRun* table, size_t runs, uint64_t piece_bytes,
                               uint32_t pieces_per_run, cudaStream_t stream);

// ---- Parameter-table scatter copy ---------------------------------------------------------
// The run table travels in the kernel's launch parameters (constant bank), not in memory: no
// per-CTA read of a pinned host table across PCIe before the first load, no table ring to
// reserve, one launch per write. Runs are packed as 32-bit offsets and lengths in 16-byte units
// from two bases, so one launch carries up to kParamTableCapacity runs (longer tables go out as
// several launches on the same stream).

struct PackedRun {
  uint32_t src16 = 0;  // (src - src_base) / 16
  uint32_t dst16 = 0;  // (dst - dst_base) / 16
  uint32_t len16 = 0;  // length / 16
};

// Runs per launch: the 4 KiB kernel-parameter limit of CUDA < 12.1 (header + 12 B per run).
inline constexpr size_t kParamTableCapacity = 336;

// A write's runs packed for the parameter-table kernel: each chunk of at most
// kParamTableCapacity runs has its own bases.
struct PackedTable {
  struct Chunk {
    uint64_t src_base = 0, dst_base = 0;
    size_t first = 0, count = 0;   // into runs
    uint64_t longest16 = 0;        // longest run of the chunk, 16-byte units
    uint64_t bytes = 0;            // of the chunk
  };
  std::vector<PackedRun> runs;
  std::vector<Chunk> chunks;
  uint64_t bytes = 0;
  std::vector<CopyRun> pieces;  // scratch of the planner that fills the table
  void clear() {
    runs.clear();
    chunks.clear();
    bytes = 0;
  }
};

// How the parameter-table kernel is launched. threads x unroll x 16 B is one "batch": every
// thread keeps `unroll` 16-byte loads in flight before its stores.
// Work units: every run of a launch is cut into the same number k of near-equal pieces, k =
// the mean run length / piece_bytes (rounded, >= 1), so a run twice as long as the others gets
// pieces twice as long instead of idle CTAs; runs far longer than the mean are cut on the host
// first by the planner. Defaults from the H200 sweep in
// bench/results/transfer_gpu_2026-11-29_v2.md (256 x 8 within noise of the best shapes).
struct ParamKernelConfig {
  int threads = 256;           // 128, 256 or 512
  int unroll = 8;              // 4 or 8
  uint64_t piece_bytes = 0;    // target bytes per work unit (multiple of 16); 0 = PlanPieceBytes
  uint32_t max_ctas = 0;       // 0: one CTA per work unit; else a grid-stride grid of this many
};

// Piece size for `total` bytes in runs of at most `longest` bytes: the largest power of two in
// [16 KiB, 256 KiB] that still gives at least ~2048 work units (every SM several CTAs), never
// smaller than one batch of `cfg`.
uint64_t PlanPieceBytes(uint64_t total, const ParamKernelConfig& cfg);

// k for a chunk of `runs` runs and `chunk_bytes` bytes (see ParamKernelConfig), in [1, 65535].
uint32_t PiecesPerRun(uint64_t chunk_bytes, size_t runs, uint64_t piece_bytes);

// Launches the copy of every chunk of `table` on `stream`: per chunk a grid of runs x k work
// units, unit (r, p) copies piece p of run r. kInvalidArgument for a bad config; the launch
// error otherwise. Never blocks the host.
Status LaunchParamScatterCopy(const PackedTable& table, const ParamKernelConfig& cfg,
                              cudaStream_t stream);

// ---- Block-table scatter copy (fixed-size units) --------------------------------------------
// A paged pool moves whole blocks: every run is a multiple of one unit (the block, or the largest
// power of two dividing every offset and length). Such a write needs only the unit size and, per
// unit, a (source unit, destination unit) index pair: 8 bytes per block instead of the packed
// form's 12 per run, no per-run lengths, no host-side splitting, and no 64 GiB span limit (indices
// count units, not 16-byte words). With CUDA >= 12.1 (runtime and driver) the index list rides in
// up to 32 KiB of launch parameters, so a write of up to kBlockTableMaxEntries units is ONE launch
// (a llama-3-8b layer of a 64k-token prompt); the parameter block is sized to the entries used
// (4, 8, 16 or 32 KiB), so short tables do not pay for a large one.

struct BlockEntry {
  uint32_t src = 0;  // unit index from the source base
  uint32_t dst = 0;  // unit index from the destination base
};

// Entries one launch can carry: kBlockTableMaxEntries where the runtime and driver allow 32 KiB
// of kernel parameters (CUDA >= 12.1), else kBlockTableSmallEntries (the 4 KiB limit).
inline constexpr size_t kBlockTableSmallEntries = 508;
inline constexpr size_t kBlockTableMaxEntries = 4088;
size_t BlockTableLaunchCapacity();

// Copies unit_bytes from src_base + e.src * unit_bytes to dst_base + e.dst * unit_bytes for every
// entry, in as few launches as BlockTableLaunchCapacity() allows (one for most writes). Every
// unit is cut into k near-equal pieces (k from PlanPieceBytes of the total, as the packed
// kernel), one CTA per piece. src_base, dst_base and unit_bytes must be multiples of 16;
// destinations must not overlap. kInvalidArgument for bad arguments or config; the launch error
// otherwise. Never blocks the host; `entries` may be reused as soon as it returns.
Status LaunchBlockScatterCopy(uint64_t src_base, uint64_t dst_base, uint64_t unit_bytes,
                              const BlockEntry* entries, size_t n, const ParamKernelConfig& cfg,
                              cudaStream_t stream);

// True when the parameter-table and block-table kernels are built for (threads, unroll).
bool ScatterKernelShapeSupported(int threads, int unroll);

}  // namespace kvstream::kernels
