// What both sides of an nccl connection share (internal to transport/nccl/): the transport's
// state, NCCL error mapping, the two-rank communicator (init, polled waits, warm-up), the
// control-socket helpers, the staging buffers and the pack / unpack copy. nccl_transport.h says
// what the backend guarantees; nccl_wire.h what travels on the control socket.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/time.h"
#include "transport/cuda/copy_plan.h"
#include "transport/core/socket_io.h"
#include "transport/cuda/cuda_util.h"
#include "transport/nccl/nccl_transport.h"
#include "transport/transport.h"

#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "the nccl transport needs NCCL 2.18 or newer (non-blocking communicators, ncclCommAbort)"
#endif

namespace kvstream::transport::nccl {

inline constexpr size_t kGroupOps = 64;          // sends/recvs per NCCL group in direct mode
inline constexpr int64_t kSendTimeoutSec = 5;    // control-socket writes

// NcclOptions::trace prints each step's time since the write was handed over (writer) or its
// header arrived (receiver): microseconds from `from` to `to`; -1 when `to` was never set.
double MicrosSince(Clock::time_point from, Clock::time_point to);

// kRemoteDisconnect for ncclRemoteError, else kInternal, with NCCL's last error of `comm`.
Status NcclStatus(ncclResult_t r, ncclComm_t comm, const std::string& what);
// kUnavailable "nccl: <what>: <strerror(errno)>".
Status Errno(const std::string& what);
// An asynchronous error of the two-rank communicator: the path to the one peer failed
// (kRemoteDisconnect, with NCCL's words).
Status CommFailed(ncclResult_t st, ncclComm_t comm, const std::string& what);

// ---- control socket -----------------------------------------------------------------------
// TCP_NODELAY and a kSendTimeoutSec send timeout.
void SetSocketOptions(int fd);
// A blocking, connected TCP socket (SetSocketOptions applied), or kUnavailable.
Result<int> ConnectTcp(const std::string& host, uint16_t port, Deadline deadline);

// ---- communicator -------------------------------------------------------------------------
// Polls a non-blocking communicator until its last call completed. `alive` is asked between
// polls (socket EOF, shutdown); its error ends the wait. `tight`: the first millisecond is
// polled with yields (a launch takes tens of microseconds), then short sleeps.
Status WaitComm(ncclComm_t comm, Deadline deadline, const std::function<Status()>& alive,
                const std::string& what, bool tight = true);
// The endpoint threads wait in short polls while writes are in flight: a 1 us timer slack.
void TightenTimerSlack();
// Joins the two-rank communicator of `unique_id` (kUniqueIdBytes raw bytes) as `rank`,
// non-blocking, within `deadline`; aborts it on failure.
Result<ncclComm_t> InitComm(int device, const std::string& unique_id, int rank, Deadline deadline,
                            const std::function<Status()>& alive);
// One small send (rank 0) / receive (rank 1) on `stream`, waited for to its end, so that NCCL's
// point-to-point connect happens inside Connect's deadline, not at the first write. `buf`: at
// least 16 bytes of device memory nothing else touches meanwhile.
Status WarmUp(ncclComm_t comm, int rank, void* buf, cudaStream_t stream, Deadline deadline,
              const std::function<Status()>& alive);

// ---- staging ------------------------------------------------------------------------------
// The gather (writer) / scatter (receiver) of one chunk: the parameter-table kernel when the
// pieces are 16-byte aligned, else one cudaMemcpyAsync per piece.
Status CopyPieces(const std::vector<cuda::CopyRun>& runs, cuda::PackedTable* table,
                  const cuda::ParamKernelConfig& cfg, cudaStream_t stream);

// Two staging buffers and the events that order their reuse, per endpoint / connection side.
struct Staging {
  std::unique_ptr<cuda::DeviceBuffer> buffer;  // 2 * chunk_bytes
  uint64_t chunk_bytes = 0;
  cudaEvent_t filled[2] = {nullptr, nullptr};  // data in the slot is ready to send / unpack
  cudaEvent_t freed[2] = {nullptr, nullptr};   // the slot may be overwritten
  uint64_t next = 0;
  char* slot(int i) const { return static_cast<char*>(buffer->data()) + i * chunk_bytes; }
};

// ---- transport state ----------------------------------------------------------------------
// What the transport, its writers and its receivers share.
struct NcclTransportState {
  NcclOptions options;
  int device = -1;
  std::string pci_bus_id;
  std::string host_id;
  cuda::ParamKernelConfig kernel;  // the pack / unpack kernels' launch shape (their default)
  explicit NcclTransportState(int dev) : device(dev), events(dev) {}
  cuda::EventPool events;

  std::mutex reg_mu;
  std::map<uint64_t, MemoryRegion> regs;  // receiver side: by registration id
  uint64_t next_reg_id = 1;

  std::mutex sink_mu;
  NotificationSink sink;

  // Receiver: the admission ids its addresses carry. LocalAddress() issues a fresh one per call
  // (so per handshake); a hello that presents one consumes it, so each admits one connection.
  // Ids never presented expire (kAdmissionIdTtl) and at most kMaxAdmissionIds wait at a time
  // (the oldest goes first).
  static constexpr int64_t kAdmissionIdTtlMs = 10 * 60 * 1000;
  static constexpr size_t kMaxAdmissionIds = 256;
  std::mutex id_mu;
  std::deque<std::pair<std::string, Clock::time_point>> admission_ids;
  Result<std::string> IssueAdmissionId();       // kUniqueIdBytes random bytes (getrandom)
  bool ConsumeAdmissionId(const char* presented);  // true once per issued id, within its TTL
  // Receiver: hellos that presented an issued id (a communicator followed) or did not.
  std::atomic<uint64_t> hellos_admitted{0};
  std::atomic<uint64_t> hellos_refused{0};

  Status InitStaging(Staging* st, uint64_t chunk_bytes);
  void ReleaseStaging(Staging* st);
  // After the communicator was aborted: waits (2 s each) for the side's streams, then releases
  // `st`; if one is still busy, leaks the buffer instead (cudaFree would block behind a stuck
  // kernel) and logs it as `side`'s.
  void ReleaseStagingWhenIdle(Staging* st, const cuda::Stream* a, const cuda::Stream* b,
                              const char* side);
};

class NcclRegistration : public Registration {
 public:
  NcclRegistration(std::shared_ptr<NcclTransportState> shared, uint64_t id, MemoryRegion region,
                   std::string key)
      : shared_(std::move(shared)), id_(id), region_(region), key_(std::move(key)) {}
  ~NcclRegistration() override {
    std::lock_guard<std::mutex> lock(shared_->reg_mu);
    shared_->regs.erase(id_);
  }
  const MemoryRegion& region() const override { return region_; }
  std::string RemoteKey() const override { return key_; }
  const NcclTransportState* owner() const { return shared_.get(); }

 private:
  std::shared_ptr<NcclTransportState> shared_;
  uint64_t id_;
  MemoryRegion region_;
  std::string key_;
};

}  // namespace kvstream::transport::nccl
