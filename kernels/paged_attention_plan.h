// The planner of the paged decode attention: everything that chooses what a launch runs (the
// schedule kAuto resolves to, the split count, the cluster size, the combine kernel, the early
// prefetch, the workspace layout), in plain C++. The launcher (paged_attention.cu) answers the
// device questions (PlanOccupancy) from the CUDA runtime; the unit tests answer them with fixed
// numbers. Internal to kernels/ (callers use paged_attention.h).
#pragma once

#include <cstddef>

#include "kernels/paged_attention_params.h"

namespace kvstream::kernels::paged_decode {

// Shape constants shared by the planner, the kernels and the launcher.
constexpr int kWarps = 4;         // warps per CTA of the 4-warp kernel
constexpr int kWideWarps = 16;    // warps per CTA of the wide schedules (one CTA per SM)
constexpr int kUnitTokens = 16;   // tokens of one KV head per unit (one K and one V tile)
constexpr int kHeadsPerCta = 8;   // query heads of a GQA group per CTA (the mma's n dimension)
constexpr int kMaxSplits = 128;   // CTAs a context is split over, at most
constexpr int kMinUnitsPerSplit = 4;
constexpr int kDefaultPrefetchDistance = 1;  // in-loop L2 prefetch lookahead, in warp strides
// Fused combine: one arrival counter per (sequence, KV head, head chunk) at the start of the
// workspace; the region has a fixed size so that launches of different shapes sharing one
// workspace never put partials where another shape keeps its counters.
constexpr int kMaxFusedCounters = 4096;
constexpr size_t kCounterBytes = kMaxFusedCounters * sizeof(unsigned);
constexpr int kMaxEarlyUnits = 4;      // early L2 prefetch: at most a warp's first 4 units
constexpr int kDefaultEarlyUnits = 1;  // units the early prefetch covers when not given
constexpr int kFewSplits = 8;          // up to this many splits: one combine thread per float4

// What the planner asks of the device. Asked only for the CTA shapes and cluster sizes the plan
// considers (the CUDA answers set kernel attributes and cache their results).
class PlanOccupancy {
 public:
  virtual ~PlanOccupancy() = default;
  // Resident CTAs per SM of the main kernel with `warps` warps per CTA (>= 1), planned from the
  // prefetch-off variant for both variants so that both split a context the same way.
  virtual int CtasPerSm(DType dtype, int head_dim, int warps) const = 0;
  // Clusters of `cluster` CTAs of the main kernel (both variants) the device holds at once
  // (0: none, or unknown).
  virtual int MaxActiveClusters(DType dtype, int head_dim, int warps, int cluster) const = 0;
};

// One launch, fully resolved.
struct Plan {
  Schedule schedule = Schedule::kV2;  // resolved (never kAuto)
  int warps = kWarps;
  int head_chunks = 1;
  int num_splits = 1;
  int units_per_split = 1;
  bool fused = false;  // the last CTA merges (no combine kernel); only with num_splits > 1
  bool pdl = false;    // main (and combine) kernel launched with programmatic dependent launch
  bool early = false;  // early L2 prefetch before griddepcontrol.wait
  int cluster = 1;     // cluster schedules: CTAs per cluster, >= num_splits (grid x = cluster)
  int combine_dims = 32;  // > kFewSplits splits: dims per combine CTA (32 or 128)
  // The Hopper (sm_90) paths: PDL, clusters, the bulk L2 prefetch (CodePaths). Without them
  // pdl and early are false, cluster is 1, and the in-loop prefetch goes line by line.
  bool hopper_paths = true;
};

// The plan of a supported shape (PagedDecodeSupported) with num_seqs > 0 on a device of
// `sm_count` SMs; `hopper_paths`: whether the device and the loaded kernel image have the sm_90
// paths (the caller also folds in p.code_paths and KVSTREAM_KERNEL_FALLBACK). The split plan
// does not depend on it.
Plan MakePlan(const PagedDecodeParams& p, int sm_count, const PlanOccupancy& occupancy,
              bool hopper_paths = true);

// Workspace when the context is split and merged through global memory:
// [arrival counters: kCounterBytes][partial O: rows x head_dim floats][partial lse: rows floats],
// rows = num_seqs x num_heads x num_splits, each array 256-byte aligned. Empty (total 0) for one
// split or a cluster merge (shared memory).
struct WorkspaceLayout {
  size_t o_offset = 0;
  size_t lse_offset = 0;
  size_t total = 0;
};
WorkspaceLayout LayoutFor(const PagedDecodeParams& p, const Plan& plan);

// Units per warp the early L2 prefetch covers in this plan (0: none).
int EarlyUnits(const PagedDecodeParams& p, const Plan& plan);
// True when the launch runs the in-loop L2 prefetch variant (Prefetch::kOn, or kAuto's table).
bool InLoopPrefetch(const PagedDecodeParams& p);
// PagedDecodeDescribe's answer for a planned launch.
PagedDecodePlanInfo DescribePlan(const PagedDecodeParams& p, const Plan& plan);

// The planner's steps, exposed for the unit tests.
// True when the host lengths describe an uneven batch (the longest > 1.5x the mean).
bool UnevenBatch(const PagedDecodeParams& p);
// The smallest split count whose last wave of `slots` resident CTAs is >= 90 % full (with >=
// kMinUnitsPerSplit units per split), else the fullest; `base` CTAs per split.
int WaveFillSplits(long base, int units, long slots);
// Where one wave holds every split: the fewest whole per-warp rounds, then the fewest splits.
int OneWaveSplits(long base, int units, long slots, int warps);
// An uneven batch's split count: the one minimising an estimate of the kernel's time.
int UnevenBatchSplits(const PagedDecodeParams& p, int units, long ctas_per_seq_split, long slots,
                      int even_plan);
// kAuto's table entry for this shape.
struct AutoChoice {
  Schedule schedule;
  bool early;
};
AutoChoice AutoFor(const PagedDecodeParams& p);

}  // namespace kvstream::kernels::paged_decode
