#include "transport/nccl/nccl_transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <thread>

#include "common/log.h"
#include "transport/cuda/copy_plan.h"
#include "transport/cuda/cuda_util.h"
#include "transport/nccl/nccl_wire.h"

#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "the nccl transport needs NCCL 2.18 or newer (non-blocking communicators, ncclCommAbort)"
#endif

namespace kvstream::transport::nccl {
namespace {

using cuda::CopyRun;
using cuda::CudaStatus;
using cuda::DeviceGuard;

constexpr size_t kGroupOps = 64;          // sends/recvs per NCCL group in direct mode
constexpr int64_t kSendTimeoutSec = 5;    // control-socket writes

// KVSTREAM_NCCL_TRACE=1: one stderr line per completed write on each side, with the time of each
// step since the write was handed over (writer) or its header arrived (receiver), to see where
// a write's time goes.
bool TraceEnabled() {
  static const bool on = [] {
    const char* v = std::getenv("KVSTREAM_NCCL_TRACE");
    return v != nullptr && *v && std::string(v) != "0";
  }();
  return on;
}
double MicrosSince(Clock::time_point from, Clock::time_point to) {
  if (to.time_since_epoch().count() == 0) return -1;
  return std::chrono::duration<double, std::micro>(to - from).count();
}

Status NcclStatus(ncclResult_t r, ncclComm_t comm, const std::string& what) {
  if (r == ncclSuccess) return OkStatus();
  std::string detail = ncclGetErrorString(r);
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && *last) detail += std::string(" (") + last + ")";
  }
  if (r == ncclRemoteError) return RemoteDisconnect("nccl: " + what + ": " + detail);
  return Internal("nccl: " + what + ": " + detail);
}

Status Errno(const std::string& what) {
  return Unavailable("nccl: " + what + ": " + std::strerror(errno));
}

// ---- sockets ------------------------------------------------------------------------------

bool SendAll(int fd, const std::string& data) {
  const char* p = data.data();
  size_t n = data.size();
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

void SetSocketOptions(int fd) {
  int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  timeval tv{kSendTimeoutSec, 0};
  (void)::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

Result<int> ConnectTcp(const std::string& host, uint16_t port, Deadline deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (gai != 0) return Unavailable("nccl: resolving " + host + ": " + gai_strerror(gai));
  Status last = Unavailable("nccl: no address for " + host);
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      pollfd p{fd, POLLOUT, 0};
      rc = left.count() > 0 && ::poll(&p, 1, static_cast<int>(left.count())) == 1 ? 0 : -1;
      int err = ETIMEDOUT;
      socklen_t len = sizeof(err);
      if (rc == 0 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
        rc = 0;
      } else {
        rc = -1;
        errno = err;
      }
    }
    if (rc == 0) {
      ::freeaddrinfo(res);
      int flags = ::fcntl(fd, F_GETFL);
      (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
      SetSocketOptions(fd);
      return fd;
    }
    last = Errno("connect " + host + ":" + std::to_string(port));
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return last;
}

// ---- communicator -------------------------------------------------------------------------

// An asynchronous error of a two-rank communicator means the transfer path to the one peer
// failed (its process died, or the link or network did): kRemoteDisconnect, as transport.h asks,
// with NCCL's own words.
Status CommFailed(ncclResult_t st, ncclComm_t comm, const std::string& what) {
  return RemoteDisconnect("nccl: communicator failed (peer or link lost?): " +
                          NcclStatus(st, comm, what).message());
}

// Polls a non-blocking communicator until its last call completed. `alive` is asked between
// polls (socket EOF, shutdown); its error ends the wait.
//
// A non-blocking ncclGroupEnd hands the launch to a thread of its own and returns
// ncclInProgress; the launch itself takes tens of microseconds. Every write waits for one (on
// each side), so the first millisecond is polled with yields: a 20 us sleep costs ~70 us with
// Linux's default 50 us timer slack, which made up most of a small write's time. Waits that
// last longer (communicator init) fall back to sleeping.
Status WaitComm(ncclComm_t comm, Deadline deadline, const std::function<Status()>& alive,
                const std::string& what, bool tight = true) {
  const auto spin_until = Clock::now() + std::chrono::milliseconds(tight ? 1 : 0);
  for (int i = 0;; ++i) {
    ncclResult_t st = ncclInProgress;
    ncclResult_t r = ncclCommGetAsyncError(comm, &st);
    if (r != ncclSuccess) return NcclStatus(r, comm, "ncclCommGetAsyncError");
    if (st == ncclSuccess) return OkStatus();
    if (st != ncclInProgress) return CommFailed(st, comm, what);
    if ((i & 63) == 0 && alive) KV_RETURN_IF_ERROR(alive());
    if (Expired(deadline)) return Timeout("nccl: " + what + " did not complete before the deadline");
    if (Clock::now() < spin_until) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(i < 5000 ? 20 : 500));
    }
  }
}

// The writer's and receiver's threads wait in short polls while writes are in flight; with the
// default 50 us timer slack each would oversleep by up to that much.
void TightenTimerSlack() { (void)::prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0); }

Result<ncclComm_t> InitComm(int device, const std::string& unique_id, int rank, Deadline deadline,
                            const std::function<Status()>& alive) {
  DeviceGuard guard(device);
  KV_RETURN_IF_ERROR(guard.status());
  ncclUniqueId id;
  static_assert(sizeof(id) == kUniqueIdBytes);
  std::memcpy(&id, unique_id.data(), sizeof(id));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, 2, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm != nullptr) (void)ncclCommAbort(comm);
    return NcclStatus(r, nullptr, "ncclCommInitRankConfig");
  }
  Status s = WaitComm(comm, deadline, alive, "communicator init");
  if (!s.ok()) {
    (void)ncclCommAbort(comm);
    return s.WithContext("joining the 2-rank communicator as rank " + std::to_string(rank));
  }
  return comm;
}

// NCCL connects a peer's point-to-point channels on the first send / receive to it (~100 ms on
// an H200 pair over NVLink, bench/results/transfer_nccl_2026-11-29_v2.md), which would land on
// the first write of each connection, i.e. on a request's TTFT. So each end, right after
// communicator init and inside the connect deadline, makes one kWarmUpBytes send (rank 0) /
// receive (rank 1): the direction, communicator and stream the writes use. It waits for the
// exchange itself too, so a link that cannot move bytes fails Connect, not the first write.
// `buf` is slot 0 of that end's staging buffer, which nothing else touches before this returns.
constexpr size_t kWarmUpBytes = 16;

Status WarmUp(ncclComm_t comm, int rank, void* buf, cudaStream_t stream, Deadline deadline,
              const std::function<Status()>& alive) {
  if (rank == 0) {
    KV_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(buf, 0, kWarmUpBytes, stream), "nccl: warm-up memset");
  }
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return NcclStatus(r, comm, "ncclGroupStart");
  const ncclResult_t call = rank == 0 ? ncclSend(buf, kWarmUpBytes, ncclUint8, 1, comm, stream)
                                      : ncclRecv(buf, kWarmUpBytes, ncclUint8, 0, comm, stream);
  r = ncclGroupEnd();
  if (call != ncclSuccess && call != ncclInProgress) {
    return NcclStatus(call, comm, rank == 0 ? "warm-up ncclSend" : "warm-up ncclRecv");
  }
  if (r != ncclSuccess && r != ncclInProgress) return NcclStatus(r, comm, "warm-up ncclGroupEnd");
  KV_RETURN_IF_ERROR(WaitComm(comm, deadline, alive, "warm-up launch (point-to-point connect)",
                              /*tight=*/false));
  for (;;) {
    const cudaError_t err = cudaStreamQuery(stream);
    if (err == cudaSuccess) return OkStatus();
    if (err != cudaErrorNotReady) return CudaStatus(err, "nccl: warm-up exchange");
    ncclResult_t st = ncclSuccess;
    r = ncclCommGetAsyncError(comm, &st);
    if (r != ncclSuccess) return NcclStatus(r, comm, "ncclCommGetAsyncError");
    if (st != ncclSuccess && st != ncclInProgress) return CommFailed(st, comm, "warm-up exchange");
    if (alive) KV_RETURN_IF_ERROR(alive());
    if (Expired(deadline)) {
      return Timeout("nccl: the warm-up exchange did not complete before the connect deadline");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// The gather (writer) / scatter (receiver) of one chunk: the parameter-table kernel when the
// pieces are 16-byte aligned, else one cudaMemcpyAsync per piece.
Status CopyPieces(const std::vector<CopyRun>& runs, cuda::PackedTable* table,
                  const cuda::ParamKernelConfig& cfg, cudaStream_t stream) {
  if (runs.empty()) return OkStatus();
  if (runs.size() > 1 &&
      cuda::PackRuns(runs.data(), runs.size(), cuda::ParamSplitBytes(runs.data(), runs.size(), cfg),
                     table)) {
    return cuda::LaunchParamScatterCopy(*table, cfg, stream);
  }
  for (const CopyRun& r : runs) {
    KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(reinterpret_cast<void*>(r.dst),
                                            reinterpret_cast<const void*>(r.src), r.length,
                                            cudaMemcpyDeviceToDevice, stream),
                            "nccl: staging copy");
  }
  return OkStatus();
}

// Two staging buffers and the events that order their reuse, per endpoint / connection side.
struct Staging {
  std::unique_ptr<cuda::DeviceBuffer> buffer;  // 2 * chunk_bytes
  uint64_t chunk_bytes = 0;
  cudaEvent_t filled[2] = {nullptr, nullptr};  // data in the slot is ready to send / unpack
  cudaEvent_t freed[2] = {nullptr, nullptr};   // the slot may be overwritten
  uint64_t next = 0;
  char* slot(int i) const { return static_cast<char*>(buffer->data()) + i * chunk_bytes; }
};

// ---- shared state -------------------------------------------------------------------------

struct Shared {
  NcclOptions options;
  int device = -1;
  std::string pci_bus_id;
  std::string host_id;
  cuda::ParamKernelConfig kernel = cuda::ParamKernelConfigFromEnv();
  explicit Shared(int dev) : device(dev), events(dev) {}
  cuda::EventPool events;

  std::mutex reg_mu;
  std::map<uint64_t, MemoryRegion> regs;  // receiver side: by registration id
  uint64_t next_reg_id = 1;

  std::mutex sink_mu;
  NotificationSink sink;

  std::mutex id_mu;
  std::string advertised_id;
  bool advertised_used = false;

  Status InitStaging(Staging* st, uint64_t chunk_bytes) {
    st->chunk_bytes = chunk_bytes;
    KV_ASSIGN_OR_RETURN(st->buffer, cuda::DeviceBuffer::Allocate(device, 2 * chunk_bytes));
    for (int i = 0; i < 2; ++i) {
      KV_ASSIGN_OR_RETURN(st->filled[i], events.Acquire());
      KV_ASSIGN_OR_RETURN(st->freed[i], events.Acquire());
    }
    return OkStatus();
  }
  void ReleaseStaging(Staging* st) {
    for (int i = 0; i < 2; ++i) {
      if (st->filled[i]) events.Release(st->filled[i]);
      if (st->freed[i]) events.Release(st->freed[i]);
      st->filled[i] = st->freed[i] = nullptr;
    }
    st->buffer.reset();
  }
};

class NcclRegistration : public Registration {
 public:
  NcclRegistration(std::shared_ptr<Shared> shared, uint64_t id, MemoryRegion region, std::string key)
      : shared_(std::move(shared)), id_(id), region_(region), key_(std::move(key)) {}
  ~NcclRegistration() override {
    std::lock_guard<std::mutex> lock(shared_->reg_mu);
    shared_->regs.erase(id_);
  }
  const MemoryRegion& region() const override { return region_; }
  std::string RemoteKey() const override { return key_; }
  const Shared* owner() const { return shared_.get(); }

 private:
  std::shared_ptr<Shared> shared_;
  uint64_t id_;
  MemoryRegion region_;
  std::string key_;
};

// ---- writer side --------------------------------------------------------------------------

struct Op {
  WriteHeader header;
  std::vector<uint64_t> src;  // local UVA address of each run
  cudaEvent_t dep = nullptr;  // recorded on after_stream
  cudaEvent_t sent = nullptr; // the sender's streams are done with the source
  bool acked = false;
  std::atomic<bool> cancel{false};
  // Trace (worker thread only, and Write() before the handover).
  Clock::time_point t_write, t_taken, t_header, t_group_end, t_launched, t_acked;

  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status result;

  void Finish(Status s) {
    std::lock_guard<std::mutex> lock(mu);
    if (done) return;
    result = std::move(s);
    done = true;
    cv.notify_all();
  }
};

class NcclWriteHandle : public WriteHandle {
 public:
  explicit NcclWriteHandle(std::shared_ptr<Op> op) : op_(std::move(op)) {}
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
  std::shared_ptr<Op> op_;
};

struct RemoteTarget {
  uint64_t registration_id = 0;
  uint64_t length = 0;
};

// One writer endpoint: its socket, communicator, streams and the thread that makes every NCCL
// call of the endpoint (a non-blocking communicator must not be driven from two threads).
class Writer {
 public:
  std::shared_ptr<Shared> shared;
  std::vector<RemoteTarget> targets;
  int fd = -1;
  int wake_fd = -1;
  ncclComm_t comm = nullptr;
  std::unique_ptr<cuda::Stream> comm_stream, pack_stream;
  Staging staging;
  CopyMode mode = CopyMode::kAuto;

  ~Writer() {
    Shutdown();
    if (fd >= 0) ::close(fd);
    if (wake_fd >= 0) ::close(wake_fd);
  }

  void Start() { thread_ = std::thread([this] { Run(); }); }

  Status status() const {
    std::lock_guard<std::mutex> lock(status_mu_);
    return status_;
  }

  Result<std::unique_ptr<WriteHandle>> Write(const WriteRequest& req) {
    if (req.local == nullptr) return InvalidArgument("nccl Write: no local registration");
    auto* reg = dynamic_cast<const NcclRegistration*>(req.local);
    if (reg == nullptr || reg->owner() != shared.get()) {
      return InvalidArgument("nccl Write: the local registration was not made by this transport");
    }
    if (req.remote_region < 0 || static_cast<size_t>(req.remote_region) >= targets.size()) {
      return InvalidArgument("nccl Write: remote region " + std::to_string(req.remote_region) +
                             " out of range (peer has " + std::to_string(targets.size()) + ")");
    }
    const RemoteTarget& target = targets[req.remote_region];
    cuda::CopyPlanner planner;
    const uint64_t local_base = reinterpret_cast<uint64_t>(reg->region().addr);
    KV_RETURN_IF_ERROR(planner.Build(req.ops, local_base, reg->region().length, 0, target.length));
    KV_RETURN_IF_ERROR(status());
    auto op = std::make_shared<Op>();
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
    if (TraceEnabled()) op->t_write = Clock::now();
    {
      std::lock_guard<std::mutex> lock(q_mu_);
      op->header.write_id = next_write_id_++;
      queue_.push_back(op);
    }
    Wake();
    return std::unique_ptr<WriteHandle>(new NcclWriteHandle(op));
  }

  void Shutdown() {
    if (shut_down_.exchange(true)) return;
    stop_.store(true);
    Wake();
    if (thread_.joinable()) thread_.join();
    // Thread never started (Connect failed half way): nothing posted, just free.
    AbortComm();
    FailAll(Canceled("nccl: endpoint destroyed before the write was complete"));
    bool idle = true;
    if (comm_stream) idle &= cuda::WaitStreamIdle(comm_stream->get(), DeadlineAfterMs(2000)).ok();
    if (pack_stream) idle &= cuda::WaitStreamIdle(pack_stream->get(), DeadlineAfterMs(2000)).ok();
    if (idle) {
      shared->ReleaseStaging(&staging);
    } else {
      // Freeing memory a stuck kernel may still touch would block (cudaFree syncs): leak it.
      KV_LOG_ERROR << "nccl: endpoint streams still busy after abort; leaking the staging buffer";
      (void)staging.buffer.release();
    }
  }

 private:
  void Wake() {
    uint64_t one = 1;
    if (wake_fd >= 0) (void)!::write(wake_fd, &one, sizeof(one));
  }

  void SetStatus(const Status& s) {
    std::lock_guard<std::mutex> lock(status_mu_);
    if (status_.ok()) status_ = s;
  }

  void AbortComm() {
    if (comm != nullptr) {
      (void)ncclCommAbort(comm);
      comm = nullptr;
    }
  }

  void ReleaseOpEvents(Op& op) {
    if (op.dep) shared->events.Release(op.dep);
    if (op.sent) shared->events.Release(op.sent);
    op.dep = op.sent = nullptr;
  }

  // Finishes every queued and in-flight write with `why` (after the communicator is gone).
  void FailAll(const Status& why) {
    std::deque<std::shared_ptr<Op>> queued;
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

  // The peer or NCCL failed: abort, fail everything, refuse later writes.
  void Fail(const Status& why) {
    SetStatus(why);
    KV_LOG_WARN << "nccl: endpoint failed: " << why.ToString();
    AbortComm();
    FailAll(status());
  }

  Status PollSocket() {
    // Acks that arrived just before the receiver closed still count: take every complete frame
    // first, then report the close.
    const bool open = ReadAvailable(fd, &rx_);
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
        if (TraceEnabled()) op->t_acked = Clock::now();
      }
      if (!found) return DataLoss("nccl: ack for unknown write " + std::to_string(ack.write_id));
    }
  }

  Status Group(const std::function<Status()>& calls, const char* what) {
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return NcclStatus(r, comm, "ncclGroupStart");
    Status s = calls();
    r = ncclGroupEnd();
    if (TraceEnabled()) group_end_ = Clock::now();
    KV_RETURN_IF_ERROR(s);
    if (r != ncclSuccess && r != ncclInProgress) return NcclStatus(r, comm, what);
    return WaitComm(comm, DeadlineAfterMs(shared->options.connect_timeout_ms),
                    [this] { return PollSocket(); }, what, shared->options.tight_polling);
  }

  Status Submit(Op& op) {
    const bool trace = TraceEnabled();
    if (trace) op.t_taken = Clock::now();
    if (!SendAll(fd, EncodeWrite(op.header))) {
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

  static void TraceDone(const Op& op) {
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

  void Run() {
    DeviceGuard guard(shared->device);
    if (shared->options.tight_polling) TightenTimerSlack();
    const long inflight_poll_ns = shared->options.tight_polling ? 10'000L : 20'000L;
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
      timespec ts{0, inflight_.empty() ? 20'000'000L : inflight_poll_ns};
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
      std::deque<std::shared_ptr<Op>> fresh;
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
        Op& op = *inflight_.front();
        if (!op.acked) break;
        cudaError_t err = cudaEventQuery(op.sent);
        if (err == cudaErrorNotReady) break;
        op.Finish(CudaStatus(err, "nccl send"));
        if (TraceEnabled()) TraceDone(op);
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

  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> shut_down_{false};
  mutable std::mutex status_mu_;
  Status status_;
  std::mutex q_mu_;
  std::deque<std::shared_ptr<Op>> queue_;
  uint64_t next_write_id_ = 1;
  // Worker thread only:
  std::deque<std::shared_ptr<Op>> inflight_;
  std::string rx_;
  ChunkPlan plan_;
  std::vector<CopyRun> runs_;
  cuda::PackedTable table_;
  Clock::time_point group_end_;  // trace: when the last ncclGroupEnd returned
};

class NcclEndpoint : public Endpoint {
 public:
  explicit NcclEndpoint(std::unique_ptr<Writer> w) : w_(std::move(w)) {}
  ~NcclEndpoint() override { w_->Shutdown(); }
  Result<std::unique_ptr<WriteHandle>> Write(const WriteRequest& request) override {
    return w_->Write(request);
  }
  Status status() const override { return w_->status(); }

 private:
  std::unique_ptr<Writer> w_;
};

// ---- receiver side ------------------------------------------------------------------------

struct Incoming {
  WriteHeader header;
  cudaEvent_t done = nullptr;
  Clock::time_point t_header, t_posted, t_landed;  // trace
};

// One accepted writer: handshake, communicator (rank 1), then posts receives for each write
// header and acks writes in order once their bytes are in the pool.
class Receiver {
 public:
  Receiver(std::shared_ptr<Shared> shared, int fd) : shared_(std::move(shared)), fd_(fd) {
    wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    thread_ = std::thread([this] { Run(); });
  }
  ~Receiver() {
    stop_.store(true);
    uint64_t one = 1;
    if (wake_fd_ >= 0) (void)!::write(wake_fd_, &one, sizeof(one));
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) ::close(fd_);
    if (wake_fd_ >= 0) ::close(wake_fd_);
  }
  bool finished() const { return finished_.load(); }

 private:
  Status Alive() {
    if (stop_.load()) return Canceled("nccl: transport shutting down");
    char c;
    ssize_t r = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (r == 0) return RemoteDisconnect("nccl: the writer closed the control socket");
    return OkStatus();
  }

  Status Handshake() {
    KV_ASSIGN_OR_RETURN(std::string payload,
                        ReadFrame(fd_, &rx_, FrameType::kHello, DeadlineAfterMs(10000), "hello"));
    HelloAck ack;
    auto refuse = [&](const Status& s) {
      ack.code = static_cast<int32_t>(s.code());
      std::strncpy(ack.message, s.message().c_str(), sizeof(ack.message) - 1);
      (void)SendAll(fd_, EncodeHelloAck(ack));
      return s;
    };
    // A hello of another size (another protocol version's writer) is told why, not just dropped.
    auto decoded = DecodeHello(payload);
    if (!decoded.ok()) return refuse(decoded.status());
    const Hello hello = decoded.value();
    if (hello.version != kProtocolVersion) {
      return refuse(FailedPrecondition("nccl: writer speaks protocol " + std::to_string(hello.version) +
                                       ", this receiver " + std::to_string(kProtocolVersion)));
    }
    if (shared_->host_id == hello.host_id && shared_->pci_bus_id == hello.pci_bus_id) {
      return refuse(FailedPrecondition(
          "nccl: writer and receiver are on the same GPU (" + shared_->pci_bus_id +
          "); NCCL needs its two ranks on different GPUs (use cuda_ipc on one GPU)"));
    }
    std::string id;
    {
      std::lock_guard<std::mutex> lock(shared_->id_mu);
      if (!shared_->advertised_used &&
          std::memcmp(hello.unique_id, shared_->advertised_id.data(), kUniqueIdBytes) == 0) {
        shared_->advertised_used = true;
        id = shared_->advertised_id;
      }
    }
    if (id.empty()) {
      ncclUniqueId fresh;
      ncclResult_t r = ncclGetUniqueId(&fresh);
      if (r != ncclSuccess) return refuse(NcclStatus(r, nullptr, "ncclGetUniqueId"));
      id.assign(reinterpret_cast<const char*>(&fresh), sizeof(fresh));
    }
    const uint64_t chunk = hello.chunk_bytes == 0
                               ? shared_->options.chunk_bytes
                               : std::min<uint64_t>(hello.chunk_bytes, shared_->options.chunk_bytes);
    {
      DeviceGuard guard(shared_->device);
      Status s = shared_->InitStaging(&staging_, chunk);
      if (s.ok()) {
        auto cs = cuda::Stream::CreateLowestPriority(shared_->device);
        auto us = cuda::Stream::CreateLowestPriority(shared_->device);
        if (cs.ok() && us.ok()) {
          comm_stream_ = std::move(cs).value();
          unpack_stream_ = std::move(us).value();
        } else {
          s = !cs.ok() ? cs.status() : us.status();
        }
      }
      if (!s.ok()) return refuse(s.WithContext("nccl receiver setup"));
    }
    ack.chunk_bytes = chunk;
    std::memcpy(ack.unique_id, id.data(), kUniqueIdBytes);
    if (!SendAll(fd_, EncodeHelloAck(ack))) return RemoteDisconnect("nccl: sending the hello ack");
    const Deadline deadline = DeadlineAfterMs(shared_->options.connect_timeout_ms);
    KV_ASSIGN_OR_RETURN(comm_, InitComm(shared_->device, id, 1, deadline, [this] { return Alive(); }));
    if (hello.warm_up != 0) {
      // On failure Run() aborts the communicator and frees the staging buffer and streams.
      Status s = WarmUp(comm_, 1, staging_.slot(0), comm_stream_->get(), deadline,
                        [this] { return Alive(); });
      if (!s.ok()) return s.WithContext("nccl receiver: warm-up exchange with the writer");
    }
    return OkStatus();
  }

  Status Group(const std::function<Status()>& calls, const char* what) {
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return NcclStatus(r, comm_, "ncclGroupStart");
    Status s = calls();
    r = ncclGroupEnd();
    KV_RETURN_IF_ERROR(s);
    if (r != ncclSuccess && r != ncclInProgress) return NcclStatus(r, comm_, what);
    return WaitComm(comm_, DeadlineAfterMs(shared_->options.connect_timeout_ms),
                    [this] { return Alive(); }, what, shared_->options.tight_polling);
  }

  // Posts the receives (and unpacks) of one write.
  Status Post(Incoming& in) {
    const WriteHeader& h = in.header;
    MemoryRegion region;
    {
      std::lock_guard<std::mutex> lock(shared_->reg_mu);
      auto it = shared_->regs.find(h.registration_id);
      if (it == shared_->regs.end()) {
        return FailedPrecondition("nccl: write " + std::to_string(h.write_id) +
                                  " targets registration " + std::to_string(h.registration_id) +
                                  ", which does not exist (any more)");
      }
      region = it->second;
    }
    for (const WireRun& r : h.runs) {
      if (r.remote_offset > region.length || r.length > region.length - r.remote_offset) {
        return InvalidArgument("nccl: write " + std::to_string(h.write_id) +
                               " has a run outside the registration");
      }
    }
    const uint64_t base = reinterpret_cast<uint64_t>(region.addr);
    const cudaStream_t cs = comm_stream_->get();
    const cudaStream_t us = unpack_stream_->get();
    KV_ASSIGN_OR_RETURN(in.done, shared_->events.Acquire());
    if (h.mode == WireMode::kDirect) {
      // Earlier packed writes must have landed before these bytes may (same destination).
      for (int i = 0; i < 2; ++i) {
        KV_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(cs, staging_.freed[i], 0), "nccl: order");
      }
      for (size_t first = 0; first < h.runs.size(); first += kGroupOps) {
        const size_t end = std::min(h.runs.size(), first + kGroupOps);
        KV_RETURN_IF_ERROR(Group([&]() -> Status {
          for (size_t i = first; i < end; ++i) {
            ncclResult_t r = ncclRecv(reinterpret_cast<void*>(base + h.runs[i].remote_offset),
                                      h.runs[i].length, ncclUint8, 0, comm_, cs);
            if (r != ncclSuccess && r != ncclInProgress) return NcclStatus(r, comm_, "ncclRecv");
          }
          return OkStatus();
        }, "direct receives"));
      }
      KV_CUDA_RETURN_IF_ERROR(cudaEventRecord(in.done, cs), "nccl: record landed");
      return OkStatus();
    }
    PlanChunks(h.runs, staging_.chunk_bytes, &plan_);
    for (const Chunk& chunk : plan_.chunks) {
      const int slot = static_cast<int>(staging_.next++ & 1);
      KV_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(cs, staging_.freed[slot], 0), "nccl: wait slot");
      KV_RETURN_IF_ERROR(Group([&]() -> Status {
        return NcclStatus(ncclRecv(staging_.slot(slot), chunk.bytes, ncclUint8, 0, comm_, cs), comm_,
                          "ncclRecv");
      }, "chunk receive"));
      KV_CUDA_RETURN_IF_ERROR(cudaEventRecord(staging_.filled[slot], cs), "nccl: record received");
      KV_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(us, staging_.filled[slot], 0), "nccl: wait received");
      runs_.clear();
      for (size_t p = chunk.first_piece; p < chunk.first_piece + chunk.pieces; ++p) {
        const Piece& pc = plan_.pieces[p];
        runs_.push_back({reinterpret_cast<uint64_t>(staging_.slot(slot)) + pc.chunk_offset,
                         base + h.runs[pc.run].remote_offset + pc.run_offset, pc.length});
      }
      KV_RETURN_IF_ERROR(CopyPieces(runs_, &table_, shared_->kernel, us));
      KV_CUDA_RETURN_IF_ERROR(cudaEventRecord(staging_.freed[slot], us), "nccl: record unpacked");
    }
    KV_CUDA_RETURN_IF_ERROR(cudaEventRecord(in.done, us), "nccl: record landed");
    return OkStatus();
  }

  Status Loop() {
    const long pending_poll_ns = shared_->options.tight_polling ? 5'000L : 20'000L;
    std::deque<Incoming> pending;
    auto last_async_check = Clock::now();
    Status result;
    while (result.ok()) {
      if (stop_.load()) return Canceled("nccl: transport shutting down");
      pollfd p[2] = {{wake_fd_, POLLIN, 0}, {fd_, POLLIN, 0}};
      // Landing is seen by polling the oldest write's event: every 5 us while any is pending
      // (what a write waits for on top of its bytes; the thread is mostly asleep in between).
      timespec ts{0, pending.empty() ? 20'000'000L : pending_poll_ns};
      (void)::ppoll(p, 2, &ts, nullptr);
      const bool open = ReadAvailable(fd_, &rx_);
      for (;;) {
        FrameType type;
        std::string payload;
        auto got = TakeFrame(&rx_, &type, &payload);
        if (!got.ok()) return got.status();
        if (!got.value()) break;
        if (type != FrameType::kWrite) return DataLoss("nccl: unexpected frame from the writer");
        KV_ASSIGN_OR_RETURN(WriteHeader h, DecodeWrite(payload));
        pending.push_back(Incoming{std::move(h), nullptr, {}, {}, {}});
        if (TraceEnabled()) pending.back().t_header = Clock::now();
        Status s = Post(pending.back());
        if (!s.ok()) return s;
        if (TraceEnabled()) pending.back().t_posted = Clock::now();
      }
      while (!pending.empty()) {
        Incoming& in = pending.front();
        cudaError_t err = cudaEventQuery(in.done);
        if (err == cudaErrorNotReady) break;
        if (err != cudaSuccess) return CudaStatus(err, "nccl receive");
        if (TraceEnabled()) in.t_landed = Clock::now();
        if (in.header.notify) {
          std::lock_guard<std::mutex> lock(shared_->sink_mu);
          if (shared_->sink) shared_->sink(in.header.notification);
        }
        if (!SendAll(fd_, EncodeAck(Ack{in.header.write_id, 0}))) {
          return RemoteDisconnect("nccl: sending an ack");
        }
        if (TraceEnabled()) {
          std::fprintf(stderr,
                       "nccl trace receiver: write %llu, %llu bytes: posted %.1f landed %.1f "
                       "acked %.1f us after its header\n",
                       (unsigned long long)in.header.write_id,
                       (unsigned long long)in.header.total_bytes,
                       MicrosSince(in.t_header, in.t_posted), MicrosSince(in.t_header, in.t_landed),
                       MicrosSince(in.t_header, Clock::now()));
        }
        shared_->events.Release(in.done);
        pending.pop_front();
      }
      if (!open) return RemoteDisconnect("nccl: the writer closed the control socket");
      if (!pending.empty() && Clock::now() - last_async_check > std::chrono::milliseconds(1)) {
        last_async_check = Clock::now();
        ncclResult_t st = ncclSuccess;
        if (ncclCommGetAsyncError(comm_, &st) == ncclSuccess && st != ncclSuccess &&
            st != ncclInProgress) {
          return CommFailed(st, comm_, "asynchronous error");
        }
      }
    }
    return result;
  }

  void Run() {
    DeviceGuard guard(shared_->device);
    if (shared_->options.tight_polling) TightenTimerSlack();
    Status s = Handshake();
    if (s.ok()) s = Loop();
    if (s.code() != StatusCode::kRemoteDisconnect && s.code() != StatusCode::kCanceled) {
      KV_LOG_WARN << "nccl receiver: connection ends: " << s.ToString();
    }
    // Closing the socket first tells the writer at once; the abort stops receives still posted.
    ::shutdown(fd_, SHUT_RDWR);
    if (comm_ != nullptr) (void)ncclCommAbort(comm_);
    comm_ = nullptr;
    bool idle = true;
    if (comm_stream_) idle &= cuda::WaitStreamIdle(comm_stream_->get(), DeadlineAfterMs(2000)).ok();
    if (unpack_stream_) idle &= cuda::WaitStreamIdle(unpack_stream_->get(), DeadlineAfterMs(2000)).ok();
    if (idle) {
      shared_->ReleaseStaging(&staging_);
    } else {
      KV_LOG_ERROR << "nccl receiver: streams still busy after abort; leaking the staging buffer";
      (void)staging_.buffer.release();
    }
    finished_.store(true);
  }

  std::shared_ptr<Shared> shared_;
  int fd_ = -1;
  int wake_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<bool> finished_{false};
  ncclComm_t comm_ = nullptr;
  std::unique_ptr<cuda::Stream> comm_stream_, unpack_stream_;
  Staging staging_;
  std::string rx_;
  ChunkPlan plan_;
  std::vector<CopyRun> runs_;
  cuda::PackedTable table_;
  std::thread thread_;  // last
};

// ---- transport ----------------------------------------------------------------------------

class NcclTransport : public Transport {
 public:
  explicit NcclTransport(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}
  ~NcclTransport() override {
    if (accept_thread_.joinable()) {
      uint64_t one = 1;
      (void)!::write(wake_fd_, &one, sizeof(one));
      accept_thread_.join();
    }
    receivers_.clear();
    if (listen_fd_ >= 0) ::close(listen_fd_);
    if (wake_fd_ >= 0) ::close(wake_fd_);
  }

  Status Init() {
    const bool loopback = shared_->options.advertise_host == "127.0.0.1" ||
                          shared_->options.advertise_host == "localhost";
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (listen_fd_ < 0) return Errno("socket");
    int one = 1;
    (void)::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(loopback ? INADDR_LOOPBACK : INADDR_ANY);
    sa.sin_port = 0;
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) return Errno("bind");
    if (::listen(listen_fd_, 16) != 0) return Errno("listen");
    socklen_t len = sizeof(sa);
    if (::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
      return Errno("getsockname");
    }
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return NcclStatus(r, nullptr, "ncclGetUniqueId");
    shared_->advertised_id.assign(reinterpret_cast<const char*>(&id), sizeof(id));
    Address a;
    a.host = shared_->options.advertise_host;
    a.port = ntohs(sa.sin_port);
    a.unique_id = shared_->advertised_id;
    address_ = EncodeAddress(a);
    wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake_fd_ < 0) return Errno("eventfd");
    accept_thread_ = std::thread([this] { AcceptLoop(); });
    return OkStatus();
  }

  std::string name() const override { return "nccl"; }
  Capabilities capabilities() const override {
    Capabilities c;
    c.host_memory = false;
    c.cuda_memory = true;
    c.remote = true;
    c.notifications = true;
    return c;
  }
  std::string LocalAddress() const override { return address_; }

  Result<std::unique_ptr<Registration>> Register(const MemoryRegion& region) override {
    if (region.kind != MemoryKind::kCuda) {
      return NotSupported("nccl registers only CUDA device memory (kCuda), not host memory");
    }
    if (region.addr == nullptr || region.length == 0) {
      return InvalidArgument("nccl Register: null address or zero length");
    }
    KV_ASSIGN_OR_RETURN(cuda::DevicePointerInfo info,
                        cuda::QueryDevicePointer(region.addr, region.length));
    if (info.device != shared_->device || (region.device >= 0 && region.device != info.device)) {
      return InvalidArgument("nccl Register: the memory is on device " + std::to_string(info.device) +
                             ", this transport moves device " + std::to_string(shared_->device));
    }
    MemoryRegion r = region;
    r.device = info.device;
    Key k;
    k.length = region.length;
    k.device = info.device;
    std::strncpy(k.pci_bus_id, shared_->pci_bus_id.c_str(), sizeof(k.pci_bus_id) - 1);
    std::strncpy(k.host_id, shared_->host_id.c_str(), sizeof(k.host_id) - 1);
    {
      std::lock_guard<std::mutex> lock(shared_->reg_mu);
      k.registration_id = shared_->next_reg_id++;
      shared_->regs[k.registration_id] = r;
    }
    return std::unique_ptr<Registration>(
        new NcclRegistration(shared_, k.registration_id, r, EncodeKey(k)));
  }

  Result<std::unique_ptr<Endpoint>> Connect(const PeerDescriptor& peer) override {
    KV_ASSIGN_OR_RETURN(Address addr, DecodeAddress(peer.address));
    auto w = std::make_unique<Writer>();
    w->shared = shared_;
    w->mode = shared_->options.copy_mode;
    for (size_t i = 0; i < peer.regions.size(); ++i) {
      auto key = DecodeKey(peer.regions[i].key);
      if (!key.ok()) return key.status().WithContext("region " + std::to_string(i));
      if (peer.regions[i].length > key->length) {
        return InvalidArgument("nccl: region " + std::to_string(i) + " claims " +
                               std::to_string(peer.regions[i].length) + " bytes, its key " +
                               std::to_string(key->length));
      }
      if (shared_->host_id == key->host_id && shared_->pci_bus_id == key->pci_bus_id) {
        return FailedPrecondition("nccl: the peer's region " + std::to_string(i) +
                                  " is on this transport's own GPU (" + shared_->pci_bus_id +
                                  "); NCCL needs its two ranks on different GPUs (use cuda_ipc "
                                  "on one GPU)");
      }
      w->targets.push_back({key->registration_id, peer.regions[i].length});
    }
    const Deadline deadline = DeadlineAfterMs(shared_->options.connect_timeout_ms);
    KV_ASSIGN_OR_RETURN(w->fd, ConnectTcp(addr.host, addr.port, deadline));
    Hello hello;
    hello.device = shared_->device;
    hello.chunk_bytes = shared_->options.chunk_bytes;
    std::strncpy(hello.pci_bus_id, shared_->pci_bus_id.c_str(), sizeof(hello.pci_bus_id) - 1);
    std::strncpy(hello.host_id, shared_->host_id.c_str(), sizeof(hello.host_id) - 1);
    std::memcpy(hello.unique_id, addr.unique_id.data(), kUniqueIdBytes);
    hello.warm_up = shared_->options.warm_up ? 1 : 0;
    if (!SendAll(w->fd, EncodeHello(hello))) return RemoteDisconnect("nccl: sending hello");
    std::string rx;
    KV_ASSIGN_OR_RETURN(std::string payload,
                        ReadFrame(w->fd, &rx, FrameType::kHelloAck, deadline, "hello ack"));
    KV_ASSIGN_OR_RETURN(HelloAck ack, DecodeHelloAck(payload));
    if (ack.code != 0) {
      return Status(static_cast<StatusCode>(ack.code),
                    std::string("nccl: the receiver refused the connection: ") + ack.message);
    }
    if (ack.chunk_bytes == 0 || ack.chunk_bytes > shared_->options.chunk_bytes) {
      return DataLoss("nccl: the receiver agreed on a bad chunk size");
    }
    {
      DeviceGuard guard(shared_->device);
      KV_RETURN_IF_ERROR(guard.status());
      KV_RETURN_IF_ERROR(shared_->InitStaging(&w->staging, ack.chunk_bytes));
      KV_ASSIGN_OR_RETURN(w->comm_stream, cuda::Stream::CreateLowestPriority(shared_->device));
      KV_ASSIGN_OR_RETURN(w->pack_stream, cuda::Stream::CreateLowestPriority(shared_->device));
    }
    const int fd = w->fd;
    auto receiver_alive = [fd]() -> Status {
      char c;
      if (::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0) {
        return RemoteDisconnect("nccl: the receiver closed the control socket while connecting");
      }
      return OkStatus();
    };
    KV_ASSIGN_OR_RETURN(w->comm, InitComm(shared_->device, std::string(ack.unique_id, kUniqueIdBytes),
                                          0, deadline, receiver_alive));
    if (shared_->options.warm_up) {
      // On failure ~Writer aborts the communicator and frees the staging buffer and streams.
      DeviceGuard guard(shared_->device);
      KV_RETURN_IF_ERROR(guard.status());
      Status s = WarmUp(w->comm, 0, w->staging.slot(0), w->comm_stream->get(), deadline,
                        receiver_alive);
      if (!s.ok()) return s.WithContext("nccl: warm-up exchange with the receiver");
    }
    w->wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (w->wake_fd < 0) return Errno("eventfd");
    w->Start();
    return std::unique_ptr<Endpoint>(new NcclEndpoint(std::move(w)));
  }

  void SetNotificationSink(NotificationSink sink) override {
    std::lock_guard<std::mutex> lock(shared_->sink_mu);
    shared_->sink = std::move(sink);
  }

 private:
  void AcceptLoop() {
    for (;;) {
      pollfd p[2] = {{wake_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
      int rc = ::poll(p, 2, 200);
      if (rc < 0 && errno != EINTR) {
        KV_LOG_ERROR << "nccl accept poll: " << std::strerror(errno);
        return;
      }
      if (p[0].revents) return;
      receivers_.remove_if([](const std::unique_ptr<Receiver>& r) { return r->finished(); });
      if (!(p[1].revents & POLLIN)) continue;
      for (;;) {
        int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) break;
        SetSocketOptions(fd);
        receivers_.push_back(std::make_unique<Receiver>(shared_, fd));
      }
    }
  }

  std::shared_ptr<Shared> shared_;
  std::string address_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  std::list<std::unique_ptr<Receiver>> receivers_;  // accept thread only (and the destructor)
  std::thread accept_thread_;
};

}  // namespace

CopyMode CopyModeFromEnv() {
  const char* v = std::getenv("KVSTREAM_NCCL_COPY");
  if (v == nullptr) return CopyMode::kAuto;
  std::string s(v);
  if (s == "direct") return CopyMode::kDirect;
  if (s == "pack") return CopyMode::kPack;
  return CopyMode::kAuto;
}

std::string NcclVersionString() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "NCCL (version unknown)";
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
  return "NCCL " + std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." +
         std::to_string(v % 100);
}

Result<std::unique_ptr<Transport>> CreateNcclTransport(const NcclOptions& options) {
  // Point-to-point only: NVLink SHARP (multicast objects made at communicator init) buys
  // nothing here, and on shared hosts it can take GPUs out of service. Off unless the
  // environment says otherwise (read by NCCL at its first init).
  (void)::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  KV_ASSIGN_OR_RETURN(int device, cuda::ResolveDevice(options.device, "nccl"));
  if (options.chunk_bytes < (1u << 20) || options.chunk_bytes % 16 != 0) {
    return InvalidArgument("nccl: chunk_bytes must be a multiple of 16, at least 1 MiB");
  }
  // Pack/unpack kernels loaded now, not at a first Write() behind running compute.
  KV_RETURN_IF_ERROR(cuda::PrepareDevice(device));
  auto shared = std::make_shared<Shared>(device);
  shared->options = options;
  shared->options.device = device;
  KV_ASSIGN_OR_RETURN(shared->pci_bus_id, cuda::PciBusId(device));
  shared->host_id = cuda::HostIdentity();
  auto t = std::make_unique<NcclTransport>(shared);
  KV_RETURN_IF_ERROR(t->Init());
  return std::unique_ptr<Transport>(std::move(t));
}

Result<std::unique_ptr<Transport>> CreateNcclTransport(const TransportOptions& options) {
  NcclOptions o;
  o.device = options.device;
  o.copy_mode = CopyModeFromEnv();
  if (const char* h = std::getenv("KVSTREAM_NCCL_HOST"); h != nullptr && *h) o.advertise_host = h;
  if (const char* t = std::getenv("KVSTREAM_NCCL_TIGHT_POLL"); t != nullptr && *t) {
    o.tight_polling = std::string(t) != "0";
  }
  if (const char* w = std::getenv("KVSTREAM_NCCL_WARMUP"); w != nullptr && *w) {
    o.warm_up = std::string(w) != "0";
  }
  if (const char* c = std::getenv("KVSTREAM_NCCL_CHUNK_MB"); c != nullptr && *c) {
    o.chunk_bytes = std::strtoull(c, nullptr, 10) << 20;
  }
  return CreateNcclTransport(o);
}

}  // namespace kvstream::transport::nccl
