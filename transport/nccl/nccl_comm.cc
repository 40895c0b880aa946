#include "transport/nccl/nccl_comm.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "common/log.h"
#include "transport/nccl/nccl_wire.h"

namespace kvstream::transport::nccl {

using cuda::CopyRun;
using cuda::CudaStatus;
using cuda::DeviceGuard;

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
                const std::string& what, bool tight) {
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
constexpr size_t kWarmUpBytes = 16;  // WarmUp's buffer (nccl_comm.h says at least 16)

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

Result<std::string> NcclTransportState::IssueAdmissionId() {
  std::string id(kUniqueIdBytes, '\0');
  size_t got = 0;
  while (got < id.size()) {
    const ssize_t r = ::getrandom(id.data() + got, id.size() - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      return Internal(std::string("nccl: getrandom for an admission id: ") + std::strerror(errno));
    }
    got += static_cast<size_t>(r);
  }
  std::lock_guard<std::mutex> lock(id_mu);
  const auto now = Clock::now();
  while (!admission_ids.empty() &&
         (admission_ids.size() >= kMaxAdmissionIds ||
          now - admission_ids.front().second > std::chrono::milliseconds(kAdmissionIdTtlMs))) {
    admission_ids.pop_front();
  }
  admission_ids.emplace_back(id, now);
  return id;
}

bool NcclTransportState::ConsumeAdmissionId(const char* presented) {
  std::lock_guard<std::mutex> lock(id_mu);
  const auto now = Clock::now();
  for (auto it = admission_ids.begin(); it != admission_ids.end(); ++it) {
    unsigned char diff = 0;  // constant time per candidate
    for (size_t i = 0; i < kUniqueIdBytes; ++i) {
      diff |= static_cast<unsigned char>(presented[i] ^ it->first[i]);
    }
    if (diff != 0) continue;
    const bool fresh = now - it->second <= std::chrono::milliseconds(kAdmissionIdTtlMs);
    admission_ids.erase(it);  // used up, whether or not it was still fresh
    return fresh;
  }
  return false;
}

Status NcclTransportState::InitStaging(Staging* st, uint64_t chunk_bytes) {
  st->chunk_bytes = chunk_bytes;
  KV_ASSIGN_OR_RETURN(st->buffer, cuda::DeviceBuffer::Allocate(device, 2 * chunk_bytes));
  for (int i = 0; i < 2; ++i) {
    KV_ASSIGN_OR_RETURN(st->filled[i], events.Acquire());
    KV_ASSIGN_OR_RETURN(st->freed[i], events.Acquire());
  }
  return OkStatus();
}
void NcclTransportState::ReleaseStaging(Staging* st) {
  for (int i = 0; i < 2; ++i) {
    if (st->filled[i]) events.Release(st->filled[i]);
    if (st->freed[i]) events.Release(st->freed[i]);
    st->filled[i] = st->freed[i] = nullptr;
  }
  st->buffer.reset();
}

void NcclTransportState::ReleaseStagingWhenIdle(Staging* st, const cuda::Stream* a,
                                                const cuda::Stream* b, const char* side) {
  bool idle = true;
  for (const cuda::Stream* s : {a, b}) {
    if (s != nullptr) idle &= cuda::WaitStreamIdle(s->get(), DeadlineAfterMs(2000)).ok();
  }
  if (idle) {
    ReleaseStaging(st);
    return;
  }
  KV_LOG_ERROR << side << ": streams still busy after abort; leaking the staging buffer";
  (void)st->buffer.release();
}

}  // namespace kvstream::transport::nccl
