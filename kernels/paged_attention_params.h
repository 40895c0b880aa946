// The parameters of the paged decode attention (kernels/paged_attention.h, which includes this
// file and holds the launch contract) and the queries that need no device. Free of CUDA, so that
// the planner (paged_attention_plan.h) and its tests build and run without a GPU toolchain.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace kvstream::kernels {

enum class Prefetch : int { kAuto = -1, kOff = 0, kOn = 1 };

// How the work is laid out and the split partials merged (all compute the same attention; only
// the schedule's own prefetch variants are bit-identical to each other).
enum class Schedule : int {
  kAuto = -1,       // chosen by shape from a table (PagedDecodeResolvedSchedule)
  kV2 = 0,          // the v2 kernel: 4-warp CTAs, wave-filling split plan, separate combine
                    // kernel (PDL), main kernel launched plainly
  kKernel = 1,      // 4-warp CTAs; where one wave holds all splits, the split count with the
                    // fewest whole per-warp rounds; separate combine; PDL launches
  kFused = 2,       // kKernel's plan; the last CTA of each (sequence, KV head) merges the
                    // splits (no second kernel; needs the zeroed workspace)
  kWideKernel = 3,  // one 16-warp CTA per SM (head <= 128; else as kKernel): 4x fewer splits
  kWideFused = 4,   // kWideKernel's plan with the fused merge
  kCluster = 5,     // kKernel's plan; the splits of a (sequence, KV head) run as one
                    // thread-block cluster (<= 16 CTAs) that merges them through distributed
                    // shared memory: no second kernel, no workspace
  kWideCluster = 6, // kWideKernel's plan with kCluster's merge
};

// Which code a launch runs. The Hopper paths (sm_90: thread-block clusters, programmatic
// dependent launch, the bulk L2 prefetch cp.async.bulk.prefetch.L2) run where the device has
// compute capability >= 9.0 and the kernel image loaded for it was compiled for compute_90 or
// later. Elsewhere (Ampere sm_80, Ada sm_89) the fallback runs: a cluster schedule merges through
// its kernel-combine counterpart, the kernels launch without PDL (so no early prefetch), and the
// in-loop prefetch issues prefetch.global.L2 per 128-byte line. Same split plans, same
// arithmetic: outputs equal the Hopper paths' bit for bit except where a cluster merge is
// replaced. docs/kernels.md, "GPUs and code paths".
enum class CodePaths : int {
  kAuto = 0,      // the Hopper paths where available, unless the environment sets
                  // KVSTREAM_KERNEL_FALLBACK=1 (any value but "" and "0"): then the fallback
  kFallback = 1,  // the Ampere/Ada paths on any GPU (how the tests run them on a Hopper GPU)
};

struct PagedDecodeParams {
  void* out = nullptr;
  const void* q = nullptr;
  const void* kv_layer = nullptr;
  const int32_t* block_tables = nullptr;
  const int32_t* context_lens = nullptr;
  int num_seqs = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;
  int max_blocks_per_seq = 0;
  int max_context_len = 0;      // upper bound of context_lens (host-known), for split planning
  // Optional: the same lengths as context_lens, on the host ([num_seqs], read during the call
  // only). With it, a batch of uneven lengths (the longest > 1.5x the mean: e.g. a landed
  // 16k-token prompt joining 4k-token streams) is split so that the long sequences do not
  // leave one straggling CTA per head; without it (or for an even batch) the plan depends on
  // max_context_len alone.
  const int32_t* host_context_lens = nullptr;
  float scale = 0.f;            // softmax scale, usually 1/sqrt(head_dim)
  DType dtype = DType::kF16;    // kF16 or kBF16
  Prefetch prefetch = Prefetch::kAuto;
  int num_splits = 0;           // 0 = chosen by shape
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // Lookahead of the L2 prefetch in the warp's own loop strides (1 = the paper's
  // block_idx + NUM_WARPS); 0 = the default (1). Only used when the prefetch variant runs.
  int prefetch_distance = 0;
  Schedule schedule = Schedule::kAuto;
  // Early L2 prefetch (PDL schedules only, i.e. not kV2): before waiting for the previous
  // kernel in the stream, each warp issues cp.async.bulk.prefetch.L2 for the K and V tiles of
  // its first units (early_prefetch_units), so that they stream in during that kernel's tail. A
  // hint only (no value read before the wait is used after it). Needs num_blocks. kAuto = the
  // table's choice when schedule is kAuto too, off with an explicit schedule.
  Prefetch early_prefetch = Prefetch::kAuto;
  int early_prefetch_units = 0;  // units per warp the early prefetch covers: 1..4, 0 = 1
  // Number of blocks in kv_layer's pool (0 = unknown: no early prefetch). Block ids read before
  // the wait may be stale, and only ids below this are prefetched.
  int num_blocks = 0;
  // Dims each CTA of the split combine kernel merges when the context has more than 8 splits:
  // 32 (more, smaller CTAs), 128 (4x fewer CTAs, head_dim >= 128 only; else 32), 0 = 32. The
  // two sum the splits in different orders (outputs may differ in the last bit).
  int combine_dims = 0;
  CodePaths code_paths = CodePaths::kAuto;
};

// Everything a launch with these params would run (PagedDecodeDescribe in paged_attention.h).
// For an unsupported shape `supported` is false and the rest is zero / kV2; for num_seqs == 0
// (nothing launched) or when the device cannot be queried, `supported` is true and the rest
// zero / kV2.
struct PagedDecodePlanInfo {
  bool supported = false;
  Schedule schedule = Schedule::kV2;  // resolved, as PagedDecodeResolvedSchedule
  int num_splits = 0;                 // CTAs per (sequence, KV head, head chunk)
  int cluster = 0;                    // CTAs per thread-block cluster (1: none)
  int warps_per_cta = 0;
  bool in_loop_prefetch = false;      // the paper's L2 prefetch in the loop (prefetch variant)
  int early_prefetch_units = 0;       // units per warp prefetched into L2 before the PDL wait
  // The split combine kernel: 0 = none (one split, or merged in the main kernel), 4 = one
  // thread per output float4 (<= 8 splits), 32 / 128 = CTAs of that many dims (combine_dims).
  int combine_dims = 0;
  size_t workspace_bytes = 0;         // as PagedDecodeWorkspaceBytes
  bool hopper_paths = false;          // the launch takes the Hopper paths (CodePaths)
};

// True when the shape is implemented: dtype kF16/kBF16, head_dim 64/128/256, block_size 16/32,
// num_heads a multiple of num_kv_heads, 0 <= num_seqs <= 65535, max_context_len <=
// max_blocks_per_seq * block_size, q/out/kv_layer 16-byte aligned, non-null pointers.
// Preconditions the launcher cannot check (device memory): every context_lens[i] <=
// max_context_len (longer ones are still computed correctly, as long as they fit the block
// table, but the split plan is made for max_context_len), and block_tables[i][j] is a valid
// block id of kv_layer for j < ceil(context_lens[i] / block_size). A context length of 0 gives
// an output of zeros.
bool PagedDecodeSupported(const PagedDecodeParams& p);
// The variant Prefetch::kAuto runs for this shape (true = with the L2 prefetch), from a table
// by (MHA | GQA) x batch class x context class (docs/kernels.md says how it was filled).
bool PagedDecodeAutoPrefetch(const PagedDecodeParams& p);

}  // namespace kvstream::kernels
