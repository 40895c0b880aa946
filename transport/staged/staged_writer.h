// The host-staged transport's send side (transport/staged/): one StagedWriter per endpoint, with
// a pipeline thread (staged_pipeline.cc) that, for each chunk of the queued writes, waits for a
// free send buffer and a credit (a peer slot), copies device -> host on a lowest-priority stream
// (into a send buffer, or zero-copy straight into the peer's slot), and announces it; the
// handle completes once the peer reports every chunk of the write on its device.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/time.h"
#include "transport/core/write_completion.h"
#include "transport/cuda/cuda_util.h"
#include "transport/staged/staged_chunk_copy.h"
#include "transport/staged/staged_context.h"
#include "transport/staged/staged_wire.h"
#include "transport/ucx/ucx_transport.h"

namespace kvstream::transport::staged {

struct Piece {
  uint64_t src = 0;
  uint32_t region_id = 0;
  uint64_t dst_offset = 0;
  uint64_t staging_offset = 0;
  uint64_t length = 0;
};
struct Chunk {
  uint64_t write_seq = 0;
  uint32_t index = 0, total = 0;
  bool has_note = false;
  Notification note;
  std::vector<Piece> pieces;
  uint64_t bytes = 0;
  cudaEvent_t dep = nullptr;  // first chunk of a write with after_stream
};
// One chunk between its start and the moment its bytes are the peer's: the device -> host copy
// (into a send buffer, or zero-copy straight into the peer's slot), then (put path) the UCX put.
struct SendBuf {
  uint64_t offset = 0;  // in the send staging registration (put path)
  int state = 0;        // 0 free, 1 copying to host, 2 put in flight
  cudaEvent_t event = nullptr;
  cudaEvent_t dep = nullptr;
  std::unique_ptr<WriteHandle> put;
  Chunk chunk;
  uint32_t slot = 0;
  uint64_t token = 0;  // doorbells
};
// A write from Write() until no chunk of it is in flight any more.
struct WriteEntry {
  std::shared_ptr<internal::WriteCompletion> completion;
  uint32_t started = 0;    // chunks started
  uint32_t in_flight = 0;  // started and not yet handed back by the peer
  bool delivered = false;  // the peer reported every chunk on the device (completion OK)
  bool dropped = false;    // a chunk was not started (cancel, failure, shutdown)
  Status error;            // the first failure of one of its chunks
};

class StagedWriter : public std::enable_shared_from_this<StagedWriter> {
 public:
  std::shared_ptr<StagedContext> context;
  uint32_t conn_id = 0;
  std::unique_ptr<Endpoint> inner_ep;
  std::unique_ptr<cuda::PinnedBuffer> send_staging;
  std::unique_ptr<Registration> send_reg;
  std::unique_ptr<cuda::PinnedBuffer> tables;  // kTableEntriesPerSlot per send buffer
  std::unique_ptr<cuda::DeviceBuffer> scratch;  // chunk_cap per send buffer
  std::unique_ptr<cuda::Stream> stream;         // device -> host copies
  std::unique_ptr<cuda::Stream> kernel_stream;  // gather kernels
  Lanes lanes;
  std::vector<RegionInfo> remote;  // per peer region: id in `addr`, length
  StagingArea peer{};
  uint64_t buf_stride = 0;
  uint64_t chunk_cap = 0;  // data bytes per chunk: fits our buffers and the peer's slots
  // Zero-copy: the peer's staging area mapped here and page-locked by us.
  std::unique_ptr<ucx::PeerMapping> peer_map;
  bool peer_map_registered = false;
  bool zero_copy = false;
  bool doorbells = false;  // zero-copy, announcing and getting slots back through doorbells
  WriteRequest hello;      // posted by the pipeline thread when the first write is queued
  bool hello_sent = false;

  ~StagedWriter() { Shutdown(); }

  void OnCredit(const Notification& n);

  // Slot `slot` is ours again: a fresh grant (seq 0), or the peer is done with our chunk of
  // write `seq` (bits: kBitWriteDone, kBitError).
  void CreditBackLocked(uint32_t slot, uint64_t seq, int32_t bits);

  void Start(int nbufs) {
    poll_us_ = std::clamp<int64_t>(context->options.poll_us, 0, 1000);
    for (int i = 0; i < nbufs; ++i) {
      bufs_.emplace_back();
      bufs_.back().offset = uint64_t(i) * buf_stride;
    }
    thread_ = std::thread([this] { Run(); });
  }

  Status status() const {
    auto lock = LockFromOutside();
    return status_;
  }

  Result<std::unique_ptr<WriteHandle>> Write(const WriteRequest& req);

  void Shutdown();

  // Drops the zero-copy mapping of the peer's staging area (no copy into it may be running).
  void UnmapPeer();

 private:
  // Ends the write once no chunk of it is in flight and none will start: delivered ones are
  // done already; the others complete with their error (kCanceled when canceled) and the peer
  // is told to forget their progress.
  void MaybeFinishLocked(std::map<uint64_t, WriteEntry>::iterator it);

  void FailAllLocked(const Status& s);

  // A started chunk that never reached the peer: its slot is still ours.
  void ChunkFailedLocked(SendBuf& b, const Status& s);

  char* PeerSlot(uint32_t slot) const {
    return static_cast<char*>(peer_map->data()) + uint64_t(peer.mailboxes) * kMailboxBytes +
           uint64_t(slot) * peer.slot_stride;
  }

  // Starts the device -> host copy of `chunk` bound for peer slot `slot`: into send buffer `b`,
  // or (zero-copy) straight into the slot.
  Status StartChunk(SendBuf& b, Chunk chunk, uint32_t slot);

  // The chunk's bytes are on the host: put path, write descriptor + data into the peer's slot
  // (the notification follows the data); zero-copy, they are in the slot already: announce it.
  Status PostChunk(SendBuf& b);

  // Whether the chunk at the queue's front belongs to a write that must not start more chunks.
  bool DropFrontLocked();

  void Run();

  // mu_ for every thread but the pipeline thread (which may be busy waiting, see Run).
  std::unique_lock<std::mutex> LockFromOutside() const {
    lock_waiters_.fetch_add(1, std::memory_order_acq_rel);
    std::unique_lock<std::mutex> lock(mu_);
    lock_waiters_.fetch_sub(1, std::memory_order_acq_rel);
    return lock;
  }

  // Starts queued chunks (at most max_chunks) while a send buffer and a peer slot are free; true
  // when one started. The pipeline thread calls it, and Write() for one chunk, so that a write
  // to an idle pipeline starts copying without waiting for the thread to wake up (the caller
  // pays one copy's enqueue, not more).
  bool StartQueuedLocked(size_t max_chunks = SIZE_MAX);

  // Pipeline thread: says hello once a write is queued, and fails the endpoint when the peer
  // grants no slot within connect_timeout_ms of it (its connection refused, or the peer gone).
  void HelloLocked();

  mutable std::mutex mu_;
  mutable std::atomic<int> lock_waiters_{0};
  std::condition_variable cv_;
  int64_t poll_us_ = 5;
  Status status_;
  bool stop_ = false;
  bool shut_down_ = false;
  bool bye_acked_ = false;
  std::deque<Chunk> queue_;
  std::deque<uint32_t> credits_;
  std::map<uint64_t, WriteEntry> writes_;
  uint64_t next_seq_ = 1;
  int in_flight_bufs_ = 0;
  std::unique_ptr<WriteHandle> hello_handle_;
  Deadline hello_deadline_{};
  bool granted_ = false;  // a first slot came
  std::unique_ptr<WriteHandle> ping_;
  std::vector<std::unique_ptr<WriteHandle>> notes_;  // zero-copy chunk announcements
  std::vector<std::unique_ptr<WriteHandle>> misc_;   // abandon messages
  Clock::time_point last_ping_ = Clock::now();
  std::vector<SendBuf> bufs_;
  std::deque<SendBuf*> copying_;  // state 1, in the order their copies started
  struct Awaiting {
    uint32_t slot;
    uint64_t token;
  };
  std::vector<Awaiting> awaiting_;  // doorbells: chunks rung, their done word not seen yet
  uint32_t token_counter_ = 0;
  std::thread thread_;
};

}  // namespace kvstream::transport::staged
