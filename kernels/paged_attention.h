// Paged decode attention (one query token per sequence) over the KV pool layout of
// model/kv_cache.h, with an optional L2 prefetch of each warp's next KV block
// (cp.async.bulk.prefetch.L2.global, sm_90). The parameters and the device-free queries
// (PagedDecodeSupported, PagedDecodeAutoPrefetch) are in paged_attention_params.h.
//
// Tensors (row-major, no padding):
//   q, out:        [num_seqs][num_heads][head_dim]                     dtype
//   kv_layer:      [num_blocks][2][num_kv_heads][block_size][head_dim] dtype  (one layer)
//   block_tables:  [num_seqs][max_blocks_per_seq]                      int32 (device)
//   context_lens:  [num_seqs]                                           int32 (device)
// Query head h reads KV head h / (num_heads / num_kv_heads).
//
// Guarantees: launches only (no synchronisation, no allocation); returns the launch error or
// cudaErrorInvalidValue for an unsupported shape (see PagedDecodeSupported); workspace must be
// at least PagedDecodeWorkspaceBytes(...) bytes of device memory, or null when that is 0.
//
// Workspace contract (split contexts): the workspace must be ZERO-FILLED once before its first
// use (e.g. cudaMemsetAsync right after allocating it): its first 16 KiB hold the arrival
// counters of the fused split combine. Every launch that completes leaves those counters zero
// again, so a workspace can be reused by any later launch of any shape on the same stream
// without another memset. Do not use it for anything else in between, and never share one
// workspace between launches that may run concurrently (other streams).
//
// Launch overlap: every schedule except kV2 launches its kernels with programmatic dependent
// launch (PDL). The kernels wait (griddepcontrol.wait) for the previous work in the stream to
// complete before they read or write any memory, so stream order semantics are unchanged; only
// the launch itself overlaps the tail of the previous kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernels/paged_attention_params.h"

namespace kvstream::kernels {

// Workspace the launch needs (0: none, workspace may be null). Depends on the shape, the split
// plan and the current device's SM count; identical for both prefetch variants.
size_t PagedDecodeWorkspaceBytes(const PagedDecodeParams& p);
// How many CTAs each sequence's context is split over (1: no combine kernel), 0 if unsupported.
int PagedDecodeNumSplits(const PagedDecodeParams& p);
// The schedule a launch with these params runs (kAuto resolved; a wide schedule at head 256 or
// for an uneven batch runs its 4-warp counterpart; a fused one with more than 4096
// (sequence, KV head) pairs its kernel-combine counterpart; a cluster one with one split, more
// than 16 splits, or clusters the device cannot hold all at once, its kernel-combine
// counterpart). kV2 for unsupported shapes.
Schedule PagedDecodeResolvedSchedule(const PagedDecodeParams& p);
// CTAs per thread-block cluster the launch uses (1: no cluster), 0 if unsupported.
int PagedDecodeClusterSize(const PagedDecodeParams& p);

// Everything a launch with these params would run, planned on the current device (the queries
// above each report one field of it); see PagedDecodePlanInfo.
PagedDecodePlanInfo PagedDecodeDescribe(const PagedDecodeParams& p);
// Enqueues the decode attention on `stream` (one kernel, plus a combine kernel when the
// context is split and the schedule does not fuse the merge). Both prefetch variants of a
// schedule compute bit-identical outputs.
cudaError_t PagedDecodeAttention(const PagedDecodeParams& p, cudaStream_t stream);

}  // namespace kvstream::kernels
