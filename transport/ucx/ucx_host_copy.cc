// Same-host writes of the UCX backend: UCX 1.13 cannot use its shared-memory transports on
// endpoints with peer-failure handling, so when the peer runs on this host (ucx_transport.cc
// checks) the copier thread copies the data itself: memcpy into the peer's Allocate()d memory (a
// memfd mapped here) or process_vm_writev into memory the peer registered, split over copy
// lanes. The copy is complete when it returns, so no flush is needed.
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <latch>

#include "transport/ucx/ucx_writer.h"

namespace kvstream::transport::ucx {
namespace {

using internal::Run;

void AfterCmaCopy(UcxWriteOp* op, Status st) {
  UcxEndpointState* ep = op->ep.get();
  ++ep->worker->busy;
  if (!st.ok()) {
    if (st.code() == StatusCode::kRemoteDisconnect) ep->MarkFailed(st);
    return FinishWrite(op, std::move(st));
  }
  // process_vm_writev returned: every byte is in the peer's memory, no flush needed.
  OnWriteFlushed(nullptr, UCS_OK, op);
}

// Copies `runs` (a lane's share of the op) with process_vm_writev, or memcpy into the mapped
// peer memory; checks cancel, close, failure and the peer's exit between slices.
Status CopyLane(UcxWriteOp* op, const std::vector<Run>& runs) {
  constexpr size_t kBatch = 64;
  UcxEndpointState* ep = op->ep.get();
  auto* base = static_cast<uint8_t*>(op->reg->region.addr);
  size_t idx = 0;
  uint64_t done_in_run = 0;
  while (idx < runs.size()) {
    if (ep->closing.load()) return Canceled("ucx: endpoint closed");
    if (op->completion->cancel_requested()) return Canceled("ucx: write canceled");
    if (ep->failed.load()) return ep->Error();
    if (ep->peer_process.Exited()) return RemoteDisconnect("ucx: the peer process exited");
    if (op->mapped_dst != nullptr) {
      // A shared mapping of the peer's memory: copy in slices so cancel and close act fast.
      constexpr uint64_t kSlice = 8 << 20;
      const Run& run = runs[idx];
      uint64_t n = std::min<uint64_t>(kSlice, run.length - done_in_run);
      std::memcpy(op->mapped_dst + run.remote_offset + done_in_run,
                  base + run.local_offset + done_in_run, n);
      done_in_run += n;
      if (done_in_run == run.length) {
        ++idx;
        done_in_run = 0;
      }
      continue;
    }
    iovec local[kBatch], remote[kBatch];
    size_t n = 0;
    for (size_t j = idx; j < runs.size() && n < kBatch; ++j, ++n) {
      uint64_t skip = j == idx ? done_in_run : 0;
      local[n] = {base + runs[j].local_offset + skip, runs[j].length - skip};
      remote[n] = {reinterpret_cast<void*>(op->remote_base + runs[j].remote_offset + skip),
                   runs[j].length - skip};
    }
    ssize_t got = process_vm_writev(ep->cma_pid, local, n, remote, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      std::string m = std::string("ucx: process_vm_writev: ") + std::strerror(e);
      return e == ESRCH    ? RemoteDisconnect(m)
             : e == EFAULT ? FailedPrecondition(m + " (a region is no longer mapped)")
             : e == ENOMEM ? ResourceExhausted(m)
                           : Internal(m);
    }
    if (got == 0) return Internal("ucx: process_vm_writev made no progress");
    for (uint64_t left = static_cast<uint64_t>(got); left > 0 && idx < runs.size();) {
      uint64_t rest = runs[idx].length - done_in_run;
      if (left >= rest) {
        left -= rest;
        ++idx;
        done_in_run = 0;
      } else {
        done_in_run += left;
        left = 0;
      }
    }
  }
  return OkStatus();
}

// How many threads copy one same-host write: one per 4 MiB, up to the worker's lanes (as
// measured in bench/results/transfer_staged_lanes_2026-11-29.md; the host-staged path's 8 MiB
// chunks get 2 — finer lanes for it are not measured yet).
int CopyLanesFor(uint64_t bytes, int max_lanes) {
  constexpr uint64_t kMinLaneBytes = 4 << 20;
  return static_cast<int>(std::clamp<uint64_t>(bytes / kMinLaneBytes, 1, max_lanes));
}

// Splits runs into `lanes` groups of about equal bytes (cutting runs where needed).
std::vector<std::vector<Run>> SplitRuns(const std::vector<Run>& runs, uint64_t total, int lanes) {
  std::vector<std::vector<Run>> out(lanes);
  const uint64_t per = (total + lanes - 1) / lanes;
  int lane = 0;
  uint64_t in_lane = 0;
  for (Run r : runs) {
    while (r.length > 0) {
      const uint64_t take = lane == lanes - 1 ? r.length : std::min(r.length, per - in_lane);
      out[lane].push_back(Run{r.local_offset, r.remote_offset, take});
      r.local_offset += take;
      r.remote_offset += take;
      r.length -= take;
      in_lane += take;
      if (in_lane == per && lane < lanes - 1) {
        ++lane;
        in_lane = 0;
      }
    }
  }
  return out;
}

}  // namespace

void CopyOnHost(UcxWriteOp* op) {
  UcxEndpointState* ep = op->ep.get();
  uint64_t total = 0;
  for (const Run& r : op->runs) total += r.length;
  const int lanes = CopyLanesFor(total, ep->worker->max_copy_lanes());
  Status st;
  if (lanes <= 1) {
    st = CopyLane(op, op->runs);
  } else {
    std::vector<std::vector<Run>> parts = SplitRuns(op->runs, total, lanes);
    std::vector<Status> results(lanes);
    std::latch done(lanes - 1);
    for (int i = 1; i < lanes; ++i) {
      ep->worker->copy_lane(i).Post([&, i] {
        results[i] = CopyLane(op, parts[i]);
        done.count_down();
      });
    }
    results[0] = CopyLane(op, parts[0]);
    done.wait();
    // The most telling failure: a lost peer or a real error over a cancel another lane saw.
    for (Status& r : results) {
      if (r.ok()) continue;
      if (st.ok() || (st.code() == StatusCode::kCanceled && r.code() != StatusCode::kCanceled)) {
        st = r;
      }
    }
  }
  // The notification is sent by the progress thread after this: make the copies visible first.
  std::atomic_thread_fence(std::memory_order_release);
  ep->worker->Post([op, st = std::move(st)]() mutable { AfterCmaCopy(op, std::move(st)); });
}

}  // namespace kvstream::transport::ucx
