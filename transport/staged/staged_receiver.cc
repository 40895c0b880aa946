// The host-staged transport's receive side (transport/staged/): one thread per transport. It
// takes the writers' hellos (connecting back to each for credits), copies each announced chunk
// from its staging slot to the device (lowest-priority stream), hands the slot back as a credit,
// calls the NotificationSink once a write's last chunk is on the device, and reclaims the slots
// of writers that are lost (slot_ledger.h).
#include <sys/prctl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "common/log.h"
#include "transport/core/peer_process.h"
#include "transport/staged/slot_ledger.h"
#include "transport/staged/staged_chunk_copy.h"
#include "transport/staged/staged_context.h"
#include "transport/ucx/ucx_transport.h"

namespace kvstream::transport::staged {
namespace {

using cuda::CopyRun;
using cuda::CudaStatus;
using cuda::DeviceGuard;

class ReceiverThread final : public StagedReceiver {
 public:
  explicit ReceiverThread(StagedContext* context)
      : context_(context),
        ledger_(uint32_t(context->options.recv_slots), uint32_t(context->options.credits_per_peer),
                std::chrono::milliseconds(context->options.reclaim_quarantine_ms)) {}
  ~ReceiverThread() override { Stop(); }

  Status Start() {
    KV_ASSIGN_OR_RETURN(stream_, cuda::Stream::CreateLowestPriority(context_->device));
    KV_ASSIGN_OR_RETURN(kernel_stream_, cuda::Stream::CreateLowestPriority(context_->device));
    lanes_.copy = stream_->get();
    lanes_.kernel = kernel_stream_ ? kernel_stream_->get() : lanes_.copy;
    lanes_.events = &context_->events;
    KV_ASSIGN_OR_RETURN(scratch_, cuda::DeviceBuffer::Allocate(
                                      context_->device, size_t(context_->options.recv_slots) *
                                                           context_->options.chunk_bytes));
    thread_ = std::thread([this] { Run(); });
    return OkStatus();
  }

  void Stop() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      stop_ = true;
      posted_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    if (stream_) (void)cuda::WaitStreamIdle(stream_->get(), DeadlineAfterMs(5000));
    if (kernel_stream_) (void)cuda::WaitStreamIdle(kernel_stream_->get(), DeadlineAfterMs(5000));
    conns_.clear();
    pending_sends_.clear();
    closing_.clear();
    stream_.reset();
    kernel_stream_.reset();
    scratch_.reset();
  }

  void Post(const Notification& n) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      inbox_.push_back(n);
      posted_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
  }

 private:
  struct Conn {
    std::unique_ptr<Endpoint> back;
    // Per write (write_seq): chunks on the device, and its notification once the chunk that
    // carries it (the last one) has arrived. Chunks may land in any order.
    struct Progress {
      uint32_t landed = 0;
      bool has_note = false;
      Notification note;
    };
    std::map<uint64_t, Progress> progress;
    internal::PeerProcess writer_process;   // zero-copy writer's process (same host)
    bool doorbells = false;                 // announces and gets slots back through doorbells
    Clock::time_point last_sent{};
    bool lost = false;
  };
  struct Item {
    bool bye = false;
    uint32_t conn_id = 0;
    uint32_t slot = 0;
    uint64_t token = 0;  // doorbell chunks
    bool doorbell = false;
    uint64_t write_seq = 0;
    uint32_t total = 0;
    bool has_note = false;
    Notification note;
    cudaEvent_t event = nullptr;
    Status error;  // a rejected chunk: no copy, error credit
  };
  struct PendingSend {
    uint32_t conn_id;
    std::unique_ptr<WriteHandle> handle;
  };

  void Send(uint32_t conn_id, Conn& c, const Notification& n) {
    if (c.lost) return;
    WriteRequest wr;
    wr.local = context_->staging_reg.get();
    wr.remote_region = 0;
    wr.notify = true;
    wr.notification = n;
    auto h = c.back->Write(wr);
    if (!h.ok()) {
      Lose(conn_id, c, h.status());
      return;
    }
    c.last_sent = Clock::now();
    pending_sends_.push_back({conn_id, std::move(h).value()});
  }

  void SendGrants(const std::vector<SlotLedger::Grant>& grants) {
    for (const SlotLedger::Grant& g : grants) {
      auto it = conns_.find(g.writer);
      if (it != conns_.end()) Send(g.writer, it->second, Msg(kCredit, uint64_t(g.slot), int32_t(g.writer)));
    }
  }

  // A writer gone without a goodbye: drop its chunks from now on; its slots come back through
  // the ledger once idle and safe.
  void Lose(uint32_t conn_id, Conn& c, const Status& why) {
    if (c.lost) return;
    c.lost = true;
    c.progress.clear();
    ledger_.MarkLost(conn_id, Clock::now());
    KV_LOG_WARN << "ucx_staged: writer " << conn_id << " lost (" << why.ToString() << "); its "
                << ledger_.held(conn_id) << " staging slots return once idle and "
                << (c.writer_process.valid() ? "its process has exited" : "the quarantine has passed")
                << " (at most " << context_->options.reclaim_quarantine_ms << " ms)";
  }

  void HandleHello(const Notification& n) {
    uint32_t box = uint32_t(n.layer);
    if (box >= kMailboxes) return;
    const char* rec = context_->staging + context_->MailboxOffset(box);
    auto hello = DecodeHello(std::string_view(rec, kMailboxBytes));
    if (!hello.ok() || hello->head.nonce != n.request_id || hello->head.conn_id == 0) {
      KV_LOG_WARN << "ucx_staged: ignoring a malformed or overwritten hello in mailbox " << box;
      return;
    }
    const HelloHead& h = hello->head;
    if (conns_.count(h.conn_id) || ledger_.known(h.conn_id)) {
      KV_LOG_WARN << "ucx_staged: hello from an already known connection id " << h.conn_id;
      return;
    }
    // Credits go back over the connection the writer's hello came through (admitted here for
    // its ticket): the writer accepts no connection of ours.
    auto ep = ucx::ReplyEndpoint(*context_->inner, hello->ticket);
    if (!ep.ok()) {
      KV_LOG_WARN << "ucx_staged: cannot answer writer " << h.conn_id << ": "
                  << ep.status().ToString();
      return;
    }
    Conn& c = conns_[h.conn_id];
    c.back = std::move(ep).value();
    c.last_sent = Clock::now();
    c.doorbells = h.writer_pid != 0 && (h.flags & kHelloDoorbells) != 0;
    if (h.writer_pid != 0) {
      // A zero-copy writer copies straight into our slots: once it is lost, its process having
      // exited is what makes its slots safe to hand out again (no copy of it can still land).
      c.writer_process = internal::PeerProcess(static_cast<pid_t>(h.writer_pid));
    }
    for (uint32_t slot : ledger_.AddWriter(h.conn_id)) {
      Send(h.conn_id, c, Msg(kCredit, uint64_t(slot), int32_t(h.conn_id)));
    }
  }

  Status ParseChunk(uint32_t conn_id, uint32_t slot, Item* item, std::vector<CopyRun>* runs,
                    uint64_t* data_bytes) {
    const char* base = context_->staging + context_->SlotOffset(slot);
    ChunkWire cw;
    std::memcpy(&cw, base, sizeof(cw));
    if (std::memcmp(cw.magic, kChunkMagic, sizeof(cw.magic)) != 0 || cw.conn_id != conn_id ||
        cw.token != item->token) {
      return DataLoss("ucx_staged: chunk descriptor in slot " + std::to_string(slot) + " is corrupt");
    }
    item->write_seq = cw.write_seq;
    item->total = cw.total_chunks;
    item->has_note = cw.has_note != 0;
    item->note = Notification{cw.note_request, cw.note_layer, cw.note_flags};
    std::memcpy(item->note.mac.data(), cw.note_mac, sizeof(cw.note_mac));
    if (cw.npieces > kMaxPieces || cw.data_bytes > context_->options.chunk_bytes ||
        cw.total_chunks == 0 || cw.chunk_index >= cw.total_chunks) {
      return DataLoss("ucx_staged: chunk descriptor out of range");
    }
    const uint64_t data = reinterpret_cast<uint64_t>(base) + kHeaderBytes;
    *data_bytes = cw.data_bytes;
    std::lock_guard<std::mutex> lock(context_->regions_mu);
    for (uint32_t i = 0; i < cw.npieces; ++i) {
      PieceWire p;
      std::memcpy(&p, base + sizeof(cw) + i * sizeof(PieceWire), sizeof(p));
      auto it = context_->regions.find(p.region_id);
      if (it == context_->regions.end()) {
        return InvalidArgument("ucx_staged: chunk names region " + std::to_string(p.region_id) +
                               ", which is not registered (any more)");
      }
      const RegionInfo& r = it->second;
      if (p.dst_offset > r.length || p.length > r.length - p.dst_offset ||
          p.staging_offset > cw.data_bytes || p.length > cw.data_bytes - p.staging_offset) {
        return InvalidArgument("ucx_staged: chunk piece out of bounds");
      }
      if (p.length == 0) continue;
      runs->push_back({data + p.staging_offset, r.addr + p.dst_offset, p.length});
    }
    return OkStatus();
  }

  // A UCX announcement. From a doorbell writer it only wakes us: the doorbells say which
  // chunks are ready (this one, and maybe others; a late announcement finds its doorbell seen).
  void HandleChunk(const Notification& n) {
    uint32_t conn_id = uint32_t(n.request_id >> 32);
    uint32_t slot = uint32_t(n.request_id & 0xFFFFFFFFu);
    auto it = conns_.find(conn_id);
    if (it != conns_.end() && it->second.doorbells) {
      ScanDoorbells();
      return;
    }
    StartChunk(conn_id, slot, 0);
  }

  // Chunks whose ready doorbell shows a token not seen before, in the order their writer rang
  // them (its copies started in that order: a later write to the same bytes lands last).
  void ScanDoorbells() {
    std::vector<std::pair<uint64_t, uint32_t>> ready;  // (token, slot)
    for (uint32_t slot = 0; slot < seen_.size(); ++slot) {
      const uint64_t t = LoadWord(context_->staging + context_->SlotOffset(slot) + kReadyOffset);
      if (t == 0 || t == seen_[slot]) continue;
      seen_[slot] = t;
      auto it = conns_.find(uint32_t(t >> 32));
      // Not a live doorbell writer's: a writer gone (or lost) rang it; not ours to copy.
      if (it == conns_.end() || !it->second.doorbells || it->second.lost) continue;
      ready.push_back({t, slot});
    }
    std::sort(ready.begin(), ready.end());
    for (const auto& [t, slot] : ready) StartChunk(uint32_t(t >> 32), slot, t);
  }

  void StartChunk(uint32_t conn_id, uint32_t slot, uint64_t token) {
    auto it = conns_.find(conn_id);
    if (it == conns_.end() || !ledger_.BeginChunk(conn_id, slot)) {
      if (it == conns_.end() || !it->second.lost) {
        KV_LOG_WARN << "ucx_staged: dropping a chunk of unknown connection " << conn_id << " slot " << slot;
      }
      return;
    }
    last_chunk_ = Clock::now();
    Item item;
    item.conn_id = conn_id;
    item.slot = slot;
    item.token = token;
    item.doorbell = it->second.doorbells;
    std::vector<CopyRun> runs;
    uint64_t data_bytes = 0;
    item.error = ParseChunk(conn_id, slot, &item, &runs, &data_bytes);
    if (item.error.ok()) {
      CopyRun* table = static_cast<CopyRun*>(context_->recv_tables->data()) + size_t(slot) * kTableEntriesPerSlot;
      const uint64_t staging = reinterpret_cast<uint64_t>(context_->staging) + context_->SlotOffset(slot) + kHeaderBytes;
      void* scratch = static_cast<char*>(scratch_->data()) + size_t(slot) * context_->options.chunk_bytes;
      auto done_on = CopyChunk(Direction::kToDevice, runs, staging, data_bytes, scratch, table,
                               kTableEntriesPerSlot, lanes_);
      Status s = done_on.status();
      auto ev = context_->events.Acquire();
      if (s.ok() && ev.ok()) {
        item.event = ev.value();
        s = CudaStatus(cudaEventRecord(item.event, done_on.value()), "cudaEventRecord");
      } else if (s.ok()) {
        s = ev.status();
      } else if (ev.ok()) {
        context_->events.Release(ev.value());
      }
      item.error = s;
    }
    inflight_.push_back(std::move(item));
  }

  void Complete(Item& item) {
    auto it = conns_.find(item.conn_id);
    if (item.bye) {
      if (it == conns_.end()) return;
      Conn c = std::move(it->second);
      conns_.erase(it);
      // Every chunk it sent before the goodbye has ended (the items run in order).
      std::vector<SlotLedger::Grant> grants = ledger_.RemoveWriter(item.conn_id);
      c.lost = false;  // the goodbye's acknowledgement still goes out
      Send(item.conn_id, c, Msg(kByeAck, item.conn_id, int32_t(item.conn_id)));
      closing_.push_back(std::move(c.back));  // kept until the ack has gone out
      SendGrants(grants);
      return;
    }
    const bool credit = ledger_.EndChunk(item.slot);
    if (it == conns_.end() || it->second.lost || !credit) return;
    Conn& c = it->second;
    int32_t bits = 0;
    if (!item.error.ok()) {
      KV_LOG_WARN << "ucx_staged: rejecting a chunk: " << item.error.ToString();
      c.progress.erase(item.write_seq);
      bits = kBitError;
    } else {
      Conn::Progress& p = c.progress[item.write_seq];
      if (item.has_note) {
        p.has_note = true;
        p.note = item.note;
      }
      if (++p.landed == item.total) {
        if (p.has_note) {
          std::lock_guard<std::mutex> lock(context_->sink_mu);
          if (context_->sink) context_->sink(p.note);
        }
        c.progress.erase(item.write_seq);
        bits = kBitWriteDone;
      }
    }
    if (item.doorbell) {
      // The slot goes back to its writer through its done doorbell (it polls it).
      char* hdr = context_->staging + context_->SlotOffset(item.slot);
      DoneWire d{};
      d.write_seq = item.write_seq;
      d.bits = bits;
      std::memcpy(hdr + kDoneOffset, &d, offsetof(DoneWire, token));
      StoreWord(hdr + kDoneOffset + offsetof(DoneWire, token), item.token);
      last_chunk_ = Clock::now();
      return;
    }
    Send(item.conn_id, c, Msg(kCredit, (item.write_seq << 16) | item.slot, int32_t(item.conn_id), bits));
  }

  // Lost writers: noticed through their failed connection back or a failed send; pinged when
  // idle so that silence becomes a failed send. Their slots go back through the ledger.
  void Housekeep() {
    const auto now = Clock::now();
    for (auto& [id, c] : conns_) {
      if (c.lost) continue;
      Status s = c.back->status();
      if (!s.ok()) {
        Lose(id, c, s);
      } else if (ledger_.held(id) > 0 &&
                 now - c.last_sent > std::chrono::milliseconds(context_->options.writer_ping_ms)) {
        Send(id, c, Msg(kPing, id, int32_t(id)));
      }
    }
    for (auto it = pending_sends_.begin(); it != pending_sends_.end();) {
      if (!it->handle->Done()) {
        ++it;
        continue;
      }
      Status s = it->handle->Wait(now);
      if (!s.ok()) {
        auto c = conns_.find(it->conn_id);
        if (c != conns_.end()) Lose(it->conn_id, c->second, s);
      }
      it = pending_sends_.erase(it);
    }
    SendGrants(ledger_.Reclaim(now, [this](uint32_t id) {
      auto it = conns_.find(id);
      return it != conns_.end() && it->second.writer_process.Exited();
    }));
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (it->second.lost && !ledger_.known(it->first)) {
        KV_LOG_INFO << "ucx_staged: lost writer " << it->first << "'s staging slots are free again ("
                    << ledger_.free_slots() << " free)";
        closing_.push_back(std::move(it->second.back));
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void Run() {
    DeviceGuard guard(context_->device);
    // The short waits below pace the pipeline: keep them short, not + 50 us of default slack.
    (void)::prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    auto last_housekeeping = Clock::now();
    for (;;) {
      std::deque<Notification> inbox;
      // Doorbell writers are polled for a while after the last chunk (the next layer's write
      // usually follows); after that their UCX announcements wake us.
      const bool idle = inflight_.empty() && pending_sends_.empty() && closing_.empty() &&
                        Clock::now() - last_chunk_ > std::chrono::milliseconds(2);
      if (!idle && poll_us_ == 0) {
        // Busy wait: mu_ only when something was posted, so the poster never waits for us.
        SpinPause();
        if (posted_.load(std::memory_order_acquire)) {
          std::lock_guard<std::mutex> lock(mu_);
          if (stop_) break;
          posted_.store(false, std::memory_order_relaxed);
          inbox.swap(inbox_);
        }
      } else {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, idle ? std::chrono::microseconds(50000) : std::chrono::microseconds(poll_us_),
                     [&] { return stop_ || !inbox_.empty(); });
        if (stop_) break;
        posted_.store(false, std::memory_order_relaxed);
        inbox.swap(inbox_);
      }
      for (const Notification& n : inbox) {
        switch (n.flags & 0xFF) {
          case kHello: HandleHello(n); break;
          case kChunk: HandleChunk(n); break;
          case kBye: {
            Item bye;
            bye.bye = true;
            bye.conn_id = uint32_t(n.request_id);
            inflight_.push_back(std::move(bye));
            break;
          }
          case kAbandon: {
            // Sent once every started chunk of that write came back: none is in flight here.
            auto it = conns_.find(uint32_t(n.layer));
            if (it != conns_.end()) it->second.progress.erase(n.request_id);
            break;
          }
          default: break;
        }
      }
      ScanDoorbells();
      // One in-order stream: complete items from the front as their copies finish.
      while (!inflight_.empty()) {
        Item& front = inflight_.front();
        if (front.event != nullptr) {
          cudaError_t err = cudaEventQuery(front.event);
          if (err == cudaErrorNotReady) break;
          if (err != cudaSuccess && front.error.ok()) front.error = CudaStatus(err, "staging copy");
          context_->events.Release(front.event);
          front.event = nullptr;
        }
        Item item = std::move(front);
        inflight_.pop_front();
        Complete(item);
      }
      const auto now = Clock::now();
      if (now - last_housekeeping > std::chrono::milliseconds(5)) {
        last_housekeeping = now;
        Housekeep();
      }
      pending_sends_.erase(std::remove_if(pending_sends_.begin(), pending_sends_.end(),
                                          [](const PendingSend& p) {
                                            // Failed sends are left for Housekeep to see.
                                            return p.handle->Done() && p.handle->Wait(Clock::now()).ok();
                                          }),
                           pending_sends_.end());
      if (pending_sends_.empty()) closing_.clear();
    }
  }

  StagedContext* context_;
  const int64_t poll_us_ = std::clamp<int64_t>(context_->options.poll_us, 0, 1000);
  std::atomic<bool> posted_{false};  // inbox_ (or stop_) changed since the thread last looked
  // Per slot: the last ready token seen.
  std::vector<uint64_t> seen_ = std::vector<uint64_t>(size_t(context_->options.recv_slots), 0);
  Clock::time_point last_chunk_{};
  SlotLedger ledger_;  // receiver thread only
  std::unique_ptr<cuda::Stream> stream_;         // host -> device copies
  std::unique_ptr<cuda::Stream> kernel_stream_;  // scatter kernels
  Lanes lanes_;
  std::unique_ptr<cuda::DeviceBuffer> scratch_;  // chunk_bytes per slot
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::deque<Notification> inbox_;
  std::thread thread_;
  // Owned by the thread:
  std::map<uint32_t, Conn> conns_;
  std::deque<Item> inflight_;
  std::vector<PendingSend> pending_sends_;
  std::vector<std::unique_ptr<Endpoint>> closing_;
};

}  // namespace

Result<std::shared_ptr<StagedReceiver>> StartReceiver(StagedContext* context) {
  auto receiver = std::make_shared<ReceiverThread>(context);
  KV_RETURN_IF_ERROR(receiver->Start());
  return std::shared_ptr<StagedReceiver>(std::move(receiver));
}

}  // namespace kvstream::transport::staged
