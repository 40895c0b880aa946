// L2 prefetch helpers of the paged decode kernel, used by the in-loop prefetch variant (the unit
// `distance` warp strides ahead) and by the early prefetch of a warp's first units before the PDL
// wait (paged_attention_decode.cuh). Hints only: nothing is read through them. The bulk prefetch
// (cp.async.bulk.prefetch.L2) is sm_90 code, compiled where __CUDA_ARCH__ >= 900 (the sm_90a
// SASS and the compute_90 PTX); the line-by-line one runs everywhere (docs/kernels.md, "GPUs
// and code paths"). Included only by paged_attention.cu.
#pragma once

#include "kernels/paged_attention_common.cuh"

namespace kvstream::kernels::paged_decode {

// HBM -> L2 bulk prefetch (sm_90; nothing in the sm_80/sm_89 images, which never run the early
// prefetch: it needs PDL). The address must be 16-byte aligned and the size a multiple of 16:
// every tile is block-aligned and 16 * head_dim * 2 bytes long (2, 4 or 8 KiB).
__device__ __forceinline__ void PrefetchL2(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(__cvta_generic_to_global(p)),
               "r"(bytes)
               : "memory");
#endif
}

// The same tile with one prefetch.global.L2 per 128-byte line (any GPU): the fallback.
__device__ __forceinline__ void PrefetchL2Lines(const void* p, uint32_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (uint32_t off = 0; off < bytes; off += 128)
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(__cvta_generic_to_global(c + off)));
}

// A unit's K tile at `kp` and its V tile `v_offset` elements after it (bulk: the sm_90 path).
template <typename T>
__device__ __forceinline__ void PrefetchUnitL2(const T* kp, size_t v_offset, uint32_t tile_bytes,
                                               bool bulk) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (bulk) {
    PrefetchL2(kp, tile_bytes);
    PrefetchL2(kp + v_offset, tile_bytes);
    return;
  }
#endif
  PrefetchL2Lines(kp, tile_bytes);
  PrefetchL2Lines(kp + v_offset, tile_bytes);
}

}  // namespace kvstream::kernels::paged_decode
