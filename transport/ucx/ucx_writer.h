// The writing side of the UCX backend (transport/ucx/): endpoints, writes and their closing.
//
// Write(): the adjacent CopyOps are coalesced; every run is posted with ucp_put_nbx, then one
// ucp_ep_flush_nbx waits for remote completion of all of them, and only then, if asked, an
// active message carries the notification. A same-host peer's memory is written by the copier
// thread instead (ucx_host_copy.cc), after which the notification goes the same way.
// CUDA memory on either side: every run is a data message instead (ucp_am_send_nbx, rendezvous,
// the source's memory type given), which UCX moves memory-type-aware in every release (its puts
// from CUDA memory copy with the host's memcpy before 1.16); the write is complete when every
// message's send completed, and the receiver lands each in memory it registered
// (ucx_receiver.h). With after_stream (CUDA sources only) nothing is sent before the work queued
// on that stream when Write() was called has finished (an event the progress thread polls).
//
// Endpoint destruction: flush (bounded), then force-close the ucp endpoint, then wait until
// every write through it has completed (canceled ones with kCanceled).
//
// Everything here but UcxEndpoint's public calls runs on the worker's progress thread.
#pragma once

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/time.h"
#include "transport/core/peer_process.h"
#include "transport/core/write_completion.h"
#include "transport/core/write_plan.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_receiver.h"
#include "transport/ucx/ucx_wire.h"
#include "transport/ucx/ucx_worker.h"

namespace kvstream::transport::ucx {

struct UcxEndpointState {
  UcxWorker* worker = nullptr;
  ucp_ep_h ep = nullptr;
  std::vector<ucp_rkey_h> rkeys;
  std::vector<RemoteRegion> regions;  // keys cleared; addr and length kept
  std::string ticket;  // what the peer admits (Endpoint::AdmissionTicket)
  // Until the first write: where to connect (the peer's listener), from which socket address
  // (the ticket's), and the peer's packed memory keys. `ep` is made then (EnsureConnected).
  sockaddr_storage dial{}, source{};
  unsigned dial_length = 0, source_length = 0;
  std::vector<std::string> packed_keys;
  bool connect_tried = false;
  // A reply endpoint (ReplyEndpoint): `ep` is a connection the worker's Admission accepted and
  // owns; closing this endpoint only stops using it.
  bool borrowed = false;

  // Same-host peer proven by its gate (ucx_same_host.h): its pid from the kernel (0 = none, use
  // UCX puts). Set before use.
  pid_t cma_pid = 0;
  internal::PeerProcess peer_process;  // tells when that process exits
  // Per remote region: copied on this host (inside a range the peer's gate granted), else by
  // UCX puts.
  std::vector<bool> host_copy;
  // Per remote region: CUDA memory (its key says so): written with data messages.
  std::vector<bool> remote_cuda;
  // Per remote region: the peer's memfd (granted over the gate) mapped here (nullptr = none);
  // writes then memcpy. `fd` is this endpoint's own descriptor of it (-1 = none).
  struct PeerMap {
    uint8_t* ptr = nullptr;
    size_t length = 0;
    uint64_t base = 0;
    int fd = -1;
  };
  std::vector<PeerMap> maps;

  // Progress-thread only.
  int inflight = 0;
  std::atomic<bool> closing{false};
  bool force_started = false;
  bool reflush = false;  // the close watcher issues another flush on its next turn
  Deadline flush_deadline{};

  std::atomic<bool> failed{false};
  mutable std::mutex mu;
  Status error;            // guarded by mu; set once on failure
  std::condition_variable closed_cv;
  bool closed = false;     // guarded by mu: ep closed and every write through it finished

  ~UcxEndpointState() {
    for (PeerMap& m : maps) {
      if (m.ptr != nullptr) munmap(m.ptr, m.length);
      if (m.fd >= 0) close(m.fd);
    }
  }
  Status Error() const {
    std::lock_guard<std::mutex> lock(mu);
    return error;
  }
  void MarkFailed(Status s) {
    std::lock_guard<std::mutex> lock(mu);
    if (!error.ok()) return;
    error = std::move(s);
    failed.store(true);
  }
};

void OnEndpointError(void* arg, ucp_ep_h, ucs_status_t status);

struct UcxWriteOp {
  std::shared_ptr<internal::WriteCompletion> completion;
  std::shared_ptr<UcxEndpointState> ep;
  std::shared_ptr<UcxRegionState> reg;
  uint64_t remote_base = 0;
  int remote_region = 0;
  ucp_rkey_h rkey = nullptr;
  bool host_copy = false;         // copied on this host (ucx_host_copy.cc), not put by UCX
  uint8_t* mapped_dst = nullptr;  // the remote region mapped here (same host, memfd)
  std::vector<internal::Run> runs;
  bool notify = false;
  std::string notify_header;  // the notification active message's header
  Status put_error;
  // Data messages (CUDA memory on either side): their headers (alive until sent), the memory
  // type of the source, the sends not yet complete, and the event after_stream waits for.
  bool am_data = false;
  bool cuda_source = false;
  std::vector<std::string> am_headers;
  int am_pending = 0;
  void* dep = nullptr;   // cudaEvent_t
  int dep_device = -1;
};

// Progress thread: connects to the peer's listener on the first call (a failure marks the
// endpoint failed). False when there is no connection.
bool EnsureConnected(UcxEndpointState* ep);
// Progress thread: starts a write Write() posted.
void StartWrite(UcxWriteOp* op);
// Progress thread: completes the write and lets its endpoint's close go on.
void FinishWrite(UcxWriteOp* op, Status status);
// Progress thread: every byte of the write is at the destination (or `st` says why not); sends
// its notification if asked, else finishes it.
void OnWriteFlushed(void* request, ucs_status_t st, void* user);
// Copier thread: copies a same-host write into the peer's memory (ucx_host_copy.cc), then hands
// it back to the progress thread.
void CopyOnHost(UcxWriteOp* op);
// Progress thread: starts closing the endpoint (~UcxEndpoint posts it).
void BeginClose(const std::shared_ptr<UcxEndpointState>& ep);

class UcxEndpoint final : public Endpoint {
 public:
  UcxEndpoint(std::shared_ptr<UcxWorker> worker, std::shared_ptr<UcxEndpointState> state)
      : worker_(std::move(worker)), state_(std::move(state)) {}
  ~UcxEndpoint() override;
  Result<std::unique_ptr<WriteHandle>> Write(const WriteRequest& request) override;
  Status status() const override { return state_->failed.load() ? state_->Error() : OkStatus(); }
  std::string AdmissionTicket() const override { return state_->ticket; }
  const UcxEndpointState& state() const { return *state_; }

 private:
  std::shared_ptr<UcxWorker> worker_;
  std::shared_ptr<UcxEndpointState> state_;
};

}  // namespace kvstream::transport::ucx
