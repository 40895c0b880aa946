#include "transport/staged/staged_writer.h"

#include <unistd.h>

#include <cstring>
#include <random>
#include <string>

#include "common/log.h"
#include "transport/core/write_plan.h"
#include "transport/staged/chunk_plan.h"

namespace kvstream::transport::staged {
namespace {

using cuda::CopyRun;
using cuda::DeviceGuard;
using internal::CompletionHandle;
using internal::WriteCompletion;

class StagedEndpoint : public Endpoint {
 public:
  explicit StagedEndpoint(std::shared_ptr<StagedWriter> writer) : writer_(std::move(writer)) {}
  ~StagedEndpoint() override { writer_->Shutdown(); }
  Result<std::unique_ptr<WriteHandle>> Write(const WriteRequest& request) override {
    return writer_->Write(request);
  }
  Status status() const override { return writer_->status(); }
  std::string AdmissionTicket() const override { return writer_->inner_ep->AdmissionTicket(); }
  bool zero_copy() const { return writer_->zero_copy; }

 private:
  std::shared_ptr<StagedWriter> writer_;
};


// Zero-copy when allowed and the inner endpoint maps the peer's staging area (same host) and
// that mapping can be page-locked here; else UCX puts. Logged either way.
void ChooseZeroCopy(StagedContext& context, StagedWriter& writer) {
  if (context.options.zero_copy == ZeroCopy::kOff) {
    KV_LOG_INFO << "ucx_staged: UCX puts into the peer's staging slots (zero-copy turned off)";
    return;
  }
  auto map = ucx::MapPeerRegion(*writer.inner_ep, 0);
  if (!map.ok()) {
    KV_LOG_INFO << "ucx_staged: UCX puts into the peer's staging slots (" << map.status().ToString() << ")";
    return;
  }
  DeviceGuard guard(context.device);
  cudaError_t err = cudaHostRegister(map.value()->data(), map.value()->length(), cudaHostRegisterPortable);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    KV_LOG_WARN << "ucx_staged: the peer's staging area is mapped but cannot be page-locked here "
                << "(cudaHostRegister: " << cudaGetErrorString(err) << "); using UCX puts";
    return;
  }
  writer.peer_map = std::move(map).value();
  writer.peer_map_registered = true;
  writer.zero_copy = true;
  writer.doorbells = true;
  KV_LOG_INFO << "ucx_staged: peer on this host, its staging area mapped: device-to-host copies land "
              << "in its slots directly, UCX carries only announcements and credits (zero-copy; "
              << "staged_zero_copy=off forces UCX puts)";
}

}  // namespace

void StagedWriter::OnCredit(const Notification& n) {
  {
    auto lock = LockFromOutside();
    const int type = n.flags & 0xFF;
    if (type == kByeAck) {
      bye_acked_ = true;
    } else if (type == kCredit) {
      CreditBackLocked(uint32_t(n.request_id & 0xFFFF), n.request_id >> 16, n.flags);
    }
  }
  cv_.notify_all();
}

void StagedWriter::CreditBackLocked(uint32_t slot, uint64_t seq, int32_t bits) {
  credits_.push_back(slot);
  granted_ = true;
  auto it = seq == 0 ? writes_.end() : writes_.find(seq);
  if (it == writes_.end()) return;
  WriteEntry& e = it->second;
  if (e.in_flight > 0) --e.in_flight;
  if ((bits & kBitError) && e.error.ok()) {
    e.error = DataLoss("ucx_staged: the peer rejected a chunk of this write");
  }
  if ((bits & kBitWriteDone) && e.error.ok()) {
    e.delivered = true;
    e.completion->Complete(OkStatus());
  }
  MaybeFinishLocked(it);
}

void StagedWriter::Shutdown() {
  {
    auto lock = LockFromOutside();
    if (shut_down_) return;
    shut_down_ = true;
    // Queued chunks never start; their writes end (kCanceled) once their started chunks are back.
    std::vector<uint64_t> seqs;
    for (Chunk& c : queue_) {
      context->events.Release(c.dep);
      seqs.push_back(c.write_seq);
    }
    queue_.clear();
    for (uint64_t seq : seqs) {
      auto it = writes_.find(seq);
      if (it == writes_.end()) continue;
      it->second.dropped = true;
      if (it->second.error.ok()) it->second.error = Canceled("ucx_staged: endpoint destroyed");
      MaybeFinishLocked(it);
    }
  }
  cv_.notify_all();
  const Deadline deadline = DeadlineAfterMs(context->options.close_timeout_ms);
  bool drained = false;
  bool said_hello = false;
  Status link;           // the link's state when the wait ended
  size_t unfinished = 0;  // writes not done then
  {
    auto lock = LockFromOutside();
    drained = cv_.wait_until(lock, deadline, [&] {
      return !status_.ok() || (writes_.empty() && in_flight_bufs_ == 0 && notes_.empty());
    });
    drained = drained && status_.ok();
    said_hello = hello_sent;
    link = status_;
    unfinished = writes_.size();
  }
  if (drained && said_hello && inner_ep) {
    // The peer must forget us (also when we never wrote past the hello).
    WriteRequest wr;
    wr.local = send_reg.get();
    wr.remote_region = 0;
    wr.notify = true;
    wr.notification = Msg(kBye, conn_id, int32_t(conn_id));
    auto h = inner_ep->Write(wr);
    if (h.ok()) {
      // Without a pipeline thread (Connect() failed) nothing watches the peer: wait briefly.
      const Deadline ack_deadline = thread_.joinable() ? deadline : std::min(deadline, DeadlineAfterMs(1000));
      auto lock = LockFromOutside();
      cv_.wait_until(lock, ack_deadline, [&] { return bye_acked_ || !status_.ok(); });
      if (!bye_acked_) {
        KV_LOG_WARN << "ucx_staged: closing endpoint " << conn_id << ": the receiver did not "
                    << "acknowledge the goodbye in time; closing anyway (the receiver frees this "
                    << "writer's staging slots when it sees the connection close)";
      }
    }
  } else if (!drained && said_hello) {
    if (!link.ok()) {
      KV_LOG_WARN << "ucx_staged: closing endpoint " << conn_id << " after its link failed ("
                  << link.ToString() << "): " << unfinished
                  << " unfinished write(s) end kCanceled, no goodbye is sent";
    } else {
      KV_LOG_WARN << "ucx_staged: closing endpoint " << conn_id << " with " << unfinished
                  << " write(s) still running after close_timeout_ms ("
                  << context->options.close_timeout_ms << " ms): they end kCanceled, nothing of them lands "
                  << "once this close returns, and no goodbye is sent (the receiver reclaims this "
                  << "writer's staging slots when the connection closes)";
    }
  }
  {
    auto lock = LockFromOutside();
    stop_ = true;
    if (status_.ok()) status_ = Canceled("ucx_staged: endpoint destroyed");
    for (auto& [seq, e] : writes_) e.completion->Complete(Canceled("ucx_staged: endpoint destroyed"));
    writes_.clear();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  {
    std::lock_guard<std::mutex> lock(context->router_mu);
    context->writers.erase(conn_id);
  }
  if (stream) (void)cuda::WaitStreamIdle(stream->get(), DeadlineAfterMs(5000));
  if (kernel_stream) (void)cuda::WaitStreamIdle(kernel_stream->get(), DeadlineAfterMs(5000));
  if (ping_) (void)ping_->Wait(DeadlineAfterMs(1000));
  for (auto& h : notes_) (void)h->Wait(DeadlineAfterMs(1000));
  for (auto& h : misc_) (void)h->Wait(DeadlineAfterMs(1000));
  if (hello_handle_) (void)hello_handle_->Wait(DeadlineAfterMs(1000));
  for (SendBuf& b : bufs_) {
    context->events.Release(b.event);
    context->events.Release(b.dep);
    if (b.put) (void)b.put->Wait(DeadlineAfterMs(1000));
  }
  UnmapPeer();
  inner_ep.reset();
}

void StagedWriter::UnmapPeer() {
  if (peer_map_registered) {
    DeviceGuard guard(context->device);
    cudaError_t err = cudaHostUnregister(peer_map->data());
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      KV_LOG_WARN << "ucx_staged: cudaHostUnregister of the peer's staging area: " << cudaGetErrorString(err);
    }
    peer_map_registered = false;
  }
  peer_map.reset();
}

void StagedWriter::MaybeFinishLocked(std::map<uint64_t, WriteEntry>::iterator it) {
  WriteEntry& e = it->second;
  if (e.in_flight > 0) return;
  if (!e.delivered) {
    if (!e.dropped && e.error.ok() && !e.completion->done()) return;  // chunks still queued
    e.completion->Complete(e.error.ok() ? Canceled("ucx_staged: write canceled") : e.error);
    if (e.started > 0 && status_.ok() && inner_ep) {
      WriteRequest wr;
      wr.local = send_reg.get();
      wr.remote_region = 0;
      wr.notify = true;
      wr.notification = Msg(kAbandon, it->first, int32_t(conn_id));
      auto h = inner_ep->Write(wr);
      if (h.ok()) misc_.push_back(std::move(h).value());
    }
  }
  writes_.erase(it);
}

void StagedWriter::FailAllLocked(const Status& s) {
  if (status_.ok()) {
    status_ = s;
    KV_LOG_WARN << "ucx_staged: endpoint failed: " << s.ToString();
  }
  for (auto& [seq, e] : writes_) e.completion->Complete(s);
  writes_.clear();
  for (Chunk& c : queue_) context->events.Release(c.dep);
  queue_.clear();
  awaiting_.clear();  // the peer will not hand these slots back (and may be unmapped soon)
}

void StagedWriter::ChunkFailedLocked(SendBuf& b, const Status& s) {
  credits_.push_back(b.slot);
  auto it = writes_.find(b.chunk.write_seq);
  if (it != writes_.end()) {
    if (it->second.in_flight > 0) --it->second.in_flight;
    if (it->second.error.ok()) it->second.error = s;
    MaybeFinishLocked(it);
  }
}

Result<std::unique_ptr<WriteHandle>> StagedWriter::Write(const WriteRequest& req) {
  KV_RETURN_IF_ERROR(internal::CheckRequestShape(req, remote.size()).WithContext("ucx_staged Write"));
  const auto* local = dynamic_cast<const StagedRegistration*>(req.local);
  if (local == nullptr) {
    return InvalidArgument("ucx_staged Write: local registration is not from a ucx_staged transport");
  }
  const RegionInfo& target = remote[size_t(req.remote_region)];
  auto planned = internal::PlanWrite(req.ops, local->region().length, target.length);
  if (!planned.ok()) return planned.status().WithContext("ucx_staged Write");
  const internal::WritePlan plan = std::move(planned).value();
  {
    auto lock = LockFromOutside();
    if (!status_.ok()) return status_;
  }
  const uint64_t local_base = reinterpret_cast<uint64_t>(local->region().addr);
  auto completion = std::make_shared<WriteCompletion>(plan.bytes, plan.runs.size());
  std::vector<Chunk> chunks(1);
  uint64_t queued = 0;  // bytes ahead of this write that have not started
  {
    auto lock = LockFromOutside();
    for (const Chunk& c : queue_) queued += c.bytes;
  }
  uint64_t cap = AdaptiveChunkBytes(queued, plan.bytes, context->options.adaptive_chunk_fill, chunk_cap);
  if (const int m = context->options.min_chunks_per_write; m > 1) {
    constexpr uint64_t kMinChunk = 1 << 20, kAlign = 64 << 10;
    const uint64_t want = (plan.bytes / uint64_t(m) + kAlign - 1) / kAlign * kAlign;
    cap = std::min(cap, std::max(kMinChunk, want));
  }
  for (const internal::Run& run : plan.runs) {
    uint64_t src = local_base + run.local_offset, dst = run.remote_offset, len = run.length;
    while (len > 0) {
      if (chunks.back().bytes == cap || chunks.back().pieces.size() == kMaxPieces) chunks.emplace_back();
      Chunk& c = chunks.back();
      uint64_t take = std::min(cap - c.bytes, len);
      c.pieces.push_back({src, uint32_t(target.addr), dst, c.bytes, take});
      c.bytes += take;
      src += take;
      dst += take;
      len -= take;
    }
  }
  cudaEvent_t dep = nullptr;
  if (req.after_stream != nullptr) {
    DeviceGuard guard(context->device);
    KV_RETURN_IF_ERROR(guard.status());
    KV_ASSIGN_OR_RETURN(dep, context->events.Acquire());
    cudaError_t err = cudaEventRecord(dep, static_cast<cudaStream_t>(req.after_stream));
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      context->events.Release(dep);
      return InvalidArgument(std::string("ucx_staged Write: after_stream is not usable: ") +
                             cudaGetErrorName(err));
    }
  }
  {
    auto lock = LockFromOutside();
    if (!status_.ok() || shut_down_) {
      context->events.Release(dep);
      return status_.ok() ? Canceled("ucx_staged: endpoint closing") : status_;
    }
    const uint64_t seq = next_seq_++;
    for (size_t i = 0; i < chunks.size(); ++i) {
      Chunk& c = chunks[i];
      c.write_seq = seq;
      c.index = uint32_t(i);
      c.total = uint32_t(chunks.size());
      c.has_note = req.notify && i + 1 == chunks.size();
      c.note = req.notification;
      if (i == 0) c.dep = dep;
      queue_.push_back(std::move(c));
    }
    writes_[seq].completion = completion;
    if (thread_.joinable()) {
      DeviceGuard guard(context->device);
      if (guard.status().ok()) (void)StartQueuedLocked(1);
    }
  }
  cv_.notify_all();
  return std::unique_ptr<WriteHandle>(new CompletionHandle(std::move(completion)));
}

Result<std::unique_ptr<Endpoint>> ConnectWriter(const std::shared_ptr<StagedContext>& context,
                                                const PeerDescriptor& peer) {
  StagedContext& s = *context;
  KV_ASSIGN_OR_RETURN(StagedAddress address, DecodeAddress(peer.address));
  const StagingArea& a = address.area;
  auto writer = std::make_shared<StagedWriter>();
  writer->context = context;
  writer->peer = a;
  for (size_t i = 0; i < peer.regions.size(); ++i) {
    KV_ASSIGN_OR_RETURN(StagedKey k, DecodeKey(peer.regions[i].key, i));
    writer->remote.push_back({k.region_id, k.length});
  }
  PeerDescriptor inner_peer;
  inner_peer.address = address.inner_address;
  inner_peer.regions.push_back({a.staging_addr, a.staging_len, address.staging_key});
  KV_ASSIGN_OR_RETURN(writer->inner_ep, s.inner->Connect(inner_peer));
  const int nbufs = std::max(1, s.options.send_buffers);
  // Our chunks must fit the peer's slots.
  const uint64_t chunk = std::min<uint64_t>(s.options.chunk_bytes, a.chunk_bytes);
  writer->buf_stride = kHeaderBytes + chunk;
  writer->chunk_cap = chunk;
  ChooseZeroCopy(s, *writer);
  // Zero-copy needs no send buffers: the pinned area only carries the hello record.
  const uint64_t send_len = writer->zero_copy ? kMailboxBytes : writer->buf_stride * nbufs;
  KV_ASSIGN_OR_RETURN(writer->send_staging, cuda::PinnedBuffer::Allocate(send_len));
  KV_ASSIGN_OR_RETURN(writer->send_reg, s.inner->Register({writer->send_staging->data(), send_len,
                                                         MemoryKind::kHost, -1}));
  KV_ASSIGN_OR_RETURN(writer->tables, cuda::PinnedBuffer::Allocate(size_t(nbufs) * kTableEntriesPerSlot * sizeof(CopyRun)));
  KV_ASSIGN_OR_RETURN(writer->stream, cuda::Stream::CreateLowestPriority(s.device));
  KV_ASSIGN_OR_RETURN(writer->kernel_stream, cuda::Stream::CreateLowestPriority(s.device));
  writer->lanes.copy = writer->stream->get();
  writer->lanes.kernel = writer->kernel_stream ? writer->kernel_stream->get() : writer->lanes.copy;
  writer->lanes.events = &s.events;
  KV_ASSIGN_OR_RETURN(writer->scratch, cuda::DeviceBuffer::Allocate(s.device, size_t(nbufs) * chunk));
  static std::mt19937_64 rng(std::random_device{}());
  static std::mutex rng_mu;
  uint64_t nonce;
  uint32_t mailbox;
  {
    std::lock_guard<std::mutex> lock(rng_mu);
    nonce = rng();
    mailbox = uint32_t(rng() % a.mailboxes);
    std::lock_guard<std::mutex> rlock(s.router_mu);
    do {
      writer->conn_id = uint32_t(rng());
    } while (writer->conn_id == 0 || s.writers.count(writer->conn_id));
    s.writers[writer->conn_id] = writer;
  }
  // Hello: who we are and our ticket, into a peer mailbox. It goes at the first write: the
  // inner connection is made then, once the peer admitted its ticket (Endpoint::AdmissionTicket).
  Hello h;
  h.head.nonce = nonce;
  h.head.conn_id = writer->conn_id;
  h.head.writer_pid = writer->zero_copy ? uint32_t(getpid()) : 0;
  h.head.flags = writer->doorbells ? kHelloDoorbells : 0;
  h.ticket = writer->inner_ep->AdmissionTicket();
  const std::string record = EncodeHello(h);
  if (record.size() > kMailboxBytes) {
    return Internal("ucx_staged: our admission ticket does not fit a hello mailbox");
  }
  std::memcpy(writer->send_staging->data(), record.data(), record.size());
  writer->hello.local = writer->send_reg.get();
  writer->hello.remote_region = 0;
  writer->hello.ops.push_back({0, uint64_t(mailbox) * kMailboxBytes, record.size()});
  writer->hello.notify = true;
  writer->hello.notification = Msg(kHello, nonce, int32_t(mailbox));
  writer->Start(nbufs);
  return std::unique_ptr<Endpoint>(new StagedEndpoint(std::move(writer)));
}

std::string EndpointPath(const Endpoint& endpoint) {
  const auto* ep = dynamic_cast<const StagedEndpoint*>(&endpoint);
  if (ep == nullptr) return "";
  return ep->zero_copy() ? "zero_copy" : "ucx_put";
}

}  // namespace kvstream::transport::staged
