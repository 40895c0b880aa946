#include "transport/cuda_ipc/cuda_ipc_writer.h"

#include <poll.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "common/log.h"
#include "transport/core/private_socket.h"

namespace kvstream::transport::cuda_ipc {

using cuda::BlockEntry;
using cuda::ChooseCopyPath;
using cuda::CopyPath;
using cuda::CopyRun;
using cuda::CudaStatus;
using cuda::DeviceGuard;
using cuda::PlanScatter;
using cuda::ScatterShape;

Result<MappedRegion> MapPeerRegion(IpcTransportState& state, cuda::NotificationChannel& channel,
                                   const KeyWire& key, Deadline deadline,
                                   std::map<uint64_t, std::shared_ptr<PeerMapping>>* mapped) {
  if (key.grant_id == 0) {
    return FailedPrecondition(
        "cuda_ipc: the peer registered memory that cannot be shared as a descriptor (not made "
        "with cuMemCreate and POSIX descriptor handles, e.g. cudaMalloc'd): cuda_ipc writes only "
        "into shareable memory (common/cuda_vmm.h; the model's KV pools are)");
  }
  KV_ASSIGN_OR_RETURN(cuda::MemoryGrant grant, channel.RequestMemory(key.grant_id, deadline));
  struct CloseFd {
    int fd;
    ~CloseFd() {
      if (fd >= 0) ::close(fd);
    }
  } close_fd{grant.fd};
  KV_ASSIGN_OR_RETURN(GrantInfo g, ParseGrantInfo(grant.info));
  if (g.offset != key.offset || g.length != key.length) {
    return InvalidArgument("cuda_ipc: the key's region (offset " + std::to_string(key.offset) +
                           ", " + std::to_string(key.length) + " bytes) is not the one the "
                           "receiver registered under its grant id");
  }
  MappedRegion out;
  out.length = g.length;
  std::shared_ptr<PeerMapping>& m = (*mapped)[g.alloc_id];
  if (m == nullptr) {
    auto pm = std::make_shared<PeerMapping>();
    auto imported = cuda_vmm::ImportedMapping::Import(grant.fd, g.alloc_size, state.device);
    if (imported.ok()) {
      pm->imported = std::move(imported).value();
      pm->base = pm->imported->base();
    } else {
      // The same process: its own pointer is valid here (if the driver would not map the
      // allocation a second time). The kernel names the peer, never a message.
      auto peer = core::SameUserPeer(channel.fd());
      if (!peer.ok() || peer.value().pid != ::getpid()) {
        mapped->erase(g.alloc_id);
        return imported.status().WithContext("cuda_ipc: mapping the peer's memory");
      }
      KV_LOG_INFO << "cuda_ipc: peer in this process, writing through its own pointer ("
                  << imported.status().ToString() << ")";
      pm->base = reinterpret_cast<void*>(g.alloc_id);
    }
    m = std::move(pm);
  }
  out.mapping = m;
  out.addr = reinterpret_cast<uint64_t>(m->base) + g.offset;
  return out;
}

namespace {

// Process-wide Write() profile (EnableWriteProfile); relaxed counters, read by benchmarks.
struct ProfileCounters {
  std::atomic<bool> on{false};
  std::atomic<uint64_t> writes{0}, plan_ns{0}, submit_ns{0}, enqueue_ns{0}, total_ns{0};
  std::atomic<uint64_t> copy_ns{0}, record_ns{0};
  std::atomic<uint64_t> kernel_writes{0}, memcpy_writes{0}, memcpy_calls{0}, block_writes{0};
  std::atomic<uint64_t> notify_batches{0}, notify_frames{0}, wakeups{0};
};
ProfileCounters& Profile() {
  static ProfileCounters p;
  return p;
}
inline uint64_t NowNs() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count());
}

class IpcWriteHandle : public WriteHandle {
 public:
  IpcWriteHandle(std::shared_ptr<IpcWriter> writer, std::shared_ptr<IpcWriteOp> op)
      : writer_(std::move(writer)), op_(std::move(op)) {}
  bool Done() const override {
    writer_->TryFinish(*op_);
    return op_->state.load(std::memory_order_acquire) == 2;
  }
  Status Wait(Deadline deadline) override {
    auto start = Clock::now();
    for (;;) {
      writer_->TryFinish(*op_);
      int st = op_->state.load(std::memory_order_acquire);
      if (st == 2) return op_->result;
      if (Expired(deadline)) {
        return Timeout("cuda_ipc: write of " + std::to_string(op_->bytes) +
                       " bytes not complete by the deadline (it may still be in flight)");
      }
      // A layer's copy takes microseconds: spin briefly before sleeping.
      if (Clock::now() - start < std::chrono::microseconds(500)) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
  }
  uint64_t bytes() const override { return op_->bytes; }
  uint64_t transfers() const override { return op_->transfers; }

 private:
  std::shared_ptr<IpcWriter> writer_;
  std::shared_ptr<IpcWriteOp> op_;
};

}  // namespace

IpcWriter::~IpcWriter() {
  Shutdown();
  if (wake_fd >= 0) ::close(wake_fd);
}

void IpcWriter::Start() {
  ring_ = std::make_unique<cuda::RunRing>(table_capacity);
  thread_ = std::thread([this] { Run(); });
}

Status IpcWriter::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

void IpcWriter::Finish(IpcWriteOp& op, Status s) {
  int expected = 0;
  if (!op.state.compare_exchange_strong(expected, 1)) return;
  if (s.ok() && op.notify) {
    std::shared_ptr<cuda::NotificationChannel> ch;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ch = channel;
      if (!status_.ok()) s = status_;
    }
    if (s.ok()) {
      if (ch == nullptr) {
        s = Canceled("cuda_ipc: endpoint destroyed before the notification was sent");
      } else {
        s = ch->Send(op.notification);
        if (!s.ok()) MarkDisconnected(s);
      }
    }
  }
  op.result = std::move(s);
  op.state.store(2, std::memory_order_release);
}

void IpcWriter::TryFinish(IpcWriteOp& op) {
  if (op.state.load(std::memory_order_acquire) != 0) return;
  cudaError_t err = cudaEventQuery(op.done_event);
  if (err == cudaErrorNotReady) return;
  Finish(op, CudaStatus(err, "cuda_ipc copy"));
}

void IpcWriter::Shutdown() {
  if (shut_down_.exchange(true)) return;
  stop_.store(true);
  Wake();
  if (thread_.joinable()) thread_.join();
  if (stream) {
    Status s = cuda::WaitStreamIdle(stream->get(),
                                    DeadlineAfterMs(shared->options.close_timeout_ms));
    if (!s.ok()) {
      KV_LOG_ERROR << "cuda_ipc: endpoint closing while its copies still run: " << s.ToString();
    }
  }
  std::deque<std::shared_ptr<IpcWriteOp>> left;
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    left.swap(pending_);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (status_.ok()) status_ = Canceled("cuda_ipc: endpoint destroyed");
    failed_.store(true);
    channel.reset();
  }
  for (auto& op : left) {
    cudaError_t err = cudaEventQuery(op->done_event);
    // Complete copies that owe no notification are done; the rest are cancelled.
    Finish(*op, err == cudaSuccess && !op->notify
                    ? OkStatus()
                    : Canceled("cuda_ipc: endpoint destroyed before the write was complete"));
    if (err != cudaErrorNotReady) ReleaseEvents(*op);  // else leak: it may still fire
  }
  stream.reset();
  targets.clear();
  table.reset();
  flag_mapping.reset();
}

void IpcWriter::Wake() {
  uint64_t one = 1;
  if (wake_fd >= 0) (void)!::write(wake_fd, &one, sizeof(one));
}

void IpcWriter::ReleaseEvents(IpcWriteOp& op) {
  shared->events.Release(op.done_event);
  shared->events.Release(op.dep_event);
  // The fields keep their values: a waiter may still query a recycled event, which at worst
  // reports a state its CAS in Finish() then ignores.
}

void IpcWriter::MarkDisconnected(const Status& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!status_.ok()) return;
    status_ = why;
    failed_.store(true);
  }
  std::deque<std::shared_ptr<IpcWriteOp>> snapshot;
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    snapshot = pending_;
  }
  KV_LOG_WARN << "cuda_ipc: peer lost: " << why.ToString();
  // The copies may still run (the mapping is ours), but the peer will never see them.
  for (auto& op : snapshot) Finish(*op, why);
}

// Finishes the completed ops `done` (in stream order). The notifications of all of them go
// out in one socket write: a burst of small layers completing together costs one syscall.
void IpcWriter::FinishBatch(
    std::vector<std::pair<std::shared_ptr<IpcWriteOp>, cudaError_t>>& done) {
  claimed_.clear();
  frames_.clear();
  for (auto& [op, err] : done) {
    int expected = 0;
    if (!op->state.compare_exchange_strong(expected, 1)) continue;  // Wait() got it first
    op->result = CudaStatus(err, "cuda_ipc copy");
    claimed_.push_back(op.get());
    if (op->result.ok() && op->notify) frames_.push_back(op->notification);
  }
  Status send = OkStatus();
  if (!frames_.empty()) {
    std::shared_ptr<cuda::NotificationChannel> ch;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ch = channel;
      send = status_;
    }
    if (send.ok()) {
      if (ch == nullptr) {
        send = Canceled("cuda_ipc: endpoint destroyed before the notification was sent");
      } else {
        send = ch->SendBatch(frames_.data(), frames_.size());
        ProfileCounters& p = Profile();
        if (p.on.load(std::memory_order_relaxed)) {
          p.notify_batches.fetch_add(1, std::memory_order_relaxed);
          p.notify_frames.fetch_add(frames_.size(), std::memory_order_relaxed);
        }
      }
    }
  }
  for (IpcWriteOp* op : claimed_) {
    if (op->result.ok() && op->notify && !send.ok()) op->result = send;
    op->state.store(2, std::memory_order_release);
  }
  if (!send.ok() && send.code() == StatusCode::kRemoteDisconnect) MarkDisconnected(send);
  for (auto& [op, err] : done) ReleaseEvents(*op);
  done.clear();
}

void IpcWriter::Run() {
  DeviceGuard guard(shared->device);
  // Short ppoll timeouts below are meant literally (the default 50 us slack would triple them).
  (void)::prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  std::vector<std::pair<std::shared_ptr<IpcWriteOp>, cudaError_t>> completed;
  constexpr uint64_t kLingerNs = 200 * 1000;
  uint64_t idle_since = 0;
  while (!stop_.load()) {
    // One in-order stream: the first incomplete op blocks all later ones. The event query
    // runs outside q_mu_ (only this thread pops).
    uint64_t ring_end = 0;
    for (;;) {
      std::shared_ptr<IpcWriteOp> front;
      {
        std::lock_guard<std::mutex> lock(q_mu_);
        if (pending_.empty()) break;
        front = pending_.front();
      }
      cudaError_t err = cudaEventQuery(front->done_event);
      if (err == cudaErrorNotReady) break;
      {
        std::lock_guard<std::mutex> lock(q_mu_);
        pending_.pop_front();
      }
      if (front->ring_end != 0) ring_end = front->ring_end;
      completed.emplace_back(std::move(front), err);
    }
    if (ring_end != 0) {
      std::lock_guard<std::mutex> lock(ring_mu_);
      ring_->Release(ring_end);
    }
    if (!completed.empty()) FinishBatch(completed);
    bool idle;
    {
      std::lock_guard<std::mutex> lock(q_mu_);
      idle = pending_.empty();
    }
    // Idle for less than kLingerNs: keep polling without parking, so that a writer posting
    // layers a few us apart finds this thread awake and pays no eventfd write (a syscall in
    // Write()) per layer.
    bool park = false;
    if (idle) {
      const uint64_t now = NowNs();
      if (idle_since == 0) idle_since = now;
      park = now - idle_since >= kLingerNs;
    } else {
      idle_since = 0;
    }
    if (park) {
      // Park: writers wake this thread only while it is parked (one eventfd write per burst,
      // not per Write()).
      sleeping_.store(true);
      {
        std::lock_guard<std::mutex> lock(q_mu_);
        park = pending_.empty();
      }
      if (!park) sleeping_.store(false);
    }
    pollfd fds[2] = {{channel_fd, POLLIN | POLLRDHUP, 0}, {wake_fd, POLLIN, 0}};
    // Active or lingering: poll events every ~10 us; parked: watch the socket and the wake fd.
    timespec ts = park ? timespec{0, 20 * 1000 * 1000} : timespec{0, 10 * 1000};
    int rc = ::ppoll(fds, 2, &ts, nullptr);
    sleeping_.store(false);
    if (rc > 0) {
      if (fds[1].revents) {
        uint64_t v;
        (void)!::read(wake_fd, &v, sizeof(v));
        ProfileCounters& p = Profile();
        if (p.on.load(std::memory_order_relaxed)) p.wakeups.fetch_add(1, std::memory_order_relaxed);
      }
      // The receiver never sends on this socket: readable means EOF or error.
      if (fds[0].revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) {
        MarkDisconnected(RemoteDisconnect("cuda_ipc: peer closed the control socket (process "
                                          "exited or transport destroyed)"));
        channel_fd = -1;  // poll ignores negative fds
      }
    }
  }
}

void IpcWriter::Enqueue(std::shared_ptr<IpcWriteOp> op) {
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    pending_.push_back(std::move(op));
  }
  if (sleeping_.exchange(false)) Wake();
}

Result<std::unique_ptr<WriteHandle>> IpcWriter::Write(const WriteRequest& req) {
  ProfileCounters& prof = Profile();
  const bool profiling = prof.on.load(std::memory_order_relaxed);
  const uint64_t t0 = profiling ? NowNs() : 0;
  const auto* local = dynamic_cast<const IpcRegistration*>(req.local);
  if (local == nullptr) {
    return InvalidArgument(req.local == nullptr
                               ? "cuda_ipc Write: no local registration"
                               : "cuda_ipc Write: local registration is not from a cuda_ipc transport");
  }
  if (local->region().device != shared->device) {
    return InvalidArgument("cuda_ipc Write: local registration is on device " +
                           std::to_string(local->region().device) + ", the transport on " +
                           std::to_string(shared->device));
  }
  if (req.remote_region < 0 || static_cast<size_t>(req.remote_region) >= targets.size()) {
    return InvalidArgument("cuda_ipc Write: remote_region " + std::to_string(req.remote_region) +
                           " out of range (peer has " + std::to_string(targets.size()) + ")");
  }
  if (req.notify &&
      (req.notification.flags & (kNotificationLandedOnEvent | cuda::kFrameFlagRequest)) != 0) {
    return InvalidArgument("cuda_ipc Write: notification flags bits 29 and 30 are the transport's");
  }
  if (failed_.load(std::memory_order_acquire)) {
    Status s = status();
    if (!s.ok()) return s;
  }
  const IpcTarget& target = targets[static_cast<size_t>(req.remote_region)];
  std::lock_guard<std::mutex> submit(submit_mu_);
  const CopyMode mode = shared->options.copy_mode;
  const uint64_t local_base = reinterpret_cast<uint64_t>(local->region().addr);
  // Fast plan first: a paged write (every op a multiple of one unit) becomes a unit-index list
  // for the block-table kernel, usually one launch. Anything it does not cover takes the general
  // plan below.
  bool block = false;
  if (mode != CopyMode::kMemcpy && shared->options.block_table &&
      (mode == CopyMode::kKernel || req.ops.size() >= shared->options.kernel_min_runs)) {
    KV_RETURN_IF_ERROR(block_planner_.Build(req.ops, local_base, local->region().length,
                                            target.addr, target.length, kMaxBlockEntries));
    block = block_planner_.fits() &&
            (mode == CopyMode::kKernel || block_planner_.runs() >= shared->options.kernel_min_runs);
  }
  if (!block) {
    KV_RETURN_IF_ERROR(planner_.Build(req.ops, local_base, local->region().length, target.addr,
                                      target.length));
  } else {
    planner_.Clear();
  }
  const std::vector<CopyRun>& runs = planner_.runs();
  // The launch shape matters only where the kernel may run (it costs a pass over the runs).
  const bool maybe_kernel = !block && mode != CopyMode::kMemcpy && planner_.disjoint() && !runs.empty() &&
                            (mode == CopyMode::kKernel ||
                             runs.size() >= shared->options.kernel_min_runs);
  const ScatterShape shape = maybe_kernel ? PlanScatter(runs.data(), runs.size()) : ScatterShape{};
  CopyPath path = block ? CopyPath::kKernel
                        : ChooseCopyPath(runs.size(), planner_.disjoint(), mode == CopyMode::kMemcpy,
                                         mode == CopyMode::kKernel,
                                         shared->options.kernel_min_runs, shape);
  const uint64_t t1 = profiling ? NowNs() : 0;

  DeviceGuard guard(shared->device);
  KV_RETURN_IF_ERROR(guard.status());
  cudaEvent_t done_event = nullptr, dep_event = nullptr;
  KV_ASSIGN_OR_RETURN(done_event, shared->events.Acquire());
  auto fail = [&](Status s) -> Status {
    shared->events.Release(done_event);
    shared->events.Release(dep_event);
    return s;
  };
  cudaStream_t s = stream->get();
  if (req.after_stream != nullptr) {
    auto dep = shared->events.Acquire();
    if (!dep.ok()) return fail(dep.status());
    dep_event = dep.value();
    cudaError_t err = cudaEventRecord(dep_event, static_cast<cudaStream_t>(req.after_stream));
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      return fail(InvalidArgument(std::string("cuda_ipc Write: after_stream is not a usable stream "
                                              "on device ") + std::to_string(shared->device) +
                                  ": " + cudaGetErrorName(err)));
    }
    err = cudaStreamWaitEvent(s, dep_event, 0);
    if (err != cudaSuccess) return fail(CudaStatus(err, "cudaStreamWaitEvent"));
  }
  uint64_t ring_end = 0;
  const uint64_t tc0 = profiling ? NowNs() : 0;
  if (block) {
    const std::vector<cuda::BlockEntry>& e = block_planner_.entries();
    Status ls = cuda::LaunchBlockScatterCopy(local_base, target.addr, block_planner_.unit_bytes(),
                                             e.data(), e.size(), shared->kernel, s);
    // Launches already enqueued stay enqueued, but the done event is not recorded, so this op
    // never completes: report the failure now.
    if (!ls.ok()) return fail(ls);
  } else if (path != CopyPath::kMemcpy) {
    // Preferred: the run table rides in the launch parameters (no table memory, no PCIe read
    // before a CTA's first load). Very uneven runs are cut into pieces on the host first.
    const uint64_t split = cuda::ParamSplitBytes(runs.data(), runs.size(), shared->kernel);
    if (cuda::PackRuns(runs.data(), runs.size(), split, &packed_)) {
      Status ls = cuda::LaunchParamScatterCopy(packed_, shared->kernel, s);
      // Chunks already launched stay enqueued, but the done event is not recorded, so this op
      // never completes: report the failure now.
      if (!ls.ok()) return fail(ls);
    } else {
      // Unaligned or far-apart runs: the run table goes into the pinned ring the kernel reads
      // through UVA. Unsplit runs (2-D grid) unless uneven.
      const size_t entries = path == CopyPath::kKernel
                                 ? runs.size()
                                 : cuda::ScatterTableEntries(runs.data(), runs.size());
      uint64_t start = 0;
      bool reserved;
      {
        std::lock_guard<std::mutex> lock(ring_mu_);
        reserved = ring_->Reserve(entries, &start);
      }
      if (!reserved) {
        path = CopyPath::kMemcpy;  // ring full (or table larger than it): the copy engine instead
      } else {
        CopyRun* t = static_cast<CopyRun*>(table->data()) + ring_->Index(start);
        Status ls;
        if (path == CopyPath::kKernel) {
          std::memcpy(static_cast<void*>(t), runs.data(), runs.size() * sizeof(CopyRun));
          ls = cuda::LaunchScatterCopyPieces(t, runs.size(), shape.piece_bytes,
                                             shape.pieces_per_run, s);
        } else {
          cuda::SplitRuns(runs.data(), runs.size(), t);
          ls = cuda::LaunchScatterCopy(t, entries, s);
        }
        // A failed launch enqueued nothing; its ring entries are released with the next op's.
        if (!ls.ok()) return fail(ls);
        ring_end = start + entries;
      }
    }
  }
  if (path == CopyPath::kMemcpy) {
    for (const CopyRun& r : runs) {
      cudaError_t err = cudaMemcpyAsync(reinterpret_cast<void*>(r.dst),
                                        reinterpret_cast<const void*>(r.src), r.length,
                                        cudaMemcpyDeviceToDevice, s);
      // Runs already enqueued stay enqueued; the done event below is not recorded, so this op
      // never completes: report the failure now.
      if (err != cudaSuccess) return fail(CudaStatus(err, "cudaMemcpyAsync (device to device)"));
    }
  }
  const uint64_t tc1 = profiling ? NowNs() : 0;
  // Early notification: the receiver waits for the copy on its GPU stream (for the flag this
  // stream writes after the copy), so it may learn of the write now (its user flags must be 0:
  // the flag bits carry the connection).
  const bool early = req.notify && flag_addr != 0 && req.notification.flags == 0;
  const uint32_t seq = next_seq;
  if (early) {
    // Copies already enqueued stay enqueued; without the flag write (and the done event
    // below) this op never completes: report the failure now.
    Status ws = mem_ops->Write(s, flag_addr, seq);
    if (!ws.ok()) return fail(ws);
    ++next_seq;
  }
  cudaError_t err = cudaEventRecord(done_event, s);
  if (err != cudaSuccess) return fail(CudaStatus(err, "cudaEventRecord"));
  const uint64_t t2 = profiling ? NowNs() : 0;
  auto op = std::make_shared<IpcWriteOp>();
  op->done_event = done_event;
  op->dep_event = dep_event;
  op->notify = req.notify && !early;
  op->notification = req.notification;
  op->bytes = block ? block_planner_.bytes() : planner_.bytes();
  op->transfers = block ? block_planner_.runs() : runs.size();
  op->ring_end = ring_end;
  Enqueue(op);
  if (early) {
    // Still under submit_mu_: early notifications leave in write order.
    std::shared_ptr<cuda::NotificationChannel> ch;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ch = channel;
    }
    Status sent = ch == nullptr ? Canceled("cuda_ipc: endpoint destroyed before the notification was sent")
                                : ch->SendEarly(req.notification, seq);
    if (!sent.ok()) {
      if (sent.code() == StatusCode::kRemoteDisconnect) MarkDisconnected(sent);
      Finish(*op, sent);
    }
  }
  auto handle = std::unique_ptr<WriteHandle>(new IpcWriteHandle(shared_from_this(), std::move(op)));
  if (profiling) {
    const uint64_t t3 = NowNs();
    prof.writes.fetch_add(1, std::memory_order_relaxed);
    prof.plan_ns.fetch_add(t1 - t0, std::memory_order_relaxed);
    prof.submit_ns.fetch_add(t2 - t1, std::memory_order_relaxed);
    prof.copy_ns.fetch_add(tc1 - tc0, std::memory_order_relaxed);
    prof.record_ns.fetch_add(t2 - tc1, std::memory_order_relaxed);
    prof.enqueue_ns.fetch_add(t3 - t2, std::memory_order_relaxed);
    prof.total_ns.fetch_add(t3 - t0, std::memory_order_relaxed);
    if (path == CopyPath::kMemcpy) {
      prof.memcpy_writes.fetch_add(1, std::memory_order_relaxed);
      prof.memcpy_calls.fetch_add(runs.size(), std::memory_order_relaxed);
    } else {
      prof.kernel_writes.fetch_add(1, std::memory_order_relaxed);
      if (block) prof.block_writes.fetch_add(1, std::memory_order_relaxed);
    }
  }
  return handle;
}

void EnableWriteProfile(bool on) { Profile().on.store(on); }

WriteProfile TakeWriteProfile() {
  ProfileCounters& p = Profile();
  WriteProfile w;
  w.writes = p.writes.exchange(0);
  w.plan_ns = p.plan_ns.exchange(0);
  w.submit_ns = p.submit_ns.exchange(0);
  w.copy_ns = p.copy_ns.exchange(0);
  w.record_ns = p.record_ns.exchange(0);
  w.enqueue_ns = p.enqueue_ns.exchange(0);
  w.total_ns = p.total_ns.exchange(0);
  w.kernel_writes = p.kernel_writes.exchange(0);
  w.block_writes = p.block_writes.exchange(0);
  w.memcpy_writes = p.memcpy_writes.exchange(0);
  w.memcpy_calls = p.memcpy_calls.exchange(0);
  w.notify_batches = p.notify_batches.exchange(0);
  w.notify_frames = p.notify_frames.exchange(0);
  w.wakeups = p.wakeups.exchange(0);
  return w;
}

}  // namespace kvstream::transport::cuda_ipc
