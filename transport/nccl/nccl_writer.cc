#include "transport/nccl/nccl_writer.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "common/log.h"

namespace kvstream::transport::nccl {
namespace {

using cuda::CopyRun;
using cuda::CudaStatus;
using cuda::DeviceGuard;

class NcclWriteHandle : public WriteHandle {
 public:
  explicit NcclWriteHandle(std::shared_ptr<NcclWriteOp> op) : op_(std::move(op)) {}
  bool Done() const override {
    std::lock_guard<std::mutex> lock(op_->mu);
    return op_->done;
  }
  Status Wait(Deadline deadline) override {
    std::unique_lock<std::mutex> lock(op_->mu);
    if (!op_->cv.wait_until(lock, deadline, [&] { return op_->done; })) {
      return Timeout("nccl: write not complete before the deadline");
    }
    return op_->result;
  }
  uint64_t bytes() const override { return op_->header.total_bytes; }
  uint64_t transfers() const override { return op_->header.runs.size(); }
  bool Cancel() override {
    op_->cancel.store(true);
    return true;
  }

 private:
  std::shared_ptr<NcclWriteOp> op_;
};

}  // namespace

NcclWriter::~NcclWriter() {
  Shutdown();
  if (fd >= 0) ::close(fd);
  if (wake_fd >= 0) ::close(wake_fd);
}

Status NcclWriter::status() const {
  std::lock_guard<std::mutex> lock(status_mu_);
  return status_;
}

Result<std::unique_ptr<WriteHandle>> NcclWriter::Write(const WriteRequest& req) {
  if (req.local == nullptr) return InvalidArgument("nccl Write: no local registration");
  auto* reg = dynamic_cast<const NcclRegistration*>(req.local);
  if (reg == nullptr || reg->owner() != shared.get()) {
    return InvalidArgument("nccl Write: the local registration was not made by this transport");
  }
  if (req.remote_region < 0 || static_cast<size_t>(req.remote_region) >= targets.size()) {
    return InvalidArgument("nccl Write: remote region " + std::to_string(req.remote_region) +
                           " out of range (peer has " + std::to_string(targets.size()) + ")");
  }
  const NcclTarget& target = targets[req.remote_region];
  cuda::CopyPlanner planner;
  const uint64_t local_base = reinterpret_cast<uint64_t>(reg->region().addr);
  KV_RETURN_IF_ERROR(planner.Build(req.ops, local_base, reg->region().length, 0, target.length));
  KV_RETURN_IF_ERROR(status());
  auto op = std::make_shared<NcclWriteOp>();
  op->header.registration_id = target.registration_id;
  op->header.total_bytes = planner.bytes();
  op->header.notify = req.notify;
  op->header.notification = req.notification;
  op->header.runs.reserve(planner.runs().size());
  op->src.reserve(planner.runs().size());
  for (const CopyRun& r : planner.runs()) {
    op->header.runs.push_back({r.dst, r.length});
    op->src.push_back(r.src);
  }
  switch (mode) {
    case CopyMode::kDirect: op->header.mode = WireMode::kDirect; break;
    case CopyMode::kPack: op->header.mode = WireMode::kPack; break;
    default: op->header.mode = ChooseMode(op->header.runs.size(), op->header.total_bytes);
  }
  // Overlapping destinations: the scatter kernel has no order, so keep the runs in order.
  if (!planner.disjoint()) op->header.mode = WireMode::kDirect;
  if (req.after_stream != nullptr) {
    KV_ASSIGN_OR_RETURN(op->dep, shared->events.Acquire());
    cudaError_t err = cudaEventRecord(op->dep, static_cast<cudaStream_t>(req.after_stream));
    if (err != cudaSuccess) {
      shared->events.Release(op->dep);
      return CudaStatus(err, "nccl Write: cudaEventRecord on after_stream");
    }
  }
  if (shared->options.trace) op->t_write = Clock::now();
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    op->header.write_id = next_write_id_++;
    queue_.push_back(op);
  }
  Wake();
  return std::unique_ptr<WriteHandle>(new NcclWriteHandle(op));
}

void NcclWriter::Shutdown() {
  if (shut_down_.exchange(true)) return;
  stop_.store(true);
  Wake();
  if (thread_.joinable()) thread_.join();
  // Thread never started (Connect failed half way): nothing posted, just free.
  AbortComm();
  FailAll(Canceled("nccl: endpoint destroyed before the write was complete"));
  shared->ReleaseStagingWhenIdle(&staging, comm_stream.get(), pack_stream.get(), "nccl endpoint");
}

void NcclWriter::Wake() {
  uint64_t one = 1;
  if (wake_fd >= 0) (void)!::write(wake_fd, &one, sizeof(one));
}

void NcclWriter::SetStatus(const Status& s) {
  std::lock_guard<std::mutex> lock(status_mu_);
  if (status_.ok()) status_ = s;
}

void NcclWriter::AbortComm() {
  if (comm != nullptr) {
    (void)ncclCommAbort(comm);
    comm = nullptr;
  }
}

void NcclWriter::ReleaseOpEvents(NcclWriteOp& op) {
  if (op.dep) shared->events.Release(op.dep);
  if (op.sent) shared->events.Release(op.sent);
  op.dep = op.sent = nullptr;
}

void NcclWriter::FailAll(const Status& why) {
  std::deque<std::shared_ptr<NcclWriteOp>> queued;
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    queued.swap(queue_);
  }
  for (auto& op : queued) {
    op->Finish(why);
    ReleaseOpEvents(*op);
  }
  for (auto& op : inflight_) {
    const bool complete = op->acked && op->sent && cudaEventQuery(op->sent) == cudaSuccess;
    op->Finish(complete ? OkStatus() : why);
    // An event NCCL's aborted work may still record stays out of the pool (leaked, tiny).
    if (op->sent == nullptr || cudaEventQuery(op->sent) != cudaErrorNotReady) ReleaseOpEvents(*op);
  }
  inflight_.clear();
}

void NcclWriter::Fail(const Status& why) {
  SetStatus(why);
  KV_LOG_WARN << "nccl: endpoint failed: " << why.ToString();
  AbortComm();
  FailAll(status());
}

Status NcclWriter::PollSocket() {
  // Acks that arrived just before the receiver closed still count: take every complete frame
  // first, then report the close.
  const bool open = core::ReadAvailable(fd, &rx_);
  for (;;) {
    FrameType type;
    std::string payload;
    KV_ASSIGN_OR_RETURN(bool got, TakeFrame(&rx_, &type, &payload));
    if (!got) {
      return open ? OkStatus()
                  : RemoteDisconnect("nccl: the receiver closed the control socket (process gone?)");
    }
    if (type != FrameType::kAck) return DataLoss("nccl: unexpected frame from the receiver");
    KV_ASSIGN_OR_RETURN(Ack ack, DecodeAck(payload));
    bool found = false;
    for (auto& op : inflight_) {
      if (op->header.write_id != ack.write_id) continue;
      found = true;
      if (ack.code != 0) {
        return Status(static_cast<StatusCode>(ack.code), "nccl: the receiver refused write " +
                                                             std::to_string(ack.write_id));
      }
      op->acked = true;
      if (shared->options.trace) op->t_acked = Clock::now();
    }
    if (!found) return DataLoss("nccl: ack for unknown write " + std::to_string(ack.write_id));
  }
}

Status NcclWriter::Group(const std::function<Status()>& calls, const char* what) {
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return NcclStatus(r, comm, "ncclGroupStart");
  Status s = calls();
  r = ncclGroupEnd();
  if (shared->options.trace) group_end_ = Clock::now();
  KV_RETURN_IF_ERROR(s);
  if (r != ncclSuccess && r != ncclInProgress) return NcclStatus(r, comm, what);
  return WaitComm(comm, DeadlineAfterMs(shared->options.connect_timeout_ms),
                  [this] { return PollSocket(); }, what);
}

Status NcclWriter::Submit(NcclWriteOp& op) {
  const bool trace = shared->options.trace;
  if (trace) op.t_taken = Clock::now();
  if (!core::SendAll(fd, EncodeWrite(op.header))) {
    return RemoteDisconnect(std::string("nccl: sending a write header: ") + std::strerror(errno));
  }
  if (trace) op.t_header = Clock::now();
  const cudaStream_t cs = comm_stream->get();
  if (op.header.mode == WireMode::kDirect) {
    if (op.dep) KV_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(cs, op.dep, 0), "nccl: wait after_stream");
    for (size_t first = 0; first < op.header.runs.size(); first += kGroupOps) {
      const size_t end = std::min(op.header.runs.size(), first + kGroupOps);
      KV_RETURN_IF_ERROR(Group([&]() -> Status {
        for (size_t i = first; i < end; ++i) {
          ncclResult_t r = ncclSend(reinterpret_cast<const void*>(op.src[i]),
                                    op.header.runs[i].length, ncclUint8, 1, comm, cs);
          if (r != ncclSuccess && r != ncclInProgress) return NcclStatus(r, comm, "ncclSend");
        }
        return OkStatus();
      }, "direct sends"));
    }
  } else {
    const cudaStream_t ps = pack_stream->get();
    PlanChunks(op.header.runs, staging.chunk_bytes, &plan_);
    for (size_t c = 0; c < plan_.chunks.size(); ++c) {
      const Chunk& chunk = plan_.chunks[c];
      const int slot = static_cast<int>(staging.next++ & 1);
      KV_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(ps, staging.freed[slot], 0), "nccl: wait slot");
      if (c == 0 && op.dep) {
        KV_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(ps, op.dep, 0), "nccl: wait after_stream");
      }
      runs_.clear();
      for (size_t p = chunk.first_piece; p < chunk.first_piece + chunk.pieces; ++p) {
        const Piece& pc = plan_.pieces[p];
        runs_.push_back({op.src[pc.run] + pc.run_offset,
                         reinterpret_cast<uint64_t>(staging.slot(slot)) + pc.chunk_offset, pc.length});
      }
      KV_RETURN_IF_ERROR(CopyPieces(runs_, &table_, shared->kernel, ps));
      KV_CUDA_RETURN_IF_ERROR(cudaEventRecord(staging.filled[slot], ps), "nccl: record packed");
      KV_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(cs, staging.filled[slot], 0), "nccl: wait packed");
      KV_RETURN_IF_ERROR(Group([&]() -> Status {
        return NcclStatus(ncclSend(staging.slot(slot), chunk.bytes, ncclUint8, 1, comm, cs), comm,
                          "ncclSend");
      }, "chunk send"));
      KV_CUDA_RETURN_IF_ERROR(cudaEventRecord(staging.freed[slot], cs), "nccl: record sent");
    }
  }
  KV_ASSIGN_OR_RETURN(op.sent, shared->events.Acquire());
  KV_CUDA_RETURN_IF_ERROR(cudaEventRecord(op.sent, cs), "nccl: record write done");
  if (trace) {
    op.t_group_end = group_end_;  // of the write's last group
    op.t_launched = Clock::now();
  }
  return OkStatus();
}

void NcclWriter::TraceDone(const NcclWriteOp& op) {
  const auto now = Clock::now();
  std::fprintf(stderr,
               "nccl trace writer: write %llu, %llu bytes, %zu runs, %s: taken %.1f header %.1f "
               "group_end %.1f launched %.1f acked %.1f done %.1f us\n",
               (unsigned long long)op.header.write_id, (unsigned long long)op.header.total_bytes,
               op.header.runs.size(), op.header.mode == WireMode::kDirect ? "direct" : "pack",
               MicrosSince(op.t_write, op.t_taken), MicrosSince(op.t_write, op.t_header),
               MicrosSince(op.t_write, op.t_group_end), MicrosSince(op.t_write, op.t_launched),
               MicrosSince(op.t_write, op.t_acked), MicrosSince(op.t_write, now));
}

void NcclWriter::Run() {
  DeviceGuard guard(shared->device);
  TightenTimerSlack();
  constexpr long kInflightPollNs = 10'000L;
  Deadline close_deadline{};
  bool closing = false;
  auto last_async_check = Clock::now();
  for (;;) {
    if (stop_.load() && !closing) {
      closing = true;
      close_deadline = DeadlineAfterMs(shared->options.close_timeout_ms);
    }
    // A failed endpoint's socket stays readable (EOF): leave it out of the poll.
    pollfd p[2] = {{wake_fd, POLLIN, 0}, {comm != nullptr ? fd : -1, POLLIN, 0}};
    timespec ts{0, inflight_.empty() ? 20'000'000L : kInflightPollNs};
    (void)::ppoll(p, 2, &ts, nullptr);
    if (p[0].revents) {
      uint64_t v;
      (void)!::read(wake_fd, &v, sizeof(v));
    }
    const bool failed = !status().ok();
    if (!failed && comm != nullptr) {
      Status s = PollSocket();
      if (!s.ok()) {
        Fail(s);
        continue;
      }
    }
    std::deque<std::shared_ptr<NcclWriteOp>> fresh;
    {
      std::lock_guard<std::mutex> lock(q_mu_);
      fresh.swap(queue_);
    }
    for (auto& op : fresh) {
      Status st = status();
      if (closing) st = Canceled("nccl: endpoint destroyed before the write was posted");
      else if (op->cancel.load()) st = Canceled("nccl: write cancelled before it was posted");
      if (!st.ok()) {
        op->Finish(st);
        ReleaseOpEvents(*op);
        continue;
      }
      inflight_.push_back(op);
      Status s = Submit(*op);
      if (!s.ok()) {
        // Fails this write and every other one; the rest of `fresh` then sees the status.
        Fail(s.code() == StatusCode::kRemoteDisconnect ? s : s.WithContext("posting a write"));
      }
    }
    while (!inflight_.empty()) {
      NcclWriteOp& op = *inflight_.front();
      if (!op.acked) break;
      cudaError_t err = cudaEventQuery(op.sent);
      if (err == cudaErrorNotReady) break;
      op.Finish(CudaStatus(err, "nccl send"));
      if (shared->options.trace) TraceDone(op);
      ReleaseOpEvents(op);
      inflight_.pop_front();
    }
    if (!inflight_.empty() && comm != nullptr &&
        Clock::now() - last_async_check > std::chrono::milliseconds(1)) {
      last_async_check = Clock::now();
      ncclResult_t st = ncclSuccess;
      if (ncclCommGetAsyncError(comm, &st) == ncclSuccess && st != ncclSuccess &&
          st != ncclInProgress) {
        Fail(CommFailed(st, comm, "asynchronous error"));
      }
    }
    if (closing && (inflight_.empty() || Expired(close_deadline))) break;
  }
}

}  // namespace kvstream::transport::nccl
