// Scatter-copy kernel templates (scatter_copy.h says what each launch guarantees; the launchers
// are in scatter_copy.cu). Every kernel copies 16-byte words when the run, its addresses and
// its length allow, keeping kUnroll loads per thread in flight before the stores.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/scatter_copy.h"

namespace kvstream::kernels::scatter {

// Reads table entry blockIdx.x once per CTA into shared memory (it may sit in host memory
// across PCIe). Plain words, not CopyRun (whose member initialisers must not run per thread).
__device__ __forceinline__ void LoadRun(const CopyRun* __restrict__ table, uint64_t* run) {
  if (threadIdx.x == 0) {
    run[0] = table[blockIdx.x].src;
    run[1] = table[blockIdx.x].dst;
    run[2] = table[blockIdx.x].length;
  }
  __syncthreads();
}

// The CTA copies len bytes: 16-byte words, several independent loads in flight per thread
// before the stores, where addresses and length allow; bytes otherwise.
template <int kThreads, int kUnroll>
__device__ __forceinline__ void CopyBytes(uint64_t src, uint64_t dst, uint64_t len) {
  if (((src | dst | len) & 15u) == 0) {
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    const uint64_t n = len / 16;
    uint64_t i = threadIdx.x;
    for (; i + (kUnroll - 1) * kThreads < n; i += kUnroll * kThreads) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = s[i + u * kThreads];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) d[i + u * kThreads] = v[u];
    }
    for (; i < n; i += kThreads) d[i] = s[i];
  } else {
    const unsigned char* s = reinterpret_cast<const unsigned char*>(src);
    unsigned char* d = reinterpret_cast<unsigned char*>(dst);
    for (uint64_t i = threadIdx.x; i < len; i += kThreads) d[i] = s[i];
  }
}

// The CTA copies n 16-byte words: kUnroll predicated loads per thread before the stores.
template <int kThreads, int kUnroll>
__device__ __forceinline__ void CopyWords(const uint4* __restrict__ s, uint4* __restrict__ d,
                                          uint32_t n) {
  for (uint32_t base = threadIdx.x; base < n; base += kThreads * kUnroll) {
    uint4 v[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const uint32_t i = base + j * kThreads;
      if (i < n) v[j] = s[i];
    }
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const uint32_t i = base + j * kThreads;
      if (i < n) d[i] = v[j];
    }
  }
}

// Memory-table kernel: one CTA per table entry (table in device or mapped pinned host memory).
template <int kThreads, int kUnroll>
__global__ void ScatterCopyKernel(const CopyRun* __restrict__ table) {
  __shared__ uint64_t run[3];
  LoadRun(table, run);
  CopyBytes<kThreads, kUnroll>(run[0], run[1], run[2]);
}

// Memory-table kernel, 2-D: CTA (x, y) copies piece y (piece_bytes long) of entry x.
template <int kPieceThreads, int kUnroll>
__global__ void __launch_bounds__(kPieceThreads)
ScatterCopyPiecesKernel(const CopyRun* __restrict__ table, uint64_t piece_bytes) {
  __shared__ uint64_t run[3];
  LoadRun(table, run);
  const uint64_t off = uint64_t(blockIdx.y) * piece_bytes;
  if (off >= run[2]) return;
  const uint64_t len = run[2] - off < piece_bytes ? run[2] - off : piece_bytes;
  CopyBytes<kPieceThreads, kUnroll>(run[0] + off, run[1] + off, len);
}

// ---- parameter-table kernel: the packed runs travel in the launch parameters ----------------
// Layout: [src_base u64][dst_base u64][pieces_per_run u32][units u32][kCap x PackedRun (3 x u32)]
template <int kCap>
struct ParamTable {
  uint64_t src_base;
  uint64_t dst_base;
  uint32_t pieces_per_run;  // k: every run is cut into k near-equal pieces (no empty units)
  uint32_t units;           // runs * k
  PackedRun run[kCap];
};
static_assert(sizeof(ParamTable<kParamTableCapacity>) <= 4096, "CUDA < 12.1 parameter limit");

// One work unit per CTA iteration: piece p of run r, where run r is cut into k pieces of
// ceil(len / k) 16-byte units (a longer run gets longer pieces rather than idle CTAs). Every
// thread issues kUnroll predicated 16-byte loads before its stores, so a CTA keeps
// kThreads * kUnroll * 16 B in flight.
template <int kThreads, int kUnroll, int kCap>
__global__ void __launch_bounds__(kThreads)
ParamScatterKernel(const __grid_constant__ ParamTable<kCap> t) {
  const uint32_t k = t.pieces_per_run;
  for (uint32_t u = blockIdx.x; u < t.units; u += gridDim.x) {
    const uint32_t r = u / k;
    const uint32_t p = u - r * k;
    const PackedRun pr = t.run[r];
    const uint32_t piece = static_cast<uint32_t>((uint64_t(pr.len16) + k - 1) / k);
    const uint64_t off = uint64_t(p) * piece;
    if (off >= pr.len16) continue;  // a run shorter than k units
    const uint64_t left = pr.len16 - off;
    const uint32_t n = static_cast<uint32_t>(left < piece ? left : piece);
    const uint4* __restrict__ s =
        reinterpret_cast<const uint4*>(t.src_base) + (uint64_t(pr.src16) + off);
    uint4* __restrict__ d = reinterpret_cast<uint4*>(t.dst_base) + (uint64_t(pr.dst16) + off);
    CopyWords<kThreads, kUnroll>(s, d, n);
  }
}

// ---- block-table kernel: fixed-size units, (source unit, destination unit) pairs -----------
// Layout: [src_base u64][dst_base u64][unit16, k, piece16, units: u32][kCap x (src, dst) u32]
// Plain words (no member initialisers): a parameter block is filled only up to the entries used.
struct RawEntry {
  uint32_t src, dst;
};
static_assert(sizeof(RawEntry) == sizeof(BlockEntry));

template <int kCap>
struct BlockParams {
  uint64_t src_base;
  uint64_t dst_base;
  uint32_t unit16;   // unit bytes / 16
  uint32_t k;        // pieces per unit
  uint32_t piece16;  // ceil(unit16 / k)
  uint32_t units;    // entries * k
  RawEntry e[kCap];
};
static_assert(sizeof(BlockParams<kBlockTableSmallEntries>) <= 4096, "CUDA < 12.1 parameter limit");
static_assert(sizeof(BlockParams<kBlockTableMaxEntries>) <= 32764, "CUDA >= 12.1 parameter limit");

// Work unit u: piece (u % k) of entry (u / k). Same inner loop as ParamScatterKernel: kUnroll
// predicated 16-byte loads in flight per thread before the stores.
template <int kThreads, int kUnroll, int kCap>
__global__ void __launch_bounds__(kThreads)
BlockScatterKernel(const __grid_constant__ BlockParams<kCap> t) {
  const uint32_t k = t.k;
  for (uint32_t u = blockIdx.x; u < t.units; u += gridDim.x) {
    const uint32_t e = u / k;
    const uint32_t p = u - e * k;
    const RawEntry ix = t.e[e];
    const uint64_t off = uint64_t(p) * t.piece16;
    if (off >= t.unit16) continue;  // the last of k pieces can be empty
    const uint64_t left = t.unit16 - off;
    const uint32_t n = static_cast<uint32_t>(left < t.piece16 ? left : t.piece16);
    const uint4* __restrict__ s =
        reinterpret_cast<const uint4*>(t.src_base) + (uint64_t(ix.src) * t.unit16 + off);
    uint4* __restrict__ d = reinterpret_cast<uint4*>(t.dst_base) + (uint64_t(ix.dst) * t.unit16 + off);
    CopyWords<kThreads, kUnroll>(s, d, n);
  }
}

}  // namespace kvstream::kernels::scatter
