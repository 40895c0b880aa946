#include "transport/cuda_ipc/scatter_copy.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

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

// ---- parameter-table kernel ----------------------------------------------------------------
namespace {

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
}

template <int kThreads, int kUnroll>
cudaError_t LaunchChunk(const PackedTable& table, const PackedTable::Chunk& c, uint32_t k,
                        uint32_t max_ctas, cudaStream_t stream) {
  ParamTable<kParamTableCapacity> t;  // only the used entries are filled
  t.src_base = c.src_base;
  t.dst_base = c.dst_base;
  t.pieces_per_run = k;
  const uint64_t units = uint64_t(c.count) * k;
  if (units > 0x7fffffffu) return cudaErrorInvalidValue;
  t.units = static_cast<uint32_t>(units);
  std::memcpy(t.run, table.runs.data() + c.first, c.count * sizeof(PackedRun));
  uint32_t grid = t.units;
  if (max_ctas != 0 && grid > max_ctas) grid = max_ctas;
  ParamScatterKernel<kThreads, kUnroll, kParamTableCapacity><<<grid, kThreads, 0, stream>>>(t);
  return cudaGetLastError();
}

using ChunkLauncher = cudaError_t (*)(const PackedTable&, const PackedTable::Chunk&, uint32_t,
                                      uint32_t, cudaStream_t);

// The (threads, unroll) shapes the parameter-table and block-table kernels are built for, in one
// list: f.template operator()<threads, unroll>() for each until one returns true (PickLauncher,
// PickBlockLauncher and PreloadScatterKernels all walk it).
template <class F>
bool ForEachKernelShape(F&& f) {
  return f.template operator()<128, 4>() || f.template operator()<256, 4>() ||
         f.template operator()<512, 4>() || f.template operator()<128, 8>() ||
         f.template operator()<256, 8>() || f.template operator()<512, 8>();
}

ChunkLauncher PickLauncher(int threads, int unroll) {
  ChunkLauncher out = nullptr;
  ForEachKernelShape([&]<int kThreads, int kUnroll>() {
    if (kThreads == threads && kUnroll == unroll) out = &LaunchChunk<kThreads, kUnroll>;
    return out != nullptr;
  });
  return out;
}

}  // namespace

bool PackRuns(const CopyRun* runs, size_t n, uint64_t split_bytes, PackedTable* out) {
  out->clear();
  constexpr uint64_t kMaxUnits = 0xffffffffull;
  if (split_bytes % 16 != 0) return false;
  for (size_t i = 0; i < n; ++i) {
    if (((runs[i].src | runs[i].dst | runs[i].length) & 15u) != 0) return false;
  }
  // Runs as they are, or first cut into pieces of at most split_bytes.
  const CopyRun* pieces = runs;
  size_t count_all = n;
  if (split_bytes != 0) {
    out->pieces.clear();
    for (size_t i = 0; i < n; ++i) {
      const CopyRun& r = runs[i];
      for (uint64_t off = 0; off < r.length; off += split_bytes) {
        out->pieces.push_back({r.src + off, r.dst + off, std::min(split_bytes, r.length - off)});
      }
    }
    pieces = out->pieces.data();
    count_all = out->pieces.size();
  }
  out->runs.resize(count_all);
  for (size_t first = 0; first < count_all; first += kParamTableCapacity) {
    const size_t count = std::min(kParamTableCapacity, count_all - first);
    PackedTable::Chunk c;
    c.first = first;
    c.count = count;
    c.src_base = pieces[first].src;
    c.dst_base = pieces[first].dst;
    for (size_t i = first; i < first + count; ++i) {
      c.src_base = std::min(c.src_base, pieces[i].src);
      c.dst_base = std::min(c.dst_base, pieces[i].dst);
    }
    for (size_t i = first; i < first + count; ++i) {
      const CopyRun& r = pieces[i];
      const uint64_t s16 = (r.src - c.src_base) / 16, d16 = (r.dst - c.dst_base) / 16;
      const uint64_t l16 = r.length / 16;
      if (s16 > kMaxUnits || d16 > kMaxUnits || l16 > kMaxUnits) {
        out->clear();
        return false;
      }
      out->runs[i] = {static_cast<uint32_t>(s16), static_cast<uint32_t>(d16),
                      static_cast<uint32_t>(l16)};
      c.longest16 = std::max(c.longest16, l16);
      c.bytes += r.length;
      out->bytes += r.length;
    }
    out->chunks.push_back(c);
  }
  return true;
}

uint64_t PlanPieceBytes(uint64_t total, const ParamKernelConfig& cfg) {
  const uint64_t batch = uint64_t(cfg.threads) * cfg.unroll * 16;
  uint64_t piece = kScatterPieceBytes;
  while (piece > 16 * 1024 && total / piece < 2048) piece /= 2;
  return std::max(piece, batch);
}

uint32_t PiecesPerRun(uint64_t chunk_bytes, size_t runs, uint64_t piece_bytes) {
  if (runs == 0 || piece_bytes == 0) return 1;
  const uint64_t mean = chunk_bytes / runs;
  const uint64_t k = (mean + piece_bytes / 2) / piece_bytes;  // nearest, at least 1
  return static_cast<uint32_t>(std::min<uint64_t>(std::max<uint64_t>(k, 1), 65535));
}

uint64_t ParamSplitBytes(const CopyRun* runs, size_t n, const ParamKernelConfig& cfg) {
  if (n == 0) return 0;
  uint64_t total = 0, longest = 0;
  for (size_t i = 0; i < n; ++i) {
    total += runs[i].length;
    longest = std::max(longest, runs[i].length);
  }
  const uint64_t piece = cfg.piece_bytes != 0 ? cfg.piece_bytes : PlanPieceBytes(total, cfg);
  // Even enough: the longest run's pieces are at most ~4x the mean run's. Else cut on the host.
  return longest > 4 * (total / n) + piece ? piece : 0;
}

Status LaunchParamScatterCopy(const PackedTable& table, const ParamKernelConfig& cfg,
                              cudaStream_t stream) {
  ChunkLauncher launch = PickLauncher(cfg.threads, cfg.unroll);
  if (launch == nullptr) return InvalidArgument("scatter copy: unsupported threads/unroll");
  const uint64_t piece = cfg.piece_bytes != 0 ? cfg.piece_bytes : PlanPieceBytes(table.bytes, cfg);
  if (piece % 16 != 0) return InvalidArgument("scatter copy: piece_bytes must be a multiple of 16");
  for (const PackedTable::Chunk& c : table.chunks) {
    cudaError_t err = launch(table, c, PiecesPerRun(c.bytes, c.count, piece), cfg.max_ctas, stream);
    if (err != cudaSuccess) return CudaStatus(err, "ParamScatterKernel launch");
  }
  return OkStatus();
}

// ---- block-table kernel ----------------------------------------------------------------------
namespace {

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
}

struct BlockLaunch {
  uint64_t src_base, dst_base;
  uint32_t unit16, k, piece16;
  uint32_t max_ctas;
};

template <int kThreads, int kUnroll, int kCap>
cudaError_t LaunchBlockCap(const BlockLaunch& l, const BlockEntry* e, size_t n,
                           cudaStream_t stream) {
  BlockParams<kCap> t;  // only the used entries are filled
  t.src_base = l.src_base;
  t.dst_base = l.dst_base;
  t.unit16 = l.unit16;
  t.k = l.k;
  t.piece16 = l.piece16;
  t.units = static_cast<uint32_t>(n * l.k);
  std::memcpy(t.e, e, n * sizeof(RawEntry));
  uint32_t grid = t.units;
  if (l.max_ctas != 0 && grid > l.max_ctas) grid = l.max_ctas;
  BlockScatterKernel<kThreads, kUnroll, kCap><<<grid, kThreads, 0, stream>>>(t);
  return cudaGetLastError();
}

// One launch of n <= BlockTableLaunchCapacity() entries, in the smallest parameter block that
// holds them.
template <int kThreads, int kUnroll>
cudaError_t LaunchBlockChunk(const BlockLaunch& l, const BlockEntry* e, size_t n,
                             cudaStream_t stream) {
  if (n <= kBlockTableSmallEntries) return LaunchBlockCap<kThreads, kUnroll, kBlockTableSmallEntries>(l, e, n, stream);
#if CUDART_VERSION >= 12010
  if (n <= 1020) return LaunchBlockCap<kThreads, kUnroll, 1020>(l, e, n, stream);
  if (n <= 2044) return LaunchBlockCap<kThreads, kUnroll, 2044>(l, e, n, stream);
  if (n <= kBlockTableMaxEntries) return LaunchBlockCap<kThreads, kUnroll, kBlockTableMaxEntries>(l, e, n, stream);
#endif
  return cudaErrorInvalidValue;
}

using BlockLauncher = cudaError_t (*)(const BlockLaunch&, const BlockEntry*, size_t, cudaStream_t);

BlockLauncher PickBlockLauncher(int threads, int unroll) {
  BlockLauncher out = nullptr;
  ForEachKernelShape([&]<int kThreads, int kUnroll>() {
    if (kThreads == threads && kUnroll == unroll) out = &LaunchBlockChunk<kThreads, kUnroll>;
    return out != nullptr;
  });
  return out;
}

// The parameter-table kernel and the block-table kernel at every capacity LaunchBlockChunk picks.
template <int kThreads, int kUnroll>
cudaError_t PreloadShape() {
  cudaFuncAttributes a;
  cudaError_t e = cudaFuncGetAttributes(&a, ParamScatterKernel<kThreads, kUnroll, kParamTableCapacity>);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, BlockScatterKernel<kThreads, kUnroll, kBlockTableSmallEntries>);
#if CUDART_VERSION >= 12010
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, BlockScatterKernel<kThreads, kUnroll, 1020>);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, BlockScatterKernel<kThreads, kUnroll, 2044>);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, BlockScatterKernel<kThreads, kUnroll, kBlockTableMaxEntries>);
#endif
  return e;
}

}  // namespace

Status PreloadScatterKernels() {
  cudaFuncAttributes a;
  cudaError_t e = cudaFuncGetAttributes(&a, ScatterCopyKernel);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, ScatterCopyPiecesKernel);
  // Every (threads, unroll) PickLauncher / PickBlockLauncher accepts; stops at the first error.
  if (e == cudaSuccess) {
    ForEachKernelShape([&]<int kThreads, int kUnroll>() {
      e = PreloadShape<kThreads, kUnroll>();
      return e != cudaSuccess;
    });
  }
  if (e != cudaSuccess) return CudaStatus(e, "loading the scatter-copy kernels");
  return OkStatus();
}

size_t BlockTableLaunchCapacity() {
#if CUDART_VERSION >= 12010
  // Parameters beyond 4 KiB need a 12.1 driver as well as the runtime.
  static const size_t capacity = [] {
    int v = 0;
    return cudaDriverGetVersion(&v) == cudaSuccess && v >= 12010 ? kBlockTableMaxEntries
                                                                 : kBlockTableSmallEntries;
  }();
  return capacity;
#else
  return kBlockTableSmallEntries;
#endif
}

Status LaunchBlockScatterCopy(uint64_t src_base, uint64_t dst_base, uint64_t unit_bytes,
                              const BlockEntry* entries, size_t n, const ParamKernelConfig& cfg,
                              cudaStream_t stream) {
  if (n == 0) return OkStatus();
  BlockLauncher launch = PickBlockLauncher(cfg.threads, cfg.unroll);
  if (launch == nullptr) return InvalidArgument("scatter copy: unsupported threads/unroll");
  if (((src_base | dst_base | unit_bytes) & 15u) != 0 || unit_bytes == 0 ||
      unit_bytes / 16 > 0xffffffffull) {
    return InvalidArgument("scatter copy: block bases and unit must be multiples of 16 (unit < 64 GiB)");
  }
  const uint64_t total = unit_bytes * n;
  const uint64_t piece = cfg.piece_bytes != 0 ? cfg.piece_bytes : PlanPieceBytes(total, cfg);
  if (piece == 0 || piece % 16 != 0) {
    return InvalidArgument("scatter copy: piece_bytes must be a positive multiple of 16");
  }
  BlockLaunch l;
  l.src_base = src_base;
  l.dst_base = dst_base;
  l.unit16 = static_cast<uint32_t>(unit_bytes / 16);
  uint64_t k = (unit_bytes + piece / 2) / piece;  // nearest, at least 1, never an empty piece
  k = std::min<uint64_t>(std::max<uint64_t>(k, 1), std::min<uint64_t>(l.unit16, 65535));
  l.k = static_cast<uint32_t>(k);
  l.piece16 = static_cast<uint32_t>((uint64_t(l.unit16) + k - 1) / k);
  l.max_ctas = cfg.max_ctas;
  const size_t cap = BlockTableLaunchCapacity();
  for (size_t first = 0; first < n; first += cap) {
    const size_t count = std::min(cap, n - first);
    if (uint64_t(count) * k > 0x7fffffffull) return InvalidArgument("scatter copy: too many pieces");
    cudaError_t err = launch(l, entries + first, count, stream);
    if (err != cudaSuccess) return CudaStatus(err, "BlockScatterKernel launch");
  }
  return OkStatus();
}

bool ParseParamKernelConfig(const char* text, ParamKernelConfig* out) {
  ParamKernelConfig c = *out;
  const char* p = text;
  while (*p != 0) {
    const char key = *p++;
    char* end = nullptr;
    const unsigned long long v = std::strtoull(p, &end, 10);
    if (end == p) return false;
    p = end;
    switch (key) {
      case 't': c.threads = static_cast<int>(v); break;
      case 'u': c.unroll = static_cast<int>(v); break;
      case 'p': c.piece_bytes = v * 1024; break;
      case 'c': c.max_ctas = static_cast<uint32_t>(v); break;
      default: return false;
    }
  }
  if (PickLauncher(c.threads, c.unroll) == nullptr) return false;
  *out = c;
  return true;
}

ParamKernelConfig ParamKernelConfigFromEnv() {
  ParamKernelConfig c;
  const char* v = std::getenv("KVSTREAM_CUDA_IPC_KERNEL");
  if (v != nullptr && !ParseParamKernelConfig(v, &c)) c = ParamKernelConfig{};
  return c;
}

}  // namespace kvstream::transport::cuda
