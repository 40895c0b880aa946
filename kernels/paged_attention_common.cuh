// Device building blocks shared by the paged decode-attention kernels (paged_attention_decode.cuh,
// paged_attention_merge.cuh, paged_attention_combine.cuh): the kernel arguments, element types,
// the tensor-core product, PDL controls and the CTA resource sizes. Included only by
// paged_attention.cu (one translation unit holds every kernel and launcher).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/paged_attention_plan.h"

namespace kvstream::kernels::paged_decode {

// The main kernel's arguments (passed by value in the kernel's constant bank).
// Memory it addresses (row-major, no padding; T = half or bf16):
//   q, out:        [num_seqs][num_heads][D] T
//   kv:            [num_blocks][2 (K, V)][num_kv_heads][block_size][D] T   (one layer of the pool)
//   block_tables:  [num_seqs][max_blocks_per_seq] int32, context_lens: [num_seqs] int32
//   workspace (paged_attention_plan.h, WorkspaceLayout), only with num_splits > 1 and no cluster:
//     counters:    [num_seqs][num_kv_heads * head_chunks] unsigned (fused merge arrivals)
//     ws_o:        [num_seqs][num_heads][num_splits][D] float (normalised partial outputs)
//     ws_lse:      [num_seqs][num_heads][num_splits] float (log2(sum exp2) of each partial)
// Grid: x = split (or cluster rank), y = KV head x head chunk, z = sequence.
struct KernelArgs {
  void* out;
  const void* q;
  const void* kv;
  const int32_t* block_tables;
  const int32_t* context_lens;
  float* ws_o;    // [num_seqs][num_heads][num_splits][head_dim], normalised partial outputs
  float* ws_lse;  // [num_seqs][num_heads][num_splits], log2(sum exp2) of each partial
  int num_heads;
  int num_kv_heads;
  int group;        // query heads per KV head
  int head_chunks;  // ceil(group / 8)
  int block_size;
  int max_blocks_per_seq;
  int num_splits;
  int units_per_split;
  int prefetch_distance;  // in warp strides
  float scale_log2;       // scale * log2(e)
  unsigned* counters;     // fused combine: [num_seqs][num_kv_heads * head_chunks], zero between launches
  int fused;              // the last CTA of each (sequence, KV head, chunk) merges the splits
  int trigger;            // let the next PDL-launched grid be scheduled from this grid's start
  int early_units;        // 0..kMaxEarlyUnits: first units per warp prefetched before the wait
  int num_blocks;         // pool size in blocks (bounds the early prefetch's addresses)
  int cluster;            // CTAs per cluster (all splits, merged through DSMEM); 1 = no cluster
  int bulk_prefetch;      // in-loop prefetch: cp.async.bulk (sm_90 paths) or line by line
};

template <bool kBf16>
using Elem = std::conditional_t<kBf16, __nv_bfloat16, __half>;

template <bool kBf16>
__device__ __forceinline__ void Mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  if constexpr (kBf16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ uint32_t Word(const uint4& v, int i) {
  return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

// Lets the dependent (combine) grid be scheduled once every CTA of this grid has started; its
// griddepcontrol.wait still waits for this grid's completion and memory. PDL is sm_90 code: the
// sm_80/sm_89 images compile these two to nothing (those launches are never PDL launches), and
// on sm_90 they do nothing in a grid that was not launched with PDL.
__device__ __forceinline__ void AllowDependentLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void WaitPrimaryGrid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

template <bool kBf16>
__device__ __forceinline__ float ToF(Elem<kBf16> x) {
  if constexpr (kBf16) {
    return __bfloat162float(x);
  } else {
    return __half2float(x);
  }
}
template <bool kBf16>
__device__ __forceinline__ Elem<kBf16> FromF(float x) {
  if constexpr (kBf16) {
    return __float2bfloat16_rn(x);
  } else {
    return __float2half_rn(x);
  }
}

// 128 registers at head 128 (4 CTAs = 16 warps per SM), both variants alike; the 16-warp CTA
// (head <= 128 only) gets the same 128 registers with one CTA per SM.
constexpr int MinCtasPerSm(int d, int warps) {
  return warps == kWideWarps ? 1 : (d <= 64 ? 5 : (d <= 128 ? 4 : 1));
}
// Dynamic shared memory of a CTA: the warps' (unnormalised) O for the CTA merge, reused by the
// fused combine for the split weights and the per-thread partial sums.
constexpr size_t OSmemBytes(int d, int warps) { return size_t(warps) * 8 * d * sizeof(float); }
// Cluster schedules add the CTA's merged output [8][d] and its per-head lse [8] after it, read
// by the other CTAs of the cluster.
constexpr size_t ClusterSmemBytes(int d) { return size_t(kHeadsPerCta) * (d + 1) * sizeof(float); }
// The kernel's dynamic shared-memory attribute: the largest size any schedule launches it with
// (set to this one value wherever it is set, so that no setter shrinks another's launch).
constexpr size_t MaxSmemBytes(int d, int warps) { return OSmemBytes(d, warps) + ClusterSmemBytes(d); }

}  // namespace kvstream::kernels::paged_decode
