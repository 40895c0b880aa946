#include "transport/cuda_ipc/cuda_ipc_transport.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "common/log.h"
#include "transport/cuda/control_socket.h"
#include "transport/cuda/copy_plan.h"
#include "transport/cuda/cuda_util.h"
#include "transport/cuda/landed_flags.h"

namespace kvstream::transport::cuda_ipc {
namespace {

using cuda::CopyRun;
using cuda::CudaStatus;
using cuda::BlockPlanner;
using cuda::ChooseCopyPath;
using cuda::CopyPath;
using cuda::CopyPlanner;
using cuda::DeviceGuard;
using cuda::PlanScatter;
using cuda::RunRing;
using cuda::ScatterShape;

constexpr char kKeyMagic[8] = {'K', 'V', 'I', 'P', 'C', 'K', '0', '1'};
constexpr uint32_t kKeyVersion = 1;

// The RemoteKey blob. Fixed layout, same host only (host byte order).
struct KeyWire {
  char magic[8];
  uint32_t version;
  int32_t device;
  char pci_bus_id[32];
  char host_id[48];
  uint64_t pid;
  uint64_t alloc_base;
  uint64_t alloc_size;
  uint64_t offset;
  uint64_t length;
  cudaIpcMemHandle_t handle;
};

Result<KeyWire> ParseKey(const std::string& key) {
  if (key.size() != sizeof(KeyWire)) {
    return InvalidArgument("cuda_ipc: remote key has " + std::to_string(key.size()) +
                           " bytes, expected " + std::to_string(sizeof(KeyWire)) +
                           " (not a cuda_ipc key?)");
  }
  KeyWire k;
  std::memcpy(&k, key.data(), sizeof(k));
  if (std::memcmp(k.magic, kKeyMagic, sizeof(kKeyMagic)) != 0) {
    return InvalidArgument("cuda_ipc: remote key has a bad magic (not a cuda_ipc key)");
  }
  if (k.version != kKeyVersion) {
    return InvalidArgument("cuda_ipc: remote key version " + std::to_string(k.version) +
                           ", this build speaks " + std::to_string(kKeyVersion));
  }
  if (k.length == 0 || k.offset > k.alloc_size || k.length > k.alloc_size - k.offset) {
    return InvalidArgument("cuda_ipc: remote key's region lies outside its allocation");
  }
  k.pci_bus_id[sizeof(k.pci_bus_id) - 1] = 0;
  k.host_id[sizeof(k.host_id) - 1] = 0;
  return k;
}

// An opened peer allocation (or, for a peer in this very process, its own pointer).
struct Mapping {
  int device = -1;
  void* base = nullptr;
  bool opened = false;  // true: cudaIpcOpenMemHandle'd, close on destruction
  ~Mapping() {
    if (!opened) return;
    DeviceGuard guard(device);
    cudaError_t err = cudaIpcCloseMemHandle(base);
    if (err != cudaSuccess) {
      KV_LOG_WARN << CudaStatus(err, "cudaIpcCloseMemHandle").ToString();
    }
  }
};

struct Shared {
  CudaIpcOptions options;
  int device = -1;
  int priority = 0;
  explicit Shared(int dev) : device(dev), events(dev) {}
  cuda::ParamKernelConfig kernel = cuda::ParamKernelConfigFromEnv();
  cuda::EventPool events;

  std::mutex map_mu;
  std::map<std::string, std::weak_ptr<Mapping>> mappings;  // by pid + handle bytes

  std::mutex sink_mu;
  NotificationSink sink;

  Result<std::shared_ptr<Mapping>> Open(const KeyWire& k) {
    std::string id(reinterpret_cast<const char*>(&k.pid), sizeof(k.pid));
    id.append(reinterpret_cast<const char*>(&k.handle), sizeof(k.handle));
    std::lock_guard<std::mutex> lock(map_mu);
    if (auto m = mappings[id].lock()) return m;
    auto m = std::make_shared<Mapping>();
    m->device = device;
    if (k.pid == static_cast<uint64_t>(::getpid())) {
      // cudaIpcOpenMemHandle refuses handles of its own process; the pointer is valid here.
      m->base = reinterpret_cast<void*>(k.alloc_base);
    } else {
      DeviceGuard guard(device);
      KV_RETURN_IF_ERROR(guard.status());
      cudaError_t err = cudaIpcOpenMemHandle(&m->base, k.handle, cudaIpcMemLazyEnablePeerAccess);
      if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return Unavailable(std::string("cuda_ipc: cudaIpcOpenMemHandle of the peer's allocation "
                                       "(device ") + k.pci_bus_id + ", pid " +
                           std::to_string(k.pid) + ") from device " + std::to_string(device) +
                           ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
      }
      m->opened = true;
    }
    mappings[id] = m;
    return m;
  }
};

class IpcRegistration : public Registration {
 public:
  IpcRegistration(MemoryRegion region, std::string key)
      : region_(region), key_(std::move(key)) {}
  const MemoryRegion& region() const override { return region_; }
  std::string RemoteKey() const override { return key_; }

 private:
  MemoryRegion region_;
  std::string key_;
};

struct Target {
  std::shared_ptr<Mapping> mapping;
  uint64_t addr = 0;  // region start in this process's address space
  uint64_t length = 0;
};

struct Op {
  cudaEvent_t done_event = nullptr;
  cudaEvent_t dep_event = nullptr;
  bool notify = false;
  Notification notification;
  uint64_t bytes = 0;
  uint64_t transfers = 0;  // coalesced runs
  uint64_t ring_end = 0;   // run-table ring entries this op holds end here (0: none)
  std::atomic<int> state{0};  // 0 in flight, 1 finishing, 2 done (result valid)
  Status result;
};

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

// Locks, in the order they may nest: submit_mu_ -> ring_mu_, q_mu_, mu_ (the last three are
// leaves). No CUDA call and no syscall runs under q_mu_ or ring_mu_: the writer's per-layer path
// must never wait behind the completion thread's cudaEventQuery or socket write.
class Core : public std::enable_shared_from_this<Core> {
 public:
  std::shared_ptr<Shared> shared;
  std::unique_ptr<cuda::Stream> stream;
  std::shared_ptr<cuda::NotificationChannel> channel;
  std::vector<Target> targets;
  std::unique_ptr<cuda::PinnedBuffer> table;
  size_t table_capacity = 0;
  int wake_fd = -1;

  // Early notifications (the receiver granted a landed flag, gpu_landed_wait; landed_flags.h):
  // after each notified write's copy the copy stream writes the write's sequence number into
  // the receiver's flag at flag_addr (0: none, notifications are late).
  std::shared_ptr<Mapping> flag_mapping;
  uint64_t flag_addr = 0;
  const cuda::StreamMemOps* mem_ops = nullptr;
  uint32_t next_seq = 0;  // under submit_mu_

  ~Core() {
    Shutdown();
    if (wake_fd >= 0) ::close(wake_fd);
  }

  void Start() {
    ring_ = std::make_unique<RunRing>(table_capacity);
    thread_ = std::thread([this] { Run(); });
  }

  Status status() const {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }

  // Marks `op` done with `s` (then sends its notification if asked and s is OK). Exactly one
  // caller wins; the others return without effect.
  void Finish(Op& op, Status s) {
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

  // Polls the op's event once and finishes it if the copy completed.
  void TryFinish(Op& op) {
    if (op.state.load(std::memory_order_acquire) != 0) return;
    cudaError_t err = cudaEventQuery(op.done_event);
    if (err == cudaErrorNotReady) return;
    Finish(op, CudaStatus(err, "cuda_ipc copy"));
  }

  Result<std::unique_ptr<WriteHandle>> Write(const WriteRequest& req);

  void Shutdown() {
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
    std::deque<std::shared_ptr<Op>> left;
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

 private:
  void Wake() {
    uint64_t one = 1;
    if (wake_fd >= 0) (void)!::write(wake_fd, &one, sizeof(one));
  }

  void ReleaseEvents(Op& op) {
    shared->events.Release(op.done_event);
    shared->events.Release(op.dep_event);
    // The fields keep their values: a waiter may still query a recycled event, which at worst
    // reports a state its CAS in Finish() then ignores.
  }

  void MarkDisconnected(const Status& why) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!status_.ok()) return;
      status_ = why;
      failed_.store(true);
    }
    std::deque<std::shared_ptr<Op>> snapshot;
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
  void FinishBatch(std::vector<std::pair<std::shared_ptr<Op>, cudaError_t>>& done) {
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
    for (Op* op : claimed_) {
      if (op->result.ok() && op->notify && !send.ok()) op->result = send;
      op->state.store(2, std::memory_order_release);
    }
    if (!send.ok() && send.code() == StatusCode::kRemoteDisconnect) MarkDisconnected(send);
    for (auto& [op, err] : done) ReleaseEvents(*op);
    done.clear();
  }

  void Run() {
    DeviceGuard guard(shared->device);
    // Short ppoll timeouts below are meant literally (the default 50 us slack would triple them).
    (void)::prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    std::vector<std::pair<std::shared_ptr<Op>, cudaError_t>> completed;
    constexpr uint64_t kLingerNs = 200 * 1000;
    uint64_t idle_since = 0;
    while (!stop_.load()) {
      // One in-order stream: the first incomplete op blocks all later ones. The event query
      // runs outside q_mu_ (only this thread pops).
      uint64_t ring_end = 0;
      for (;;) {
        std::shared_ptr<Op> front;
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
      pollfd fds[2] = {{channel_fd_, POLLIN | POLLRDHUP, 0}, {wake_fd, POLLIN, 0}};
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
          channel_fd_ = -1;  // poll ignores negative fds
        }
      }
    }
  }

 public:
  int channel_fd_ = -1;

 private:
  mutable std::mutex mu_;  // status_, channel
  Status status_;
  std::atomic<bool> failed_{false};  // status_ is not OK (Write's lock-free check)
  std::mutex q_mu_;
  std::deque<std::shared_ptr<Op>> pending_;
  std::atomic<bool> sleeping_{false};
  std::mutex ring_mu_;
  std::unique_ptr<RunRing> ring_;
  std::mutex submit_mu_;  // one Write() at a time submits (stream order = queue order)
  CopyPlanner planner_;   // under submit_mu_
  BlockPlanner block_planner_;  // under submit_mu_
  // Units one write may carry in the block-table form (several launches beyond
  // cuda::BlockTableLaunchCapacity()); larger writes take the general plan.
  static constexpr size_t kMaxBlockEntries = 64 * 1024;
  cuda::PackedTable packed_;  // under submit_mu_
  // Completion thread's scratch (no allocation per batch once grown).
  std::vector<Op*> claimed_;
  std::vector<Notification> frames_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> shut_down_{false};
  std::thread thread_;

  friend class IpcWriteHandle;
  void Enqueue(std::shared_ptr<Op> op) {
    {
      std::lock_guard<std::mutex> lock(q_mu_);
      pending_.push_back(std::move(op));
    }
    if (sleeping_.exchange(false)) Wake();
  }
};

class IpcWriteHandle : public WriteHandle {
 public:
  IpcWriteHandle(std::shared_ptr<Core> core, std::shared_ptr<Op> op)
      : core_(std::move(core)), op_(std::move(op)) {}
  bool Done() const override {
    core_->TryFinish(*op_);
    return op_->state.load(std::memory_order_acquire) == 2;
  }
  Status Wait(Deadline deadline) override {
    auto start = Clock::now();
    for (;;) {
      core_->TryFinish(*op_);
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
  std::shared_ptr<Core> core_;
  std::shared_ptr<Op> op_;
};

Result<std::unique_ptr<WriteHandle>> Core::Write(const WriteRequest& req) {
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
  const Target& target = targets[static_cast<size_t>(req.remote_region)];
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
  auto op = std::make_shared<Op>();
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

class IpcEndpoint : public Endpoint {
 public:
  explicit IpcEndpoint(std::shared_ptr<Core> core) : core_(std::move(core)) {}
  ~IpcEndpoint() override { core_->Shutdown(); }
  Result<std::unique_ptr<WriteHandle>> Write(const WriteRequest& request) override {
    return core_->Write(request);
  }
  Status status() const override { return core_->status(); }

 private:
  std::shared_ptr<Core> core_;
};

class CudaIpcTransport : public Transport {
 public:
  explicit CudaIpcTransport(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}
  ~CudaIpcTransport() override {
    // The watchdog may drop listener connections, and the listener calls into the table:
    // stop the first, then the second, then free the table.
    if (flags_) flags_->Stop();
    listener_.reset();
    flags_reg_.reset();
    flags_.reset();
  }

  Status Init() {
    std::weak_ptr<Shared> weak = shared_;
    KV_ASSIGN_OR_RETURN(
        listener_,
        cuda::NotificationListener::Start(
            "kvstream-cuda-ipc",
            [weak, this](const Notification& n) {
              auto sh = weak.lock();
              if (!sh) return;
              // The table learns of the write before the consumer can ask to wait for it.
              if ((n.flags & kNotificationLandedOnEvent) != 0 && flags_ != nullptr) {
                flags_->OnEarly(static_cast<uint32_t>(n.flags & cuda::kLandedConnMask), n.landed_seq);
              }
              std::lock_guard<std::mutex> lock(sh->sink_mu);
              if (sh->sink) sh->sink(n);
            },
            [this](uint32_t conn, uint32_t) -> Result<cuda::FlagGrant> {
              if (flags_ == nullptr) return NotSupported("gpu_landed_wait is off");
              return flags_->Grant(conn);
            },
            [this](uint32_t conn) {
              if (flags_ != nullptr) flags_->OnClosed(conn);
            }));
    if (shared_->options.gpu_landed_wait) {
      // Without landed flags the receiver still works, with late notifications (logged).
      Status s = MakeLandedFlags();
      if (!s.ok()) {
        KV_LOG_WARN << "cuda_ipc: gpu_landed_wait unavailable, notifications stay late: "
                    << s.ToString();
        if (flags_) flags_->Stop();
        flags_reg_.reset();
        flags_.reset();
      }
    }
    return OkStatus();
  }

  Status StreamWaitLanded(const Notification& n, void* stream, Deadline deadline) override {
    if ((n.flags & kNotificationLandedOnEvent) == 0) return OkStatus();
    if (stream == nullptr) return InvalidArgument("cuda_ipc StreamWaitLanded: no stream");
    if (flags_ == nullptr) return NotSupported("cuda_ipc: this receiver has no landed flags");
    return flags_->Wait(n, static_cast<cudaStream_t>(stream), deadline);
  }

  Status ConfirmLanded(const Notification& n) override {
    if ((n.flags & kNotificationLandedOnEvent) == 0) return OkStatus();
    if (flags_ == nullptr) return NotSupported("cuda_ipc: this receiver has no landed flags");
    return flags_->Confirm(n);
  }

  std::string name() const override { return "cuda_ipc"; }
  Capabilities capabilities() const override {
    Capabilities c;
    c.host_memory = false;
    c.cuda_memory = true;
    c.remote = false;
    c.notifications = true;
    return c;
  }
  std::string LocalAddress() const override {
    return listener_->address() + (flags_ != nullptr ? cuda::kLandedFlagsSuffix : "");
  }

  Result<std::unique_ptr<Registration>> Register(const MemoryRegion& region) override {
    if (region.kind != MemoryKind::kCuda) {
      return NotSupported("cuda_ipc registers only CUDA device memory (kCuda), not host memory");
    }
    if (region.addr == nullptr || region.length == 0) {
      return InvalidArgument("cuda_ipc Register: null address or zero length");
    }
    KV_ASSIGN_OR_RETURN(cuda::DevicePointerInfo info,
                        cuda::QueryDevicePointer(region.addr, region.length));
    if (region.device >= 0 && region.device != info.device) {
      return InvalidArgument("cuda_ipc Register: region says device " +
                             std::to_string(region.device) + " but the memory is on device " +
                             std::to_string(info.device));
    }
    DeviceGuard guard(info.device);
    KV_RETURN_IF_ERROR(guard.status());
    KeyWire k{};
    std::memcpy(k.magic, kKeyMagic, sizeof(kKeyMagic));
    k.version = kKeyVersion;
    k.device = info.device;
    KV_ASSIGN_OR_RETURN(std::string bus, cuda::PciBusId(info.device));
    std::strncpy(k.pci_bus_id, bus.c_str(), sizeof(k.pci_bus_id) - 1);
    std::strncpy(k.host_id, cuda::HostIdentity().c_str(), sizeof(k.host_id) - 1);
    k.pid = static_cast<uint64_t>(::getpid());
    k.alloc_base = info.alloc_base;
    k.alloc_size = info.alloc_size;
    k.offset = reinterpret_cast<uint64_t>(region.addr) - info.alloc_base;
    k.length = region.length;
    cudaError_t err = cudaIpcGetMemHandle(&k.handle, reinterpret_cast<void*>(info.alloc_base));
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      return NotSupported(std::string("cuda_ipc Register: cudaIpcGetMemHandle refused this "
                                      "allocation (allocate it with cudaMalloc): ") +
                          cudaGetErrorName(err));
    }
    MemoryRegion r = region;
    r.device = info.device;
    return std::unique_ptr<Registration>(
        new IpcRegistration(r, std::string(reinterpret_cast<const char*>(&k), sizeof(k))));
  }

  Result<std::unique_ptr<Endpoint>> Connect(const PeerDescriptor& peer) override {
    auto core = std::make_shared<Core>();
    core->shared = shared_;
    for (size_t i = 0; i < peer.regions.size(); ++i) {
      auto parsed = ParseKey(peer.regions[i].key);
      if (!parsed.ok()) return parsed.status().WithContext("region " + std::to_string(i));
      const KeyWire& k = parsed.value();
      if (cuda::HostIdentity() != k.host_id) {
        return NotSupported("cuda_ipc: region " + std::to_string(i) +
                            " belongs to another host; cuda_ipc works on one host only");
      }
      if (peer.regions[i].length > k.length) {
        return InvalidArgument("cuda_ipc: region " + std::to_string(i) + " claims " +
                               std::to_string(peer.regions[i].length) + " bytes, its key " +
                               std::to_string(k.length));
      }
      KV_ASSIGN_OR_RETURN(std::shared_ptr<Mapping> m, shared_->Open(k));
      core->targets.push_back({m, reinterpret_cast<uint64_t>(m->base) + k.offset, k.length});
    }
    KV_ASSIGN_OR_RETURN(auto ch, cuda::NotificationChannel::Connect(
                                     peer.address,
                                     DeadlineAfterMs(shared_->options.connect_timeout_ms)));
    core->channel_fd_ = ch->fd();
    core->channel = std::move(ch);
    KV_ASSIGN_OR_RETURN(core->stream, cuda::Stream::CreateLowestPriority(shared_->device));
    core->table_capacity = std::max<size_t>(shared_->options.table_entries, 1);
    KV_ASSIGN_OR_RETURN(core->table,
                        cuda::PinnedBuffer::Allocate(core->table_capacity * sizeof(CopyRun)));
    core->wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (core->wake_fd < 0) return Internal("cuda_ipc: eventfd failed");
    if (cuda::AddressWantsLandedFlags(peer.address)) {
      // Before the completion thread starts: the grant is the only thing the receiver sends.
      Status s = SetUpLandedFlag(*core, DeadlineAfterMs(shared_->options.connect_timeout_ms));
      if (s.code() == StatusCode::kRemoteDisconnect || s.code() == StatusCode::kTimeout) return s;
      if (!s.ok()) {
        // Without the flag the writes still work, with notifications after completion.
        KV_LOG_WARN << "cuda_ipc: no early notifications for " << peer.address << ": " << s.ToString();
        core->flag_addr = 0;
        core->flag_mapping.reset();
      }
    }
    core->Start();
    return std::unique_ptr<Endpoint>(new IpcEndpoint(std::move(core)));
  }

  void SetNotificationSink(NotificationSink sink) override {
    std::lock_guard<std::mutex> lock(shared_->sink_mu);
    shared_->sink = std::move(sink);
  }

 private:
  // Receiver: the flag array, registered like any region so that writers map it with the key.
  Status MakeLandedFlags() {
    KV_ASSIGN_OR_RETURN(flags_, cuda::LandedFlagTable::Create(
                                    shared_->device, &shared_->events,
                                    [l = listener_.get()](uint32_t conn) { l->Drop(conn); }));
    MemoryRegion r{flags_->array(), flags_->array_bytes(), MemoryKind::kCuda, shared_->device};
    KV_ASSIGN_OR_RETURN(flags_reg_, Register(r));
    flags_->SetArrayKey(flags_reg_->RemoteKey());
    return OkStatus();
  }

  // Writer: asks for a landed flag and maps the receiver's array.
  Status SetUpLandedFlag(Core& core, Deadline deadline) {
    KV_ASSIGN_OR_RETURN(core.mem_ops, cuda::StreamMemOps::Get());
    KV_ASSIGN_OR_RETURN(cuda::FlagGrant g, core.channel->RequestLandedFlag(deadline));
    KV_ASSIGN_OR_RETURN(KeyWire k, ParseKey(g.key));
    if (cuda::HostIdentity() != k.host_id) {
      return NotSupported("cuda_ipc: the landed-flag array belongs to another host");
    }
    if ((uint64_t(g.slot) + 1) * sizeof(uint32_t) > k.length) {
      return InvalidArgument("cuda_ipc: landed flag slot " + std::to_string(g.slot) +
                             " lies outside the receiver's array");
    }
    KV_ASSIGN_OR_RETURN(core.flag_mapping, shared_->Open(k));
    core.flag_addr = reinterpret_cast<uint64_t>(core.flag_mapping->base) + k.offset +
                     uint64_t(g.slot) * sizeof(uint32_t);
    core.next_seq = g.first_seq;
    return OkStatus();
  }

  std::shared_ptr<Shared> shared_;
  std::unique_ptr<cuda::NotificationListener> listener_;
  // Receiver with gpu_landed_wait (null otherwise): set in Init, before the address is known.
  std::unique_ptr<cuda::LandedFlagTable> flags_;
  std::unique_ptr<Registration> flags_reg_;
};

}  // namespace

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

CopyMode CopyModeFromEnv() {
  const char* v = std::getenv("KVSTREAM_CUDA_IPC_COPY");
  if (v == nullptr) return CopyMode::kAuto;
  std::string s(v);
  if (s == "memcpy") return CopyMode::kMemcpy;
  if (s == "kernel") return CopyMode::kKernel;
  return CopyMode::kAuto;
}

bool BlockTableFromEnv() {
  const char* v = std::getenv("KVSTREAM_CUDA_IPC_TABLE");
  return v == nullptr || std::string(v) != "packed";
}

Result<std::unique_ptr<Transport>> CreateCudaIpcTransport(const CudaIpcOptions& options) {
  KV_ASSIGN_OR_RETURN(int device, cuda::ResolveDevice(options.device, "cuda_ipc"));
  KV_RETURN_IF_ERROR(cuda::PrepareDevice(device));
  auto shared = std::make_shared<Shared>(device);
  shared->options = options;
  shared->options.device = device;
  auto t = std::make_unique<CudaIpcTransport>(shared);
  KV_RETURN_IF_ERROR(t->Init());
  return std::unique_ptr<Transport>(std::move(t));
}

Result<std::unique_ptr<Transport>> CreateCudaIpcTransport(const TransportOptions& options) {
  CudaIpcOptions o;
  o.device = options.device;
  o.copy_mode = CopyModeFromEnv();
  o.block_table = BlockTableFromEnv();
  o.gpu_landed_wait = options.cuda_ipc_gpu_landed_wait;
  return CreateCudaIpcTransport(o);
}

}  // namespace kvstream::transport::cuda_ipc
