// The host-staged writer's pipeline thread (transport/staged/staged_writer.h): starts queued
// chunks as send buffers and peer slots free up, watches their copies and puts, and takes the
// slots back (credits or doorbells).
#include <sys/prctl.h>

#include <cstring>

#include "common/log.h"
#include "transport/staged/staged_writer.h"

namespace kvstream::transport::staged {

using cuda::CopyRun;
using cuda::CudaStatus;
using cuda::DeviceGuard;

Status StagedWriter::StartChunk(SendBuf& b, Chunk chunk, uint32_t slot) {
  char* base = zero_copy ? PeerSlot(slot) : static_cast<char*>(send_staging->data()) + b.offset;
  ChunkWire cw{};
  std::memcpy(cw.magic, kChunkMagic, sizeof(cw.magic));
  cw.conn_id = conn_id;
  cw.npieces = uint32_t(chunk.pieces.size());
  cw.write_seq = chunk.write_seq;
  cw.chunk_index = chunk.index;
  cw.total_chunks = chunk.total;
  cw.has_note = chunk.has_note;
  cw.note_request = chunk.note.request_id;
  cw.note_layer = chunk.note.layer;
  cw.note_flags = chunk.note.flags;
  std::memcpy(cw.note_mac, chunk.note.mac.data(), sizeof(cw.note_mac));
  cw.data_bytes = chunk.bytes;
  if (doorbells) {
    if (++token_counter_ == 0) ++token_counter_;
    cw.token = (uint64_t(conn_id) << 32) | token_counter_;
  }
  b.token = cw.token;
  std::memcpy(base, &cw, sizeof(cw));
  std::vector<CopyRun> runs;
  const uint64_t staging = reinterpret_cast<uint64_t>(base + kHeaderBytes);
  for (size_t i = 0; i < chunk.pieces.size(); ++i) {
    const Piece& p = chunk.pieces[i];
    PieceWire pw{p.region_id, 0, p.dst_offset, p.staging_offset, p.length};
    std::memcpy(base + sizeof(cw) + i * sizeof(PieceWire), &pw, sizeof(pw));
    CopyRun r{p.src, staging + p.staging_offset, p.length};
    // Pieces sit back to back in staging: merge those whose sources are contiguous too.
    if (!runs.empty() && runs.back().src + runs.back().length == r.src &&
        runs.back().dst + runs.back().length == r.dst) {
      runs.back().length += r.length;
    } else {
      runs.push_back(r);
    }
  }
  b.dep = chunk.dep;
  chunk.dep = nullptr;
  if (b.dep != nullptr) {
    // Both streams: this write's later chunks may use either, and they rely on this wait.
    KV_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(lanes.copy, b.dep, 0), "cudaStreamWaitEvent");
    if (lanes.kernel != lanes.copy) {
      KV_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(lanes.kernel, b.dep, 0), "cudaStreamWaitEvent");
    }
  }
  const size_t index = size_t(&b - bufs_.data());
  CopyRun* table = static_cast<CopyRun*>(tables->data()) + index * kTableEntriesPerSlot;
  void* sc = static_cast<char*>(scratch->data()) + index * chunk_cap;
  KV_ASSIGN_OR_RETURN(cudaStream_t done_on, CopyChunk(Direction::kToHost, runs, staging, chunk.bytes, sc,
                                                      table, kTableEntriesPerSlot, lanes));
  KV_ASSIGN_OR_RETURN(b.event, context->events.Acquire());
  KV_CUDA_RETURN_IF_ERROR(cudaEventRecord(b.event, done_on), "cudaEventRecord");
  b.chunk = std::move(chunk);
  b.slot = slot;
  b.state = 1;
  copying_.push_back(&b);
  return OkStatus();
}

Status StagedWriter::PostChunk(SendBuf& b) {
  WriteRequest wr;
  wr.local = send_reg.get();
  wr.remote_region = 0;
  if (!zero_copy) {
    const uint64_t slot_off = uint64_t(peer.mailboxes) * kMailboxBytes + uint64_t(b.slot) * peer.slot_stride;
    const uint64_t header = sizeof(ChunkWire) + b.chunk.pieces.size() * sizeof(PieceWire);
    wr.ops.push_back({b.offset, slot_off, header});
    if (b.chunk.bytes > 0) wr.ops.push_back({b.offset + kHeaderBytes, slot_off + kHeaderBytes, b.chunk.bytes});
  } else {
    // The copy engine's writes are complete (its event passed) and the descriptor was stored
    // by this thread; the announcement below must not overtake them.
    std::atomic_thread_fence(std::memory_order_release);
    if (doorbells) {
      StoreWord(PeerSlot(b.slot) + kReadyOffset, b.token);
      awaiting_.push_back({b.slot, b.token});
    }
  }
  wr.notify = true;
  wr.notification = Msg(kChunk, (uint64_t(conn_id) << 32) | b.slot, int32_t(b.chunk.index));
  KV_ASSIGN_OR_RETURN(auto h, inner_ep->Write(wr));
  if (zero_copy) {
    notes_.push_back(std::move(h));
    b.state = 0;  // the buffer only tracked the copy
  } else {
    b.put = std::move(h);
    b.state = 2;
  }
  return OkStatus();
}

bool StagedWriter::DropFrontLocked() {
  Chunk& c = queue_.front();
  auto it = writes_.find(c.write_seq);
  const bool drop = it == writes_.end() || it->second.completion->done() ||
                    it->second.completion->cancel_requested() || !it->second.error.ok();
  if (!drop) return false;
  context->events.Release(c.dep);
  queue_.pop_front();
  if (it != writes_.end()) {
    it->second.dropped = true;
    MaybeFinishLocked(it);
  }
  return true;
}

void StagedWriter::HelloLocked() {
  if (!status_.ok()) return;
  if (!hello_sent && !writes_.empty()) {
    auto h = inner_ep->Write(hello);
    if (!h.ok()) return FailAllLocked(h.status().WithContext("ucx_staged hello"));
    hello_handle_ = std::move(h).value();
    hello_sent = true;
    hello_deadline_ = DeadlineAfterMs(context->options.connect_timeout_ms);
  }
  if (hello_handle_ && hello_handle_->Done()) {
    Status s = hello_handle_->Wait(Clock::now());
    hello_handle_.reset();
    if (!s.ok()) return FailAllLocked(s.WithContext("ucx_staged hello (connection not admitted?)"));
  }
  if (hello_sent && !granted_ && Expired(hello_deadline_)) {
    FailAllLocked(Unavailable("ucx_staged: the peer granted no staging slot within " +
                              std::to_string(context->options.connect_timeout_ms) +
                              " ms of our hello (connection not admitted, or the peer is gone)"));
  }
}

void StagedWriter::Run() {
  DeviceGuard guard(context->device);
  (void)::prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);  // see staged_receiver.cc
  std::unique_lock<std::mutex> lock(mu_);  // the pipeline thread's own
  while (!stop_) {
    bool active = false;
    HelloLocked();  // a credit's arrival wakes us; the rest is checked every 50 ms at most
    // Copies to the host finish in stream order: announce chunks in the order they started,
    // so that the peer copies them to the device in that order too.
    while (!copying_.empty()) {
      SendBuf& b = *copying_.front();
      cudaError_t err = cudaEventQuery(b.event);
      if (err == cudaErrorNotReady) {
        active = true;
        break;
      }
      copying_.pop_front();
      context->events.Release(b.event);
      context->events.Release(b.dep);
      b.event = b.dep = nullptr;
      Status s = CudaStatus(err, "staging copy to host");
      if (s.ok() && !status_.ok()) s = status_;
      if (s.ok()) s = PostChunk(b);
      if (!s.ok()) {
        ChunkFailedLocked(b, s);
        b.state = 0;
      }
      if (b.state == 0) in_flight_bufs_--;
    }
    for (SendBuf& b : bufs_) {
      if (b.state == 2) {
        if (!b.put->Done()) {
          active = true;
          continue;
        }
        Status s = b.put->Wait(Clock::now());
        b.put.reset();
        b.state = 0;
        in_flight_bufs_--;
        if (!s.ok()) FailAllLocked(s);
      }
    }
    for (auto it = notes_.begin(); it != notes_.end();) {
      if (!(*it)->Done()) {
        active = true;
        ++it;
        continue;
      }
      Status s = (*it)->Wait(Clock::now());
      it = notes_.erase(it);
      if (!s.ok()) FailAllLocked(s);
    }
    // Doorbells: the peer hands slots back by storing the chunk's token in the done word.
    if (status_.ok() && peer_map && !awaiting_.empty()) {
      active = true;
      for (size_t i = 0; i < awaiting_.size();) {
        const char* done = PeerSlot(awaiting_[i].slot) + kDoneOffset;
        if (LoadWord(done + offsetof(DoneWire, token)) != awaiting_[i].token) {
          ++i;
          continue;
        }
        DoneWire d;
        std::memcpy(&d, done, offsetof(DoneWire, token));
        const uint32_t slot = awaiting_[i].slot;
        awaiting_.erase(awaiting_.begin() + ptrdiff_t(i));
        CreditBackLocked(slot, d.write_seq, d.bits);
      }
    }
    misc_.erase(std::remove_if(misc_.begin(), misc_.end(),
                               [](const std::unique_ptr<WriteHandle>& h) { return h->Done(); }),
                misc_.end());
    if (status_.ok() && inner_ep) {
      Status s = inner_ep->status();
      if (!s.ok()) FailAllLocked(s);
    }
    // Writes waiting only on the peer (credits, completions): ping it now and then, so that
    // a dead peer shows up as an inner write error rather than as silence.
    if (ping_ && ping_->Done()) {
      Status s = ping_->Wait(Clock::now());
      ping_.reset();
      if (!s.ok()) FailAllLocked(s);
    }
    if (status_.ok() && hello_sent && !writes_.empty() && in_flight_bufs_ == 0 && !ping_ &&
        Clock::now() - last_ping_ > std::chrono::milliseconds(100)) {
      WriteRequest wr;
      wr.local = send_reg.get();
      wr.remote_region = 0;
      wr.notify = true;
      wr.notification = Msg(kPing, conn_id, int32_t(conn_id));
      auto h = inner_ep->Write(wr);
      if (h.ok()) {
        ping_ = std::move(h).value();
      } else {
        FailAllLocked(h.status());
      }
      last_ping_ = Clock::now();
    }
    if (ping_) active = true;
    // A lost peer: once our copies into its staging area are over, let go of the mapping.
    if (!status_.ok() && peer_map && in_flight_bufs_ == 0) {
      UnmapPeer();
      KV_LOG_INFO << "ucx_staged: peer lost, its staging area unmapped";
    }
    // Canceled or failed writes start no more chunks, whether or not a slot is free.
    while (!queue_.empty() && DropFrontLocked()) {
    }
    if (StartQueuedLocked()) active = true;
    if (!active) cv_.notify_all();  // Shutdown waits for the pipeline to drain
    if (active && poll_us_ == 0) {
      // Busy wait; a caller waiting for mu_ (Write(), a credit) gets it before we take it back.
      lock.unlock();
      do {
        SpinPause();
      } while (lock_waiters_.load(std::memory_order_acquire) > 0);
      lock.lock();
    } else {
      cv_.wait_for(lock, active ? std::chrono::microseconds(poll_us_) : std::chrono::microseconds(50000));
    }
  }
}

bool StagedWriter::StartQueuedLocked(size_t max_chunks) {
  bool started = false;
  for (size_t n = 0; n < max_chunks && status_.ok() && !queue_.empty() && !credits_.empty();) {
    if (DropFrontLocked()) continue;
    SendBuf* free_buf = nullptr;
    for (SendBuf& b : bufs_) {
      if (b.state == 0) {
        free_buf = &b;
        break;
      }
    }
    if (free_buf == nullptr) break;
    Chunk c = std::move(queue_.front());
    queue_.pop_front();
    auto it = writes_.find(c.write_seq);  // present: DropFrontLocked kept it
    uint32_t slot = credits_.front();
    credits_.pop_front();
    Status s = StartChunk(*free_buf, std::move(c), slot);
    if (!s.ok()) {
      credits_.push_back(slot);
      context->events.Release(free_buf->dep);
      context->events.Release(free_buf->event);
      free_buf->dep = free_buf->event = nullptr;
      it->second.dropped = true;
      if (it->second.error.ok()) it->second.error = s;
      MaybeFinishLocked(it);
      continue;
    }
    it->second.started++;
    it->second.in_flight++;
    in_flight_bufs_++;
    started = true;
    ++n;
  }
  return started;
}

}  // namespace kvstream::transport::staged
