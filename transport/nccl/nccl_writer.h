// The writer side of nccl (internal to transport/nccl/): one NcclWriter per endpoint, with its
// control socket, its communicator (rank 0), its streams and staging buffers, and the thread
// that makes every NCCL call of the endpoint (a non-blocking communicator must not be driven
// from two threads). nccl_transport.h says what the backend guarantees.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/time.h"
#include "transport/nccl/nccl_comm.h"
#include "transport/nccl/nccl_wire.h"
#include "transport/transport.h"

namespace kvstream::transport::nccl {

// One write, from Write() until its handle is done.
struct NcclWriteOp {
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

// A receiver registration as the writer names it.
struct NcclTarget {
  uint64_t registration_id = 0;
  uint64_t length = 0;
};

// Connect fills the public fields (joining the communicator), then calls Start().
class NcclWriter {
 public:
  std::shared_ptr<NcclTransportState> shared;
  std::vector<NcclTarget> targets;
  int fd = -1;
  int wake_fd = -1;
  ncclComm_t comm = nullptr;
  std::unique_ptr<cuda::Stream> comm_stream, pack_stream;
  Staging staging;
  CopyMode mode = CopyMode::kAuto;

  ~NcclWriter();
  void Start() { thread_ = std::thread([this] { Run(); }); }
  Status status() const;
  Result<std::unique_ptr<WriteHandle>> Write(const WriteRequest& req);
  // Stops the thread (posted writes may finish for close_timeout_ms), aborts the communicator
  // and fails what is left with kCanceled.
  void Shutdown();

 private:
  void Wake();
  void SetStatus(const Status& s);
  void AbortComm();
  void ReleaseOpEvents(NcclWriteOp& op);
  // Finishes every queued and in-flight write with `why` (after the communicator is gone).
  void FailAll(const Status& why);
  // The peer or NCCL failed: abort, fail everything, refuse later writes.
  void Fail(const Status& why);
  // Takes the receiver's acks; kRemoteDisconnect once it closed.
  Status PollSocket();
  Status Group(const std::function<Status()>& calls, const char* what);
  Status Submit(NcclWriteOp& op);
  static void TraceDone(const NcclWriteOp& op);
  void Run();

  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> shut_down_{false};
  mutable std::mutex status_mu_;
  Status status_;
  std::mutex q_mu_;
  std::deque<std::shared_ptr<NcclWriteOp>> queue_;
  uint64_t next_write_id_ = 1;
  // Worker thread only:
  std::deque<std::shared_ptr<NcclWriteOp>> inflight_;
  std::string rx_;
  ChunkPlan plan_;
  std::vector<cuda::CopyRun> runs_;
  cuda::PackedTable table_;
  Clock::time_point group_end_;  // trace: when the last ncclGroupEnd returned
};

class NcclEndpoint : public Endpoint {
 public:
  explicit NcclEndpoint(std::unique_ptr<NcclWriter> w) : w_(std::move(w)) {}
  ~NcclEndpoint() override { w_->Shutdown(); }
  Result<std::unique_ptr<WriteHandle>> Write(const WriteRequest& request) override {
    return w_->Write(request);
  }
  Status status() const override { return w_->status(); }

 private:
  std::unique_ptr<NcclWriter> w_;
};

}  // namespace kvstream::transport::nccl
