// Host-side planning of one GPU write (cuda_ipc's copies, nccl's pack and unpack), kept free of
// CUDA calls so it is unit-tested on the CPU: validating and coalescing CopyOps into runs,
// choosing memcpy vs scatter kernel and the kernel's launch shape and table form, and the
// per-endpoint ring of pinned run-table entries. The kernels themselves: kernels/scatter_copy.h.
//
// Guarantees:
//  - CopyPlanner::Build never allocates once its scratch has grown to the largest request seen
//    (the write path runs per layer; see the ipcperf notes in bench/results/).
//  - Build's runs preserve request order; runs contiguous on both sides are merged.
//  - `disjoint` is exact: true iff no two runs overlap on the destination side.
//  - RunRing hands out contiguous [start, start+n) ranges of a ring of `capacity` entries (no
//    range wraps), in order, and refuses (false) when the range would overwrite entries not yet
//    released; Release(end) frees everything before `end` (ends are released in order).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"
#include "kernels/scatter_copy.h"
#include "transport/transport.h"

namespace kvstream::transport::cuda {

// The scatter-copy kernels' types and launchers, as the GPU backends name them.
using kernels::BlockEntry;
using kernels::BlockTableLaunchCapacity;
using kernels::CopyRun;
using kernels::kBlockTableMaxEntries;
using kernels::kBlockTableSmallEntries;
using kernels::kParamTableCapacity;
using kernels::kScatterPieceBytes;
using kernels::LaunchBlockScatterCopy;
using kernels::LaunchParamScatterCopy;
using kernels::LaunchScatterCopy;
using kernels::LaunchScatterCopyPieces;
using kernels::PackedRun;
using kernels::PackedTable;
using kernels::ParamKernelConfig;
using kernels::PiecesPerRun;
using kernels::PlanPieceBytes;
using kernels::PreloadScatterKernels;

// Number of table entries SplitRuns produces for `runs` (each run cut into pieces of at most
// kScatterPieceBytes).
size_t ScatterTableEntries(const CopyRun* runs, size_t n);
// Writes the pieces of `runs` into `table` (capacity >= ScatterTableEntries(runs, n)).
size_t SplitRuns(const CopyRun* runs, size_t n, CopyRun* table);

// Packs `runs` (optionally cut into pieces of at most `split_bytes`, 0 = uncut) into `out` for
// the parameter-table kernel. Returns false, leaving `out` cleared, when the runs do not fit the
// packed form: an address or length that is not a multiple of 16, or a run whose offset from its
// chunk's smallest source or destination address reaches 64 GiB (2^32 units). The caller then
// uses the memory-table kernel. Reuses out's storage (no allocation once grown).
bool PackRuns(const CopyRun* runs, size_t n, uint64_t split_bytes, PackedTable* out);

// The split_bytes to pass to PackRuns for `runs` under `cfg`: 0 when the runs are even enough
// for k pieces per run (the longest at most ~4x the mean), else the target piece size.
uint64_t ParamSplitBytes(const CopyRun* runs, size_t n, const ParamKernelConfig& cfg);

// A launch shape written "t<threads>u<unroll>p<piece KiB>c<max ctas>" (any part optional, e.g.
// "t512u4p32"; scatter_bench sweeps them), over *out's values. False, leaving *out, when the
// text is malformed or the kernels are not built for that threads x unroll.
bool ParseParamKernelConfig(const char* text, ParamKernelConfig* out);


class CopyPlanner {
 public:
  // Validates `ops` against the local region [local_base, +local_len) and the remote region
  // [remote_base, +remote_len) and builds runs(). kInvalidArgument names the first bad op.
  Status Build(const std::vector<CopyOp>& ops, uint64_t local_base, uint64_t local_len,
               uint64_t remote_base, uint64_t remote_len);
  const std::vector<CopyRun>& runs() const { return runs_; }
  uint64_t bytes() const { return bytes_; }
  // Forgets the last plan (no runs) without releasing scratch.
  void Clear() {
    runs_.clear();
    bytes_ = 0;
    disjoint_ = true;
  }
  bool disjoint() const { return disjoint_; }

 private:
  std::vector<CopyRun> runs_;
  // Exact overlap check of unsorted runs through a bitmap of destination granules (the largest
  // power of two dividing every run's offset and length); false when the span or the marked
  // granules would exceed kMaxGranules (the caller sorts instead).
  bool CheckDisjointByGranules();
  static constexpr uint64_t kMaxGranules = 1u << 16;
  std::vector<CopyRun> sorted_;  // scratch for the overlap check of unsorted plans
  std::vector<uint64_t> granule_bits_;  // scratch for CheckDisjointByGranules
  uint64_t bytes_ = 0;
  bool disjoint_ = true;
};

// The fast plan for paged writes (the block-table kernel, kernels/scatter_copy.h): when every op's
// offsets and length are multiples of one power-of-two unit G >= 16 (a pool's blocks), the write
// becomes a list of (source unit, destination unit) pairs, built in two passes over the ops with
// no sorting, no coalescing pass and no per-run lengths.
//
// Guarantees:
//  - Build validates exactly like CopyPlanner::Build (same kInvalidArgument for an op outside
//    either region) before it says anything else.
//  - OK + fits() == false when the fast form does not apply: bases or ops not 16-byte aligned,
//    more than max_entries units, a region too large to index in 32 bits of units or to mark in
//    the overlap bitmap, or destinations that overlap. The caller then uses CopyPlanner, which
//    handles all of these; nothing of the write has been posted.
//  - When fits(): entries() lists every unit of every op in request order; no two entries share a
//    destination unit (exact check through a bitmap of destination units that is cleared again
//    before Build returns, so it costs O(units), not O(region)); runs() = the number of runs
//    CopyPlanner would produce (ops contiguous on both sides with the previous one merged).
//  - No allocation once the scratch has grown to the largest request seen.
class BlockPlanner {
 public:
  // Ops whose units number more than this are never planned here (the caller's plan then
  // costs one pass over the ops only).
  Status Build(const std::vector<CopyOp>& ops, uint64_t local_base, uint64_t local_len,
               uint64_t remote_base, uint64_t remote_len, size_t max_entries);
  bool fits() const { return fits_; }
  const std::vector<BlockEntry>& entries() const { return entries_; }
  uint64_t unit_bytes() const { return unit_; }
  uint64_t bytes() const { return bytes_; }
  size_t runs() const { return runs_; }
  // Largest destination region (in units) the overlap bitmap may cover.
  static constexpr uint64_t kMaxBitmapUnits = 1ull << 24;

 private:
  std::vector<BlockEntry> entries_;
  std::vector<uint64_t> bitmap_;  // all zero between calls
  uint64_t unit_ = 0, bytes_ = 0;
  size_t runs_ = 0;
  bool fits_ = false;
};

// Launch shape of the scatter kernel for a set of runs: grid (runs, pieces_per_run), each CTA
// copies one piece of `piece_bytes` of one run (CTAs past a run's end exit at once).
// piece_bytes is a power of two between kMinPieceBytes and kScatterPieceBytes, chosen so
// the launch has at least about kTargetCtas CTAs (enough to keep every SM's memory pipes busy),
// unless the runs are too few bytes for that. `wasted` = CTAs with nothing to copy.
struct ScatterShape {
  uint64_t piece_bytes = 0;
  uint32_t pieces_per_run = 0;  // grid.y
  uint64_t ctas = 0;            // runs * pieces_per_run
  uint64_t wasted = 0;
};
inline constexpr uint64_t kMinPieceBytes = 16 * 1024;
inline constexpr uint64_t kTargetCtas = 2048;
ScatterShape PlanScatter(const CopyRun* runs, size_t n);
// True when the 2-D launch wastes too many CTAs (very uneven run lengths): the caller then
// splits runs on the host instead (SplitRuns).
bool ScatterShapeWasteful(const ScatterShape& shape);

enum class CopyPath { kMemcpy, kKernel, kKernelSplit };
// kMemcpy for few runs (the copy engines are best at large contiguous copies), for overlapping
// destinations (the kernel has no order) or when forced; otherwise the kernel.
CopyPath ChooseCopyPath(size_t runs, bool disjoint, bool force_memcpy, bool force_kernel,
                        size_t kernel_min_runs, const ScatterShape& shape);

class RunRing {
 public:
  explicit RunRing(uint64_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {}
  bool Reserve(uint64_t entries, uint64_t* start);
  void Release(uint64_t end) {
    if (end > tail_) tail_ = end;
  }
  uint64_t head() const { return head_; }
  uint64_t tail() const { return tail_; }
  uint64_t capacity() const { return capacity_; }
  uint64_t Index(uint64_t pos) const { return pos % capacity_; }

 private:
  uint64_t capacity_;
  uint64_t head_ = 0, tail_ = 0;
};

}  // namespace kvstream::transport::cuda
