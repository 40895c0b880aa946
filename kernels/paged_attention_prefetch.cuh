// L2 prefetch helpers of the paged decode kernel (sm_90 cp.async.bulk.prefetch.L2), used by the
// in-loop prefetch variant (the unit `distance` warp strides ahead) and by the early prefetch of
// a warp's first units before the PDL wait (paged_attention_decode.cuh). Hints only: nothing is
// read through them. Included only by paged_attention.cu.
#pragma once

#include "kernels/paged_attention_common.cuh"

namespace kvstream::kernels::paged_decode {

// HBM -> L2 bulk prefetch (sm_90). The address must be 16-byte aligned and the size a multiple
// of 16: every tile is block-aligned and 16 * head_dim * 2 bytes long (2, 4 or 8 KiB).
__device__ __forceinline__ void PrefetchL2(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(__cvta_generic_to_global(p)),
               "r"(bytes)
               : "memory");
#endif
}

// A unit's K tile at `kp` and its V tile `v_offset` elements after it.
template <typename T>
__device__ __forceinline__ void PrefetchUnitL2(const T* kp, size_t v_offset, uint32_t tile_bytes) {
  PrefetchL2(kp, tile_bytes);
  PrefetchL2(kp + v_offset, tile_bytes);
}

}  // namespace kvstream::kernels::paged_decode
