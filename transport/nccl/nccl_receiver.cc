#include "transport/nccl/nccl_receiver.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>

#include "common/log.h"

namespace kvstream::transport::nccl {

using cuda::CudaStatus;
using cuda::DeviceGuard;

NcclReceiver::NcclReceiver(std::shared_ptr<NcclTransportState> shared, int fd)
    : shared_(std::move(shared)), fd_(fd) {
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  thread_ = std::thread([this] { Run(); });
}

NcclReceiver::~NcclReceiver() {
  stop_.store(true);
  uint64_t one = 1;
  if (wake_fd_ >= 0) (void)!::write(wake_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) ::close(fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

Status NcclReceiver::Alive() {
  if (stop_.load()) return Canceled("nccl: transport shutting down");
  char c;
  ssize_t r = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (r == 0) return RemoteDisconnect("nccl: the writer closed the control socket");
  return OkStatus();
}

Status NcclReceiver::Handshake() {
  KV_ASSIGN_OR_RETURN(std::string payload,
                      ReadFrame(fd_, &rx_, FrameType::kHello, DeadlineAfterMs(10000), "hello"));
  HelloAck ack;
  auto refuse = [&](const Status& s) {
    ack.code = static_cast<int32_t>(s.code());
    std::strncpy(ack.message, s.message().c_str(), sizeof(ack.message) - 1);
    (void)core::SendAll(fd_, EncodeHelloAck(ack));
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
  // Only a writer that presents an admission id of this receiver's address, which travels only
  // inside the authenticated handshake, gets a communicator; the id is used up by this hello.
  if (!shared_->ConsumeAdmissionId(hello.unique_id)) {
    const uint64_t n = ++shared_->hellos_refused;
    if (n <= 10 || (n & (n - 1)) == 0) {
      KV_LOG_WARN << "nccl receiver: refused a writer that does not present an unused admission id "
                  << "of this receiver (" << n << " refused so far)";
    }
    return refuse(FailedPrecondition(
        "nccl: the hello does not present an unused admission id of this receiver (each "
        "comes from one authenticated handshake and admits one connection)"));
  }
  if (shared_->host_id == hello.host_id && shared_->pci_bus_id == hello.pci_bus_id) {
    return refuse(FailedPrecondition(
        "nccl: writer and receiver are on the same GPU (" + shared_->pci_bus_id +
        "); NCCL needs its two ranks on different GPUs (use cuda_ipc on one GPU)"));
  }
  // The communicator's bootstrap id is made now, for this connection alone, and travels only in
  // the hello ack on this admitted connection.
  std::string id;
  {
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
  if (!core::SendAll(fd_, EncodeHelloAck(ack))) return RemoteDisconnect("nccl: sending the hello ack");
  const Deadline deadline = DeadlineAfterMs(shared_->options.connect_timeout_ms);
  KV_ASSIGN_OR_RETURN(comm_, InitComm(shared_->device, id, 1, deadline, [this] { return Alive(); }));
  if (hello.warm_up != 0) {
    // On failure Run() aborts the communicator and frees the staging buffer and streams.
    Status s = WarmUp(comm_, 1, staging_.slot(0), comm_stream_->get(), deadline,
                      [this] { return Alive(); });
    if (!s.ok()) return s.WithContext("nccl receiver: warm-up exchange with the writer");
  }
  ++shared_->hellos_admitted;
  return OkStatus();
}

Status NcclReceiver::Group(const std::function<Status()>& calls, const char* what) {
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return NcclStatus(r, comm_, "ncclGroupStart");
  Status s = calls();
  r = ncclGroupEnd();
  KV_RETURN_IF_ERROR(s);
  if (r != ncclSuccess && r != ncclInProgress) return NcclStatus(r, comm_, what);
  return WaitComm(comm_, DeadlineAfterMs(shared_->options.connect_timeout_ms),
                  [this] { return Alive(); }, what);
}

Status NcclReceiver::Post(NcclIncomingWrite& in) {
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

Status NcclReceiver::Loop() {
  constexpr long kPendingPollNs = 5'000L;
  const bool trace = shared_->options.trace;
  std::deque<NcclIncomingWrite> pending;
  auto last_async_check = Clock::now();
  Status result;
  while (result.ok()) {
    if (stop_.load()) return Canceled("nccl: transport shutting down");
    pollfd p[2] = {{wake_fd_, POLLIN, 0}, {fd_, POLLIN, 0}};
    // Landing is seen by polling the oldest write's event: every 5 us while any is pending
    // (what a write waits for on top of its bytes; the thread is mostly asleep in between).
    timespec ts{0, pending.empty() ? 20'000'000L : kPendingPollNs};
    (void)::ppoll(p, 2, &ts, nullptr);
    const bool open = core::ReadAvailable(fd_, &rx_);
    for (;;) {
      FrameType type;
      std::string payload;
      auto got = TakeFrame(&rx_, &type, &payload);
      if (!got.ok()) return got.status();
      if (!got.value()) break;
      if (type != FrameType::kWrite) return DataLoss("nccl: unexpected frame from the writer");
      KV_ASSIGN_OR_RETURN(WriteHeader h, DecodeWrite(payload));
      pending.push_back(NcclIncomingWrite{std::move(h), nullptr, {}, {}, {}});
      if (trace) pending.back().t_header = Clock::now();
      Status s = Post(pending.back());
      if (!s.ok()) return s;
      if (trace) pending.back().t_posted = Clock::now();
    }
    while (!pending.empty()) {
      NcclIncomingWrite& in = pending.front();
      cudaError_t err = cudaEventQuery(in.done);
      if (err == cudaErrorNotReady) break;
      if (err != cudaSuccess) return CudaStatus(err, "nccl receive");
      if (trace) in.t_landed = Clock::now();
      if (in.header.notify) {
        std::lock_guard<std::mutex> lock(shared_->sink_mu);
        if (shared_->sink) shared_->sink(in.header.notification);
      }
      if (!core::SendAll(fd_, EncodeAck(Ack{in.header.write_id, 0}))) {
        return RemoteDisconnect("nccl: sending an ack");
      }
      if (trace) {
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

void NcclReceiver::Run() {
  DeviceGuard guard(shared_->device);
  TightenTimerSlack();
  Status s = Handshake();
  if (s.ok()) s = Loop();
  if (s.code() != StatusCode::kRemoteDisconnect && s.code() != StatusCode::kCanceled) {
    KV_LOG_WARN << "nccl receiver: connection ends: " << s.ToString();
  }
  // Closing the socket first tells the writer at once; the abort stops receives still posted.
  ::shutdown(fd_, SHUT_RDWR);
  if (comm_ != nullptr) (void)ncclCommAbort(comm_);
  comm_ = nullptr;
  shared_->ReleaseStagingWhenIdle(&staging_, comm_stream_.get(), unpack_stream_.get(),
                                  "nccl receiver");
  finished_.store(true);
}

}  // namespace kvstream::transport::nccl
