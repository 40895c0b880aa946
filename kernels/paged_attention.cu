// Launchers of the paged decode attention (contract: paged_attention.h). The kernels are in
// paged_attention_{decode,merge,combine,prefetch,common,timeline}.cuh, the choice of what to
// launch in paged_attention_plan.{h,cc}; this file answers the planner's device questions from
// the CUDA runtime and enqueues the planned kernels. It is the one translation unit that holds
// the kernels (built twice: kvstream_kernels_attention, and with KVSTREAM_PA_TIMELINE=1
// kvstream_kernels_attention_timeline).
#include "kernels/paged_attention.h"
#include "kernels/code_paths.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "kernels/paged_attention_combine.cuh"
#include "kernels/paged_attention_decode.cuh"
#include "kernels/paged_attention_plan.h"
#include "kernels/paged_attention_timeline.cuh"
#include "kernels/paged_attention_timeline.h"

namespace kvstream::kernels {
namespace paged_decode {
namespace {

template <bool kBf16, int D, int W>
int CtasPerSm() {
  static const int n = [] {
    int v = 0;
    auto* k = PagedDecodeKernel<kBf16, D, false, W>;
    const size_t smem = OSmemBytes(D, W);
    // The occupancy of the plain schedules' size.
    if ((MaxSmemBytes(D, W) > 48 * 1024 &&
         cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(MaxSmemBytes(D, W))) !=
             cudaSuccess) ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, k, W * 32, smem) != cudaSuccess) {
      (void)cudaGetLastError();
      v = 0;
    }
    return std::max(v, 1);
  }();
  return n;
}

int CtasPerSmFor(DType dt, int d, int warps) {
  // Planned from the prefetch-off variant for both variants, so that both split a context the
  // same way and produce bit-identical outputs.
  const bool bf = dt == DType::kBF16;
  if (warps == kWideWarps) {
    if (d == 64) return bf ? CtasPerSm<true, 64, kWideWarps>() : CtasPerSm<false, 64, kWideWarps>();
    return bf ? CtasPerSm<true, 128, kWideWarps>() : CtasPerSm<false, 128, kWideWarps>();
  }
  switch (d) {
    case 64: return bf ? CtasPerSm<true, 64, kWarps>() : CtasPerSm<false, 64, kWarps>();
    case 128: return bf ? CtasPerSm<true, 128, kWarps>() : CtasPerSm<false, 128, kWarps>();
    default: return bf ? CtasPerSm<true, 256, kWarps>() : CtasPerSm<false, 256, kWarps>();
  }
}

// How many clusters of `cs` CTAs of the main kernel the device holds at once (0: none, or the
// query failed). Clusters of 16 are "non-portable" and need the kernel attribute set first.
template <bool kBf16, int D, int W>
int MaxActiveClusters(int cs) {
  static int cache[5] = {-1, -1, -1, -1, -1};  // cs = 1, 2, 4, 8, 16
  const int idx = cs == 16 ? 4 : (cs == 8 ? 3 : (cs == 4 ? 2 : (cs == 2 ? 1 : 0)));
  if (cache[idx] >= 0) return cache[idx];
  int n = 0;
  bool ok = true;
  for (auto* k : {PagedDecodeKernel<kBf16, D, false, W>, PagedDecodeKernel<kBf16, D, true, W>}) {
    const size_t smem = MaxSmemBytes(D, W);
    ok = ok && cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)) == cudaSuccess;
    if (cs > 8) ok = ok && cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess;
    if (!ok) break;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(cs);
    cfg.blockDim = dim3(W * 32);
    cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cs;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int v = 0;
    ok = cudaOccupancyMaxActiveClusters(&v, k, &cfg) == cudaSuccess;
    n = n == 0 ? v : std::min(n, v);
  }
  if (!ok) {
    (void)cudaGetLastError();
    n = 0;
  }
  cache[idx] = n;
  return n;
}

int MaxActiveClustersFor(DType dt, int d, int warps, int cs) {
  const bool bf = dt == DType::kBF16;
  if (warps == kWideWarps) {
    if (d == 64) return bf ? MaxActiveClusters<true, 64, kWideWarps>(cs) : MaxActiveClusters<false, 64, kWideWarps>(cs);
    return bf ? MaxActiveClusters<true, 128, kWideWarps>(cs) : MaxActiveClusters<false, 128, kWideWarps>(cs);
  }
  switch (d) {
    case 64: return bf ? MaxActiveClusters<true, 64, kWarps>(cs) : MaxActiveClusters<false, 64, kWarps>(cs);
    case 128: return bf ? MaxActiveClusters<true, 128, kWarps>(cs) : MaxActiveClusters<false, 128, kWarps>(cs);
    default: return bf ? MaxActiveClusters<true, 256, kWarps>(cs) : MaxActiveClusters<false, 256, kWarps>(cs);
  }
}

class CudaOccupancy final : public PlanOccupancy {
 public:
  int CtasPerSm(DType dtype, int head_dim, int warps) const override {
    return CtasPerSmFor(dtype, head_dim, warps);
  }
  int MaxActiveClusters(DType dtype, int head_dim, int warps, int cluster) const override {
    return MaxActiveClustersFor(dtype, head_dim, warps, cluster);
  }
};

// Whether device `dev` runs the sm_90 paths (kernels/code_paths.h). Asked once per device.
bool DeviceHasHopperPaths(int dev) {
  static std::atomic<int> known[64];  // 0 = not asked yet, 1 = no, 2 = yes
  if (dev >= 0 && dev < 64 && known[dev].load(std::memory_order_relaxed) != 0)
    return known[dev].load(std::memory_order_relaxed) == 2;
  const bool yes = DeviceRunsHopperCode(
      dev, reinterpret_cast<const void*>(PagedDecodeKernel<false, 128, false, kWarps>));
  if (dev >= 0 && dev < 64) known[dev].store(yes ? 2 : 1, std::memory_order_relaxed);
  return yes;
}

bool PlanFor(const PagedDecodeParams& p, Plan* plan) {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  const bool hopper = p.code_paths == CodePaths::kAuto && !FallbackForced() && DeviceHasHopperPaths(dev);
  *plan = MakePlan(p, sms, CudaOccupancy(), hopper);
  return true;
}

template <bool kBf16, int D, bool kPrefetch, int W>
cudaError_t LaunchMain(const KernelArgs& a, const Plan& plan, dim3 grid, cudaStream_t stream) {
  auto* k = PagedDecodeKernel<kBf16, D, kPrefetch, W>;
  const size_t smem = plan.cluster > 1 ? MaxSmemBytes(D, W) : OSmemBytes(D, W);
  if (MaxSmemBytes(D, W) > 48 * 1024) {
    static const cudaError_t attr_err =
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(MaxSmemBytes(D, W)));
    if (attr_err != cudaSuccess) return attr_err;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(W * 32);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (plan.pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (plan.cluster > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = unsigned(plan.cluster);
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, k, a);
}

template <bool kBf16, int D>
cudaError_t Launch(const PagedDecodeParams& p, const Plan& plan, bool prefetch,
                   cudaStream_t stream) {
  const WorkspaceLayout wl = LayoutFor(p, plan);
  char* ws = static_cast<char*>(p.workspace);
  KernelArgs a{};
  a.out = p.out;
  a.q = p.q;
  a.kv = p.kv_layer;
  a.block_tables = p.block_tables;
  a.context_lens = p.context_lens;
  a.ws_o = wl.total ? reinterpret_cast<float*>(ws + wl.o_offset) : nullptr;
  a.ws_lse = wl.total ? reinterpret_cast<float*>(ws + wl.lse_offset) : nullptr;
  a.counters = wl.total ? reinterpret_cast<unsigned*>(ws) : nullptr;
  a.fused = plan.fused ? 1 : 0;
  // kV2 lets only its combine kernel start early; the PDL schedules let whatever PDL-launched
  // grid comes next.
  a.trigger = plan.hopper_paths && (plan.pdl || plan.num_splits > 1);
  a.early_units = EarlyUnits(p, plan);
  a.num_blocks = p.num_blocks;
  a.num_heads = p.num_heads;
  a.num_kv_heads = p.num_kv_heads;
  a.group = p.num_heads / p.num_kv_heads;
  a.head_chunks = plan.head_chunks;
  a.block_size = p.block_size;
  a.max_blocks_per_seq = p.max_blocks_per_seq;
  a.num_splits = plan.num_splits;
  a.units_per_split = plan.units_per_split;
  a.prefetch_distance = p.prefetch_distance > 0 ? p.prefetch_distance : kDefaultPrefetchDistance;
  a.scale_log2 = p.scale * 1.4426950408889634f;
  a.cluster = plan.cluster;
  a.bulk_prefetch = plan.hopper_paths ? 1 : 0;
  // A cluster launch needs whole clusters: the CTAs past the last split find no units and
  // contribute nothing (lse -inf) to their cluster's merge.
  const dim3 grid(plan.cluster > 1 ? plan.cluster : plan.num_splits,
                  p.num_kv_heads * plan.head_chunks, p.num_seqs);
  cudaError_t err;
  if constexpr (D <= 128) {
    if (plan.warps == kWideWarps) {
      err = prefetch ? LaunchMain<kBf16, D, true, kWideWarps>(a, plan, grid, stream)
                     : LaunchMain<kBf16, D, false, kWideWarps>(a, plan, grid, stream);
    } else {
      err = prefetch ? LaunchMain<kBf16, D, true, kWarps>(a, plan, grid, stream)
                     : LaunchMain<kBf16, D, false, kWarps>(a, plan, grid, stream);
    }
  } else {
    err = prefetch ? LaunchMain<kBf16, D, true, kWarps>(a, plan, grid, stream)
                   : LaunchMain<kBf16, D, false, kWarps>(a, plan, grid, stream);
  }
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return err;
  }
  if (plan.num_splits == 1 || plan.fused || plan.cluster > 1) return cudaSuccess;

  // The combine kernel may start launching while the last CTAs of the main kernel drain; it
  // waits (griddepcontrol.wait) for the main grid's memory before reading the partials. (The
  // fallback paths launch it plainly, after the main grid.)
  cudaLaunchConfig_t cfg{};
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = plan.hopper_paths ? 1 : 0;
  cfg.blockDim = dim3(kCombineThreads);
  const unsigned rows = unsigned(p.num_seqs) * unsigned(p.num_heads);
  if (plan.num_splits <= kFewSplits) {
    const size_t threads = size_t(rows) * (p.head_dim / 4);
    cfg.gridDim = dim3(unsigned((threads + kCombineThreads - 1) / kCombineThreads));
    err = cudaLaunchKernelEx(&cfg, CombineFewSplitsKernel<kBf16>, p.out,
                             static_cast<const float*>(a.ws_o), static_cast<const float*>(a.ws_lse),
                             plan.num_splits, p.head_dim, int(rows));
  } else {
    auto* combine = plan.combine_dims == 128 ? CombineSplitsKernel<kBf16, 128> : CombineSplitsKernel<kBf16, 32>;
    cfg.gridDim = dim3(rows, unsigned(p.head_dim / plan.combine_dims));
    err = cudaLaunchKernelEx(&cfg, combine, p.out, static_cast<const float*>(a.ws_o),
                             static_cast<const float*>(a.ws_lse), plan.num_splits, p.head_dim);
  }
  if (err != cudaSuccess) (void)cudaGetLastError();
  return err;
}

}  // namespace
}  // namespace paged_decode

size_t PagedDecodeWorkspaceBytes(const PagedDecodeParams& p) { return PagedDecodeDescribe(p).workspace_bytes; }

int PagedDecodeNumSplits(const PagedDecodeParams& p) { return PagedDecodeDescribe(p).num_splits; }

int PagedDecodeClusterSize(const PagedDecodeParams& p) { return PagedDecodeDescribe(p).cluster; }

Schedule PagedDecodeResolvedSchedule(const PagedDecodeParams& p) { return PagedDecodeDescribe(p).schedule; }

PagedDecodePlanInfo PagedDecodeDescribe(const PagedDecodeParams& p) {
  PagedDecodePlanInfo info;
  if (!PagedDecodeSupported(p)) return info;
  info.supported = true;
  paged_decode::Plan plan;
  if (p.num_seqs == 0 || !paged_decode::PlanFor(p, &plan)) return info;
  return paged_decode::DescribePlan(p, plan);
}

cudaError_t PagedDecodeAttention(const PagedDecodeParams& p, cudaStream_t stream) {
  using namespace paged_decode;
  if (!PagedDecodeSupported(p)) return cudaErrorInvalidValue;
  if (p.num_seqs == 0) return cudaSuccess;
  Plan plan;
  if (!PlanFor(p, &plan)) return cudaErrorInvalidDevice;
  const WorkspaceLayout wl = LayoutFor(p, plan);
  if (wl.total > 0 && (p.workspace == nullptr || p.workspace_bytes < wl.total))
    return cudaErrorInvalidValue;
  const bool prefetch = InLoopPrefetch(p);
  const bool bf = p.dtype == DType::kBF16;
  switch (p.head_dim) {
    case 64: return bf ? Launch<true, 64>(p, plan, prefetch, stream) : Launch<false, 64>(p, plan, prefetch, stream);
    case 128: return bf ? Launch<true, 128>(p, plan, prefetch, stream) : Launch<false, 128>(p, plan, prefetch, stream);
    default: return bf ? Launch<true, 256>(p, plan, prefetch, stream) : Launch<false, 256>(p, plan, prefetch, stream);
  }
}

namespace timeline {
cudaError_t SetBuffer(unsigned long long* device_buffer) {
#ifdef KVSTREAM_PA_TIMELINE
  // Synchronous: launches queued after this call on any stream see the new buffer.
  const cudaError_t e = cudaMemcpyToSymbol(paged_decode::g_timeline, &device_buffer, sizeof(device_buffer));
  return e != cudaSuccess ? e : cudaDeviceSynchronize();
#else
  (void)device_buffer;
  return cudaErrorNotSupported;
#endif
}
}  // namespace timeline

}  // namespace kvstream::kernels
