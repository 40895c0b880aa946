// The writer side of cuda_ipc (internal to transport/cuda_ipc/): the state the transport's
// endpoints share, the peer allocations they map, and one IpcWriter per endpoint (its copy
// stream, its queue of writes in flight and the completion thread that sends their
// notifications). cuda_ipc_transport.h says what the backend guarantees.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/cuda_vmm.h"
#include "common/status.h"
#include "common/time.h"
#include "transport/cuda/control_socket.h"
#include "transport/cuda/copy_plan.h"
#include "transport/cuda/cuda_util.h"
#include "transport/cuda/landed_flags.h"
#include "transport/cuda_ipc/cuda_ipc_transport.h"
#include "transport/cuda_ipc/cuda_ipc_wire.h"
#include "transport/transport.h"

namespace kvstream::transport::cuda_ipc {

// A peer allocation mapped here from the descriptor the peer granted (or, for a peer in this
// very process whose descriptor the driver would not map again, its own pointer). Unmapped
// with the last target that uses it.
struct PeerMapping {
  std::unique_ptr<cuda_vmm::ImportedMapping> imported;  // null: the in-process pointer
  void* base = nullptr;
};

// What every endpoint and the receiver of one cuda_ipc transport share.
struct IpcTransportState {
  CudaIpcOptions options;
  int device = -1;
  explicit IpcTransportState(int dev) : device(dev), events(dev) {}
  cuda::ParamKernelConfig kernel;  // the scatter kernels' launch shape (their default)
  cuda::EventPool events;

  // Receiver: the registrations whose descriptors the control socket may grant.
  std::shared_ptr<GrantTable> grants = std::make_shared<GrantTable>();

  std::mutex sink_mu;
  NotificationSink sink;
};

// Writer: maps the peer memory `key` names, asking the receiver behind `channel` for its
// descriptor; allocations already mapped for this endpoint (`mapped`, by the receiver's
// alloc_id) are reused. Returns the region's start here and its length (the receiver's word,
// which the key must match: a key that differs is refused).
struct MappedRegion {
  std::shared_ptr<PeerMapping> mapping;
  uint64_t addr = 0;
  uint64_t length = 0;
};
Result<MappedRegion> MapPeerRegion(IpcTransportState& state, cuda::NotificationChannel& channel,
                                   const KeyWire& key, Deadline deadline,
                                   std::map<uint64_t, std::shared_ptr<PeerMapping>>* mapped);

// A peer region as this process addresses it.
struct IpcTarget {
  std::shared_ptr<PeerMapping> mapping;
  uint64_t addr = 0;  // region start in this process's address space
  uint64_t length = 0;
};

// One posted write, from Write() until its handle is done.
struct IpcWriteOp {
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

// One endpoint's writer. Connect fills the public fields, then calls Start().
// Locks, in the order they may nest: submit_mu_ -> ring_mu_, q_mu_, mu_ (the last three are
// leaves). No CUDA call and no syscall runs under q_mu_ or ring_mu_: the writer's per-layer path
// must never wait behind the completion thread's cudaEventQuery or socket write.
class IpcWriter : public std::enable_shared_from_this<IpcWriter> {
 public:
  std::shared_ptr<IpcTransportState> shared;
  std::unique_ptr<cuda::Stream> stream;
  std::shared_ptr<cuda::NotificationChannel> channel;
  int channel_fd = -1;
  std::vector<IpcTarget> targets;
  // The peer's allocations this endpoint mapped (by the receiver's alloc_id); targets and the
  // flag share them.
  std::map<uint64_t, std::shared_ptr<PeerMapping>> mapped;
  std::unique_ptr<cuda::PinnedBuffer> table;
  size_t table_capacity = 0;
  int wake_fd = -1;

  // Early notifications (the receiver granted a landed flag, gpu_landed_wait; landed_flags.h):
  // after each notified write's copy the copy stream writes the write's sequence number into
  // the receiver's flag at flag_addr (0: none, notifications are late).
  std::shared_ptr<PeerMapping> flag_mapping;
  uint64_t flag_addr = 0;
  const cuda::StreamMemOps* mem_ops = nullptr;
  uint32_t next_seq = 0;  // under submit_mu_

  ~IpcWriter();
  void Start();
  Status status() const;
  Result<std::unique_ptr<WriteHandle>> Write(const WriteRequest& req);
  // Marks `op` done with `s` (then sends its notification if asked and s is OK). Exactly one
  // caller wins; the others return without effect.
  void Finish(IpcWriteOp& op, Status s);
  // Polls the op's event once and finishes it if the copy completed.
  void TryFinish(IpcWriteOp& op);
  // Stops the completion thread, drains the copy stream (bounded), finishes what is left.
  void Shutdown();

 private:
  void Wake();
  void ReleaseEvents(IpcWriteOp& op);
  void MarkDisconnected(const Status& why);
  void FinishBatch(std::vector<std::pair<std::shared_ptr<IpcWriteOp>, cudaError_t>>& done);
  void Run();
  void Enqueue(std::shared_ptr<IpcWriteOp> op);

  mutable std::mutex mu_;  // status_, channel
  Status status_;
  std::atomic<bool> failed_{false};  // status_ is not OK (Write's lock-free check)
  std::mutex q_mu_;
  std::deque<std::shared_ptr<IpcWriteOp>> pending_;
  std::atomic<bool> sleeping_{false};
  std::mutex ring_mu_;
  std::unique_ptr<cuda::RunRing> ring_;
  std::mutex submit_mu_;  // one Write() at a time submits (stream order = queue order)
  cuda::CopyPlanner planner_;   // under submit_mu_
  cuda::BlockPlanner block_planner_;  // under submit_mu_
  // Units one write may carry in the block-table form (several launches beyond
  // cuda::BlockTableLaunchCapacity()); larger writes take the general plan.
  static constexpr size_t kMaxBlockEntries = 64 * 1024;
  cuda::PackedTable packed_;  // under submit_mu_
  // Completion thread's scratch (no allocation per batch once grown).
  std::vector<IpcWriteOp*> claimed_;
  std::vector<Notification> frames_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> shut_down_{false};
  std::thread thread_;
};

class IpcEndpoint : public Endpoint {
 public:
  explicit IpcEndpoint(std::shared_ptr<IpcWriter> writer) : writer_(std::move(writer)) {}
  ~IpcEndpoint() override { writer_->Shutdown(); }
  Result<std::unique_ptr<WriteHandle>> Write(const WriteRequest& request) override {
    return writer_->Write(request);
  }
  Status status() const override { return writer_->status(); }

 private:
  std::shared_ptr<IpcWriter> writer_;
};

}  // namespace kvstream::transport::cuda_ipc
