// Launchers of the scatter-copy kernels (scatter_copy.cuh): argument checks, launch shapes, and
// the table of (threads, unroll) shapes the kernels are built for.
#include "kernels/scatter_copy.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "kernels/scatter_copy.cuh"

namespace kvstream::kernels {
namespace {

using scatter::BlockParams;
using scatter::BlockScatterKernel;
using scatter::ParamScatterKernel;
using scatter::ParamTable;
using scatter::RawEntry;

// The memory-table kernels' shapes.
constexpr int kTableThreads = 512;
// 256 threads x 4 x 16 B = 16 KiB per CTA pass: a 16-64 KiB piece is 1-4 passes, and up to
// eight such CTAs fit one SM, so a launch of a few thousand pieces keeps HBM busy.
constexpr int kPieceThreads = 256;
constexpr int kTableUnroll = 4;

// kInternal "<what>: <cudaGetErrorName>: <cudaGetErrorString>", OK on cudaSuccess.
Status LaunchStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return OkStatus();
  return Internal(std::string(what) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
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
  scatter::ScatterCopyPiecesKernel<kPieceThreads, kTableUnroll>
      <<<grid, kPieceThreads, 0, stream>>>(table, piece_bytes);
  return LaunchStatus(cudaGetLastError(), "ScatterCopyPiecesKernel launch");
}

Status LaunchScatterCopy(const CopyRun* table, size_t entries, cudaStream_t stream) {
  if (entries == 0) return OkStatus();
  if (entries > 0x7fffffffu) return InvalidArgument("scatter copy: too many runs");
  scatter::ScatterCopyKernel<kTableThreads, kTableUnroll>
      <<<static_cast<unsigned>(entries), kTableThreads, 0, stream>>>(table);
  return LaunchStatus(cudaGetLastError(), "ScatterCopyKernel launch");
}

// ---- parameter-table kernel ----------------------------------------------------------------
namespace {

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

bool ScatterKernelShapeSupported(int threads, int unroll) {
  return PickLauncher(threads, unroll) != nullptr;
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

Status LaunchParamScatterCopy(const PackedTable& table, const ParamKernelConfig& cfg,
                              cudaStream_t stream) {
  ChunkLauncher launch = PickLauncher(cfg.threads, cfg.unroll);
  if (launch == nullptr) return InvalidArgument("scatter copy: unsupported threads/unroll");
  const uint64_t piece = cfg.piece_bytes != 0 ? cfg.piece_bytes : PlanPieceBytes(table.bytes, cfg);
  if (piece % 16 != 0) return InvalidArgument("scatter copy: piece_bytes must be a multiple of 16");
  for (const PackedTable::Chunk& c : table.chunks) {
    cudaError_t err = launch(table, c, PiecesPerRun(c.bytes, c.count, piece), cfg.max_ctas, stream);
    if (err != cudaSuccess) return LaunchStatus(err, "ParamScatterKernel launch");
  }
  return OkStatus();
}

// ---- block-table kernel ----------------------------------------------------------------------
namespace {

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
  cudaError_t e = cudaFuncGetAttributes(&a, scatter::ScatterCopyKernel<kTableThreads, kTableUnroll>);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, scatter::ScatterCopyPiecesKernel<kPieceThreads, kTableUnroll>);
  // Every (threads, unroll) PickLauncher / PickBlockLauncher accepts; stops at the first error.
  if (e == cudaSuccess) {
    ForEachKernelShape([&]<int kThreads, int kUnroll>() {
      e = PreloadShape<kThreads, kUnroll>();
      return e != cudaSuccess;
    });
  }
  if (e != cudaSuccess) return LaunchStatus(e, "loading the scatter-copy kernels");
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
    if (err != cudaSuccess) return LaunchStatus(err, "BlockScatterKernel launch");
  }
  return OkStatus();
}

}  // namespace kvstream::kernels
