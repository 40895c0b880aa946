#include "transport/cuda_ipc/scatter_copy.h"

#include "transport/cuda_ipc/cuda_util.h"

namespace kvstream::transport::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 4;

__global__ void ScatterCopyKernel(const CopyRun* __restrict__ table) {
  // Read the entry once per CTA (it may sit in host memory across PCIe).
  // Plain words, not CopyRun (whose member initialisers must not run per thread here).
  __shared__ uint64_t run[3];
  if (threadIdx.x == 0) {
    run[0] = table[blockIdx.x].src;
    run[1] = table[blockIdx.x].dst;
    run[2] = table[blockIdx.x].length;
  }
  __syncthreads();
  const uint64_t src = run[0], dst = run[1], len = run[2];
  if (((src | dst | len) & 15u) == 0) {
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    const uint64_t n = len / 16;
    uint64_t i = threadIdx.x;
    // Several independent 16-byte loads in flight per thread before the stores.
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

// 256 threads x 4 x 16 B = 16 KiB per CTA pass: a 16-64 KiB piece is 1-4 passes, and up to
// eight such CTAs fit one SM, so a launch of a few thousand pieces keeps HBM busy.
constexpr int kPieceThreads = 256;

__global__ void __launch_bounds__(kPieceThreads)
ScatterCopyPiecesKernel(const CopyRun* __restrict__ table, uint64_t piece_bytes) {
  __shared__ uint64_t run[3];
  if (threadIdx.x == 0) {
    run[0] = table[blockIdx.x].src;
    run[1] = table[blockIdx.x].dst;
    run[2] = table[blockIdx.x].length;
  }
  __syncthreads();
  const uint64_t off = uint64_t(blockIdx.y) * piece_bytes;
  if (off >= run[2]) return;
  const uint64_t src = run[0] + off, dst = run[1] + off;
  const uint64_t len = run[2] - off < piece_bytes ? run[2] - off : piece_bytes;
  if (((src | dst | len) & 15u) == 0) {
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    const uint64_t n = len / 16;
    uint64_t i = threadIdx.x;
    for (; i + (kUnroll - 1) * kPieceThreads < n; i += kUnroll * kPieceThreads) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = s[i + u * kPieceThreads];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) d[i + u * kPieceThreads] = v[u];
    }
    for (; i < n; i += kPieceThreads) d[i] = s[i];
  } else {
    const unsigned char* s = reinterpret_cast<const unsigned char*>(src);
    unsigned char* d = reinterpret_cast<unsigned char*>(dst);
    for (uint64_t i = threadIdx.x; i < len; i += kPieceThreads) d[i] = s[i];
  }
}

}  // namespace

Status LaunchScatterCopyPieces(const CopyRun* table, size_t runs, uint64_t piece_bytes,
                               uint32_t pieces_per_run, cudaStream_t stream) {
  if (runs == 0) return OkStatus();
  if (runs > 0x7fffffffu || pieces_per_run == 0 || pieces_per_run > 65535u || piece_bytes == 0 ||
      piece_bytes % 16 != 0) {
    return InvalidArgument("scatter copy: launch shape out of range");
  }
  dim3 grid(static_cast<unsigned>(runs), pieces_per_run);
  ScatterCopyPiecesKernel<<<grid, kPieceThreads, 0, stream>>>(table, piece_bytes);
  return CudaStatus(cudaGetLastError(), "ScatterCopyPiecesKernel launch");
}

size_t ScatterTableEntries(const CopyRun* runs, size_t n) {
  size_t entries = 0;
  for (size_t i = 0; i < n; ++i) {
    entries += (runs[i].length + kScatterPieceBytes - 1) / kScatterPieceBytes;
  }
  return entries;
}

size_t SplitRuns(const CopyRun* runs, size_t n, CopyRun* table) {
  size_t k = 0;
  for (size_t i = 0; i < n; ++i) {
    for (uint64_t off = 0; off < runs[i].length; off += kScatterPieceBytes) {
      uint64_t len = runs[i].length - off;
      if (len > kScatterPieceBytes) len = kScatterPieceBytes;
      table[k++] = CopyRun{runs[i].src + off, runs[i].dst + off, len};
    }
  }
  return k;
}

Status LaunchScatterCopy(const CopyRun* table, size_t entries, cudaStream_t stream) {
  if (entries == 0) return OkStatus();
  if (entries > 0x7fffffffu) return InvalidArgument("scatter copy: too many runs");
  ScatterCopyKernel<<<static_cast<unsigned>(entries), kThreads, 0, stream>>>(table);
  return CudaStatus(cudaGetLastError(), "ScatterCopyKernel launch");
}

}  // namespace kvstream::transport::cuda
