#include "transport/staged/staged_chunk_copy.h"

namespace kvstream::transport::staged {
namespace {

using cuda::CopyRun;
using cuda::CudaStatus;

// `to` waits for everything enqueued on `from` so far.
Status Follow(Lanes& lanes, cudaStream_t from, cudaStream_t to) {
  if (from == to) return OkStatus();
  KV_ASSIGN_OR_RETURN(cudaEvent_t ev, lanes.events->Acquire());
  cudaError_t err = cudaEventRecord(ev, from);
  if (err == cudaSuccess) err = cudaStreamWaitEvent(to, ev, 0);
  // The wait captured the record: the event may be recorded again by its next user.
  lanes.events->Release(ev);
  return CudaStatus(err, "cudaStreamWaitEvent (between the copy and kernel streams)");
}

}  // namespace

Result<cudaStream_t> CopyChunk(Direction dir, const std::vector<CopyRun>& runs, uint64_t staging,
                               uint64_t bytes, void* scratch, CopyRun* table, size_t table_cap,
                               Lanes& lanes) {
  if (runs.size() >= 4 && scratch != nullptr) {
    // Re-aim the runs' staging side at the scratch buffer.
    std::vector<CopyRun> dev = runs;
    const uint64_t sc = reinterpret_cast<uint64_t>(scratch);
    for (CopyRun& r : dev) {
      if (dir == Direction::kToHost) r.dst = sc + (r.dst - staging);
      else r.src = sc + (r.src - staging);
    }
    size_t entries = cuda::ScatterTableEntries(dev.data(), dev.size());
    if (entries <= table_cap) {
      cuda::SplitRuns(dev.data(), dev.size(), table);
      if (dir == Direction::kToDevice) {
        KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(scratch, reinterpret_cast<const void*>(staging), bytes,
                                                cudaMemcpyHostToDevice, lanes.copy),
                                "cudaMemcpyAsync (staging to scratch)");
        KV_RETURN_IF_ERROR(Follow(lanes, lanes.copy, lanes.kernel));
        KV_RETURN_IF_ERROR(cuda::LaunchScatterCopy(table, entries, lanes.kernel));
        lanes.kernel_ahead = lanes.kernel != lanes.copy;
        return lanes.kernel;
      }
      KV_RETURN_IF_ERROR(cuda::LaunchScatterCopy(table, entries, lanes.kernel));
      KV_RETURN_IF_ERROR(Follow(lanes, lanes.kernel, lanes.copy));
      KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(reinterpret_cast<void*>(staging), scratch, bytes,
                                              cudaMemcpyDeviceToHost, lanes.copy),
                              "cudaMemcpyAsync (scratch to staging)");
      return lanes.copy;
    }
  }
  if (dir == Direction::kToDevice && lanes.kernel_ahead) {
    KV_RETURN_IF_ERROR(Follow(lanes, lanes.kernel, lanes.copy));
    lanes.kernel_ahead = false;
  }
  const cudaMemcpyKind kind = dir == Direction::kToHost ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
  for (const CopyRun& r : runs) {
    KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(reinterpret_cast<void*>(r.dst),
                                            reinterpret_cast<const void*>(r.src), r.length, kind,
                                            lanes.copy),
                            "cudaMemcpyAsync (staging)");
  }
  return lanes.copy;
}

}  // namespace kvstream::transport::staged
