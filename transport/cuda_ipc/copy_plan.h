// Host-side planning of one cuda_ipc write, kept free of CUDA calls so it is unit-tested on the
// CPU: validating and coalescing CopyOps into runs, choosing memcpy vs scatter kernel and the
// kernel's launch shape, and the per-endpoint ring of pinned run-table entries.
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
#include "transport/cuda_ipc/scatter_copy.h"
#include "transport/transport.h"

namespace kvstream::transport::cuda_ipc {

class CopyPlanner {
 public:
  // Validates `ops` against the local region [local_base, +local_len) and the remote region
  // [remote_base, +remote_len) and builds runs(). kInvalidArgument names the first bad op.
  Status Build(const std::vector<CopyOp>& ops, uint64_t local_base, uint64_t local_len,
               uint64_t remote_base, uint64_t remote_len);
  const std::vector<cuda::CopyRun>& runs() const { return runs_; }
  uint64_t bytes() const { return bytes_; }
  bool disjoint() const { return disjoint_; }

 private:
  std::vector<cuda::CopyRun> runs_;
  // Exact overlap check of unsorted runs through a bitmap of destination granules (the largest
  // power of two dividing every run's offset and length); false when the span or the marked
  // granules would exceed kMaxGranules (the caller sorts instead).
  bool CheckDisjointByGranules();
  static constexpr uint64_t kMaxGranules = 1u << 16;
  std::vector<cuda::CopyRun> sorted_;  // scratch for the overlap check of unsorted plans
  std::vector<uint64_t> granule_bits_;  // scratch for CheckDisjointByGranules
  uint64_t bytes_ = 0;
  bool disjoint_ = true;
};

// Launch shape of the scatter kernel for a set of runs: grid (runs, pieces_per_run), each CTA
// copies one piece of `piece_bytes` of one run (CTAs past a run's end exit at once).
// piece_bytes is a power of two between kMinPieceBytes and cuda::kScatterPieceBytes, chosen so
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
ScatterShape PlanScatter(const cuda::CopyRun* runs, size_t n);
// True when the 2-D launch wastes too many CTAs (very uneven run lengths): the caller then
// splits runs on the host instead (cuda::SplitRuns).
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

}  // namespace kvstream::transport::cuda_ipc
