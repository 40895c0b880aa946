#include "transport/staged/staged_transport.h"

#include <poll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "common/log.h"
#include "transport/cuda_ipc/cuda_util.h"
#include "transport/cuda_ipc/scatter_copy.h"
#include "transport/staged/chunk_plan.h"
#include "transport/staged/slot_ledger.h"
#include "transport/ucx/ucx_transport.h"
#include "transport/write_plan.h"

namespace kvstream::transport::staged {
namespace {

using cuda::CopyRun;
using cuda::CudaStatus;
using cuda::DeviceGuard;
using internal::CompletionHandle;
using internal::WriteCompletion;

// ---- wire formats (same as the peer's build: versioned by the magics) -----------------------

// Protocol messages ride on the inner transport's notifications: flags = kMagic | type | bits.
constexpr int32_t kFlagMagic = 0x4B500000;
constexpr int32_t kFlagMagicMask = 0x7FF00000;
enum MsgType : int32_t {
  kHello = 1,
  kChunk = 2,
  kBye = 3,
  kCredit = 4,
  kByeAck = 5,
  kPing = 6,
  kAbandon = 7,  // writer -> receiver: forget the progress of write `request_id` (never finishes)
};
constexpr int32_t kBitWriteDone = 1 << 8;
constexpr int32_t kBitError = 1 << 9;

constexpr uint64_t kHeaderBytes = 64 * 1024;    // chunk descriptor area in front of each slot
constexpr uint64_t kMailboxBytes = 16 * 1024;   // one hello record
constexpr uint32_t kMailboxes = 16;
constexpr uint64_t kStagingAlign = 64 * 1024;   // staging area length rounded up to this

struct AddrWire {
  char magic[8];  // "KVSTGA02"
  uint64_t staging_addr;
  uint64_t staging_len;
  uint64_t chunk_bytes;
  uint64_t slot_stride;
  uint32_t slots;
  uint32_t mailboxes;
  uint32_t inner_addr_len;
  uint32_t staging_key_len;
};
struct HelloWire {
  char magic[8];  // "KVSTHL03"
  uint64_t nonce;
  uint32_t conn_id;
  uint32_t addr_len;
  uint32_t key_len;
  uint32_t writer_pid;  // != 0: a zero-copy writer on the receiver's host (its pid there)
  uint64_t box_addr;
  uint64_t box_len;
  uint32_t flags;       // kHelloDoorbells
  uint32_t pad;
};
// A zero-copy writer that rings doorbells (StagedOptions::doorbells).
constexpr uint32_t kHelloDoorbells = 1;
struct ChunkWire {
  char magic[8];  // "KVSTCK03"
  uint32_t conn_id;
  uint32_t npieces;
  uint64_t write_seq;
  uint32_t chunk_index;
  uint32_t total_chunks;
  uint32_t has_note;
  int32_t note_layer;
  uint64_t note_request;
  int32_t note_flags;
  uint32_t pad;
  uint64_t data_bytes;
  uint64_t token;  // doorbell writers: this chunk's token (0 otherwise)
};
// Doorbells (zero-copy writers that asked for them, see StagedOptions::doorbells): two words at
// the end of each slot's header area, in the receiver's staging memory that both map. The
// writer stores the chunk's token (conn_id << 32 | its own chunk counter, never 0) at
// kReadyOffset once the chunk's device -> host copy is complete; the receiver stores a DoneWire
// at kDoneOffset, token last, once the chunk is on its device (instead of a UCX credit). Both
// sides still poll only while chunks are in flight; the writer also sends the UCX announcement
// as a wake-up for a receiver that is idle.
constexpr uint64_t kReadyOffset = kHeaderBytes - 128;
constexpr uint64_t kDoneOffset = kHeaderBytes - 64;
struct DoneWire {
  uint64_t write_seq;
  int32_t bits;  // kBitWriteDone, kBitError
  uint32_t pad;
  uint64_t token;
};
struct PieceWire {
  uint32_t region_id;
  uint32_t pad;
  uint64_t dst_offset;
  uint64_t staging_offset;
  uint64_t length;
};
struct KeyWire {
  char magic[8];  // "KVSTRK01"
  uint32_t region_id;
  int32_t device;
  uint64_t length;
};
constexpr char kAddrMagic[8] = {'K', 'V', 'S', 'T', 'G', 'A', '0', '2'};
constexpr char kHelloMagic[8] = {'K', 'V', 'S', 'T', 'H', 'L', '0', '3'};
constexpr char kChunkMagic[8] = {'K', 'V', 'S', 'T', 'C', 'K', '0', '3'};
constexpr char kKeyMagic[8] = {'K', 'V', 'S', 'T', 'R', 'K', '0', '1'};
constexpr uint64_t kMaxPieces = (kReadyOffset - sizeof(ChunkWire)) / sizeof(PieceWire);

// Doorbell words live in memory another process writes: atomic, acquire / release.
uint64_t LoadWord(const char* p) {
  return __atomic_load_n(reinterpret_cast<const uint64_t*>(p), __ATOMIC_ACQUIRE);
}
void StoreWord(char* p, uint64_t v) {
  __atomic_store_n(reinterpret_cast<uint64_t*>(p), v, __ATOMIC_RELEASE);
}

// One step of a pipeline thread's busy wait (poll_us == 0): a short pause, then a chance for
// other threads on this core.
void SpinPause() {
#if defined(__x86_64__) || defined(__i386__)
  for (int i = 0; i < 16; ++i) __builtin_ia32_pause();
#endif
  std::this_thread::yield();
}

Notification Msg(MsgType type, uint64_t request_id, int32_t layer, int32_t bits = 0) {
  return Notification{request_id, layer, kFlagMagic | type | bits};
}

// Device -> pinned staging (writer) or pinned staging -> device (receiver) for one chunk.
// `runs` move between scattered device addresses and the chunk's contiguous staging bytes
// [0, bytes). Few runs: cudaMemcpyAsync each. Many: the copy engine moves the chunk in one
// piece between staging and a device scratch buffer, and the scatter kernel does the
// gathering / scattering device-side (its run table, `table`, is pinned and stays untouched
// until the stream passes it).
//
// Lanes: transfers go on `copy`, kernels on `kernel` (when it differs), so that one chunk's
// kernel runs while the copy engine moves the next chunk instead of between the two copies.
// The caller records the chunk's completion on the stream CopyChunk returns.
enum class Direction { kToHost, kToDevice };
struct Lanes {
  cudaStream_t copy = nullptr;
  cudaStream_t kernel = nullptr;  // == copy: one stream
  cuda::EventPool* events = nullptr;
  // Receive side: a scatter was enqueued on `kernel` since `copy` last waited for it. A chunk
  // copied straight to the device then waits for it first, so that writes still land in the
  // order they were announced (a later write to the same bytes wins).
  bool kernel_ahead = false;
};

// `to` waits for everything enqueued on `from` so far.
Status Follow(Lanes& lanes, cudaStream_t from, cudaStream_t to) {
  if (from == to) return OkStatus();
  KV_ASSIGN_OR_RETURN(cudaEvent_t ev, lanes.events->Acquire());
  cudaError_t err = cudaEventRecord(ev, from);
  if (err == cudaSuccess) err = cudaStreamWaitEvent(to, ev, 0);
  // The wait captured the record: the event may be recorded again by its next user.
  lanes.events->Release(ev);
  return CudaStatus(err, "cudaStreamWaitEvent (between the copy and kernel streams)");
}

Result<cudaStream_t> CopyChunk(Direction dir, const std::vector<CopyRun>& runs, uint64_t staging,
                               uint64_t bytes, void* scratch, CopyRun* table, size_t table_cap,
                               Lanes& lanes) {
  if (runs.size() >= 4 && scratch != nullptr) {
    // Re-aim the runs' staging side at the scratch buffer.
    std::vector<CopyRun> dev = runs;
    const uint64_t sc = reinterpret_cast<uint64_t>(scratch);
    for (CopyRun& r : dev) {
      if (dir == Direction::kToHost) r.dst = sc + (r.dst - staging);
      else r.src = sc + (r.src - staging);
    }
    size_t entries = cuda::ScatterTableEntries(dev.data(), dev.size());
    if (entries <= table_cap) {
      cuda::SplitRuns(dev.data(), dev.size(), table);
      if (dir == Direction::kToDevice) {
        KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(scratch, reinterpret_cast<const void*>(staging), bytes,
                                                cudaMemcpyHostToDevice, lanes.copy),
                                "cudaMemcpyAsync (staging to scratch)");
        KV_RETURN_IF_ERROR(Follow(lanes, lanes.copy, lanes.kernel));
        KV_RETURN_IF_ERROR(cuda::LaunchScatterCopy(table, entries, lanes.kernel));
        lanes.kernel_ahead = lanes.kernel != lanes.copy;
        return lanes.kernel;
      }
      KV_RETURN_IF_ERROR(cuda::LaunchScatterCopy(table, entries, lanes.kernel));
      KV_RETURN_IF_ERROR(Follow(lanes, lanes.kernel, lanes.copy));
      KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(reinterpret_cast<void*>(staging), scratch, bytes,
                                              cudaMemcpyDeviceToHost, lanes.copy),
                              "cudaMemcpyAsync (scratch to staging)");
      return lanes.copy;
    }
  }
  if (dir == Direction::kToDevice && lanes.kernel_ahead) {
    KV_RETURN_IF_ERROR(Follow(lanes, lanes.kernel, lanes.copy));
    lanes.kernel_ahead = false;
  }
  const cudaMemcpyKind kind = dir == Direction::kToHost ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
  for (const CopyRun& r : runs) {
    KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(reinterpret_cast<void*>(r.dst),
                                            reinterpret_cast<const void*>(r.src), r.length, kind,
                                            lanes.copy),
                            "cudaMemcpyAsync (staging)");
  }
  return lanes.copy;
}

constexpr size_t kTableEntriesPerSlot = 4096;  // >= pieces after splitting into 256 KiB pieces

// ---- shared state ----------------------------------------------------------------------------

struct RegionInfo {
  uint64_t addr = 0;
  uint64_t length = 0;
};

class WriterCore;
class Receiver;

struct Shared {
  StagedOptions options;
  int device = -1;
  std::unique_ptr<Transport> inner;
  cuda::EventPool events;
  explicit Shared(int dev) : device(dev), events(dev) {}
  ~Shared() {
    // Before the members below free or unmap the memory.
    if (staging_host_registered) (void)cudaHostUnregister(staging);
  }

  // Receive side. The staging area is the inner transport's Allocate()d memory (a memfd a
  // same-host writer maps) page-locked here, or, where that fails, cudaHostAlloc'd memory.
  std::unique_ptr<cuda::PinnedBuffer> staging_pinned;  // the fallback's memory
  std::unique_ptr<Registration> staging_reg;           // inner registration (owns Allocate()d memory)
  char* staging = nullptr;
  uint64_t staging_len = 0;
  bool staging_host_registered = false;  // cudaHostRegister'ed by us (Allocate()d memory)
  uint64_t slot_stride = 0;
  std::unique_ptr<cuda::PinnedBuffer> recv_tables;  // kTableEntriesPerSlot per slot
  std::mutex regions_mu;
  std::map<uint32_t, RegionInfo> regions;
  uint32_t next_region_id = 1;
  // Writer side: a small registered box the peers' credit endpoints connect to.
  std::vector<char> box;
  std::unique_ptr<Registration> box_reg;

  std::mutex sink_mu;
  NotificationSink sink;

  std::mutex router_mu;
  std::map<uint32_t, std::weak_ptr<WriterCore>> writers;  // by conn id
  std::shared_ptr<Receiver> receiver;

  uint64_t MailboxOffset(uint32_t i) const { return uint64_t(i) * kMailboxBytes; }
  uint64_t SlotOffset(uint32_t slot) const {
    return uint64_t(kMailboxes) * kMailboxBytes + uint64_t(slot) * slot_stride;
  }
  void OnInner(const Notification& n);
};

class StagedRegistration : public Registration {
 public:
  StagedRegistration(std::shared_ptr<Shared> shared, MemoryRegion region, uint32_t id)
      : shared_(std::move(shared)), region_(region), id_(id) {}
  ~StagedRegistration() override {
    std::lock_guard<std::mutex> lock(shared_->regions_mu);
    shared_->regions.erase(id_);
  }
  const MemoryRegion& region() const override { return region_; }
  std::string RemoteKey() const override {
    KeyWire k{};
    std::memcpy(k.magic, kKeyMagic, sizeof(k.magic));
    k.region_id = id_;
    k.device = region_.device;
    k.length = region_.length;
    return std::string(reinterpret_cast<const char*>(&k), sizeof(k));
  }

 private:
  std::shared_ptr<Shared> shared_;
  MemoryRegion region_;
  uint32_t id_;
};

bool ProcessExited(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

// ---- receive side: one thread per transport ---------------------------------------------------

class Receiver {
 public:
  explicit Receiver(Shared* shared)
      : shared_(shared),
        ledger_(uint32_t(shared->options.recv_slots), uint32_t(shared->options.credits_per_peer),
                std::chrono::milliseconds(shared->options.reclaim_quarantine_ms)) {}
  ~Receiver() { Stop(); }

  Status Start() {
    KV_ASSIGN_OR_RETURN(stream_, cuda::Stream::CreateLowestPriority(shared_->device));
    if (shared_->options.overlap_kernels) {
      KV_ASSIGN_OR_RETURN(kernel_stream_, cuda::Stream::CreateLowestPriority(shared_->device));
    }
    lanes_.copy = stream_->get();
    lanes_.kernel = kernel_stream_ ? kernel_stream_->get() : lanes_.copy;
    lanes_.events = &shared_->events;
    KV_ASSIGN_OR_RETURN(scratch_, cuda::DeviceBuffer::Allocate(
                                      shared_->device, size_t(shared_->options.recv_slots) *
                                                           shared_->options.chunk_bytes));
    thread_ = std::thread([this] { Run(); });
    return OkStatus();
  }

  void Stop() {
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
    for (auto& [id, c] : conns_) {
      if (c.pidfd >= 0) close(c.pidfd);
    }
    conns_.clear();
    pending_sends_.clear();
    closing_.clear();
    stream_.reset();
    kernel_stream_.reset();
    scratch_.reset();
  }

  void Post(const Notification& n) {
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
    int pidfd = -1;                         // zero-copy writer's process (same host)
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
    wr.local = shared_->staging_reg.get();
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
                << (c.pidfd >= 0 ? "its process has exited" : "the quarantine has passed")
                << " (at most " << shared_->options.reclaim_quarantine_ms << " ms)";
  }

  void HandleHello(const Notification& n) {
    uint32_t box = uint32_t(n.layer);
    if (box >= kMailboxes) return;
    const char* rec = shared_->staging + shared_->MailboxOffset(box);
    HelloWire h;
    std::memcpy(&h, rec, sizeof(h));
    if (std::memcmp(h.magic, kHelloMagic, sizeof(h.magic)) != 0 || h.nonce != n.request_id ||
        sizeof(h) + uint64_t(h.addr_len) + h.key_len > kMailboxBytes || h.conn_id == 0) {
      KV_LOG_WARN << "ucx_staged: ignoring a malformed or overwritten hello in mailbox " << box;
      return;
    }
    if (conns_.count(h.conn_id) || ledger_.known(h.conn_id)) {
      KV_LOG_WARN << "ucx_staged: hello from an already known connection id " << h.conn_id;
      return;
    }
    PeerDescriptor back;
    back.address.assign(rec + sizeof(h), h.addr_len);
    back.regions.push_back({h.box_addr, h.box_len, std::string(rec + sizeof(h) + h.addr_len, h.key_len)});
    auto ep = shared_->inner->Connect(back);
    if (!ep.ok()) {
      KV_LOG_WARN << "ucx_staged: cannot connect back to writer " << h.conn_id << ": "
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
      c.pidfd = static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(h.writer_pid), 0));
    }
    for (uint32_t slot : ledger_.AddWriter(h.conn_id)) {
      Send(h.conn_id, c, Msg(kCredit, uint64_t(slot), int32_t(h.conn_id)));
    }
  }

  Status ParseChunk(uint32_t conn_id, uint32_t slot, Item* item, std::vector<CopyRun>* runs,
                    uint64_t* data_bytes) {
    const char* base = shared_->staging + shared_->SlotOffset(slot);
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
    if (cw.npieces > kMaxPieces || cw.data_bytes > shared_->options.chunk_bytes ||
        cw.total_chunks == 0 || cw.chunk_index >= cw.total_chunks) {
      return DataLoss("ucx_staged: chunk descriptor out of range");
    }
    const uint64_t data = reinterpret_cast<uint64_t>(base) + kHeaderBytes;
    *data_bytes = cw.data_bytes;
    std::lock_guard<std::mutex> lock(shared_->regions_mu);
    for (uint32_t i = 0; i < cw.npieces; ++i) {
      PieceWire p;
      std::memcpy(&p, base + sizeof(cw) + i * sizeof(PieceWire), sizeof(p));
      auto it = shared_->regions.find(p.region_id);
      if (it == shared_->regions.end()) {
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
      const uint64_t t = LoadWord(shared_->staging + shared_->SlotOffset(slot) + kReadyOffset);
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
      CopyRun* table = static_cast<CopyRun*>(shared_->recv_tables->data()) + size_t(slot) * kTableEntriesPerSlot;
      const uint64_t staging = reinterpret_cast<uint64_t>(shared_->staging) + shared_->SlotOffset(slot) + kHeaderBytes;
      void* scratch = static_cast<char*>(scratch_->data()) + size_t(slot) * shared_->options.chunk_bytes;
      auto done_on = CopyChunk(Direction::kToDevice, runs, staging, data_bytes, scratch, table,
                               kTableEntriesPerSlot, lanes_);
      Status s = done_on.status();
      auto ev = shared_->events.Acquire();
      if (s.ok() && ev.ok()) {
        item.event = ev.value();
        s = CudaStatus(cudaEventRecord(item.event, done_on.value()), "cudaEventRecord");
      } else if (s.ok()) {
        s = ev.status();
      } else if (ev.ok()) {
        shared_->events.Release(ev.value());
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
      if (c.pidfd >= 0) close(c.pidfd);
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
          std::lock_guard<std::mutex> lock(shared_->sink_mu);
          if (shared_->sink) shared_->sink(p.note);
        }
        c.progress.erase(item.write_seq);
        bits = kBitWriteDone;
      }
    }
    if (item.doorbell) {
      // The slot goes back to its writer through its done doorbell (it polls it).
      char* hdr = shared_->staging + shared_->SlotOffset(item.slot);
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
                 now - c.last_sent > std::chrono::milliseconds(shared_->options.writer_ping_ms)) {
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
      return it != conns_.end() && it->second.pidfd >= 0 && ProcessExited(it->second.pidfd);
    }));
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (it->second.lost && !ledger_.known(it->first)) {
        KV_LOG_INFO << "ucx_staged: lost writer " << it->first << "'s staging slots are free again ("
                    << ledger_.free_slots() << " free)";
        if (it->second.pidfd >= 0) close(it->second.pidfd);
        closing_.push_back(std::move(it->second.back));
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void Run() {
    DeviceGuard guard(shared_->device);
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
          shared_->events.Release(front.event);
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

  Shared* shared_;
  const int64_t poll_us_ = std::clamp<int64_t>(shared_->options.poll_us, 0, 1000);
  std::atomic<bool> posted_{false};  // inbox_ (or stop_) changed since the thread last looked
  // Per slot: the last ready token seen.
  std::vector<uint64_t> seen_ = std::vector<uint64_t>(size_t(shared_->options.recv_slots), 0);
  Clock::time_point last_chunk_{};
  SlotLedger ledger_;  // receiver thread only
  std::unique_ptr<cuda::Stream> stream_;         // host -> device copies
  std::unique_ptr<cuda::Stream> kernel_stream_;  // scatter kernels (overlap_kernels)
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

// ---- send side: one pipeline thread per endpoint ---------------------------------------------

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
  std::shared_ptr<WriteCompletion> completion;
  uint32_t started = 0;    // chunks started
  uint32_t in_flight = 0;  // started and not yet handed back by the peer
  bool delivered = false;  // the peer reported every chunk on the device (completion OK)
  bool dropped = false;    // a chunk was not started (cancel, failure, shutdown)
  Status error;            // the first failure of one of its chunks
};

class WriterCore : public std::enable_shared_from_this<WriterCore> {
 public:
  std::shared_ptr<Shared> shared;
  uint32_t conn_id = 0;
  std::unique_ptr<Endpoint> inner_ep;
  std::unique_ptr<cuda::PinnedBuffer> send_staging;
  std::unique_ptr<Registration> send_reg;
  std::unique_ptr<cuda::PinnedBuffer> tables;  // kTableEntriesPerSlot per send buffer
  std::unique_ptr<cuda::DeviceBuffer> scratch;  // chunk_cap per send buffer
  std::unique_ptr<cuda::Stream> stream;         // device -> host copies
  std::unique_ptr<cuda::Stream> kernel_stream;  // gather kernels (overlap_kernels)
  Lanes lanes;
  std::vector<RegionInfo> remote;  // per peer region: id in `addr`, length
  AddrWire peer{};
  uint64_t buf_stride = 0;
  uint64_t chunk_cap = 0;  // data bytes per chunk: fits our buffers and the peer's slots
  // Zero-copy: the peer's staging area mapped here and page-locked by us.
  std::unique_ptr<ucx::PeerMapping> peer_map;
  bool peer_map_registered = false;
  bool zero_copy = false;
  bool doorbells = false;  // zero-copy, announcing and getting slots back through doorbells
  bool hello_sent = false;

  ~WriterCore() { Shutdown(); }

  void OnCredit(const Notification& n) {
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

  // Slot `slot` is ours again: a fresh grant (seq 0), or the peer is done with our chunk of
  // write `seq` (bits: kBitWriteDone, kBitError).
  void CreditBackLocked(uint32_t slot, uint64_t seq, int32_t bits) {
    credits_.push_back(slot);
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

  Status WaitFirstCredit(Deadline deadline) {
    auto lock = LockFromOutside();
    if (!cv_.wait_until(lock, deadline, [&] { return !credits_.empty(); })) {
      return Unavailable("ucx_staged: the peer granted no staging slot in time (hello lost?)");
    }
    return OkStatus();
  }

  void Start(int nbufs) {
    poll_us_ = std::clamp<int64_t>(shared->options.poll_us, 0, 1000);
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

  void Shutdown() {
    {
      auto lock = LockFromOutside();
      if (shut_down_) return;
      shut_down_ = true;
      // Queued chunks never start; their writes end (kCanceled) once their started chunks are back.
      std::vector<uint64_t> seqs;
      for (Chunk& c : queue_) {
        shared->events.Release(c.dep);
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
    const Deadline deadline = DeadlineAfterMs(shared->options.close_timeout_ms);
    bool drained = false;
    {
      auto lock = LockFromOutside();
      drained = cv_.wait_until(lock, deadline, [&] {
        return !status_.ok() || (writes_.empty() && in_flight_bufs_ == 0 && notes_.empty());
      });
      drained = drained && status_.ok();
    }
    if (drained && hello_sent && inner_ep) {
      // Also after a Connect() that got no slot in time: the peer must forget us.
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
          KV_LOG_WARN << "ucx_staged: peer did not acknowledge the goodbye";
        }
      }
    } else if (!drained && hello_sent) {
      KV_LOG_WARN << "ucx_staged: endpoint closing with writes still in flight";
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
      std::lock_guard<std::mutex> lock(shared->router_mu);
      shared->writers.erase(conn_id);
    }
    if (stream) (void)cuda::WaitStreamIdle(stream->get(), DeadlineAfterMs(5000));
    if (kernel_stream) (void)cuda::WaitStreamIdle(kernel_stream->get(), DeadlineAfterMs(5000));
    if (ping_) (void)ping_->Wait(DeadlineAfterMs(1000));
    for (auto& h : notes_) (void)h->Wait(DeadlineAfterMs(1000));
    for (auto& h : misc_) (void)h->Wait(DeadlineAfterMs(1000));
    for (SendBuf& b : bufs_) {
      shared->events.Release(b.event);
      shared->events.Release(b.dep);
      if (b.put) (void)b.put->Wait(DeadlineAfterMs(1000));
    }
    UnmapPeer();
    inner_ep.reset();
  }

  // Drops the zero-copy mapping of the peer's staging area (no copy into it may be running).
  void UnmapPeer() {
    if (peer_map_registered) {
      DeviceGuard guard(shared->device);
      cudaError_t err = cudaHostUnregister(peer_map->data());
      if (err != cudaSuccess) {
        (void)cudaGetLastError();
        KV_LOG_WARN << "ucx_staged: cudaHostUnregister of the peer's staging area: " << cudaGetErrorString(err);
      }
      peer_map_registered = false;
    }
    peer_map.reset();
  }

 private:
  // Ends the write once no chunk of it is in flight and none will start: delivered ones are
  // done already; the others complete with their error (kCanceled when canceled) and the peer
  // is told to forget their progress.
  void MaybeFinishLocked(std::map<uint64_t, WriteEntry>::iterator it) {
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

  void FailAllLocked(const Status& s) {
    if (status_.ok()) {
      status_ = s;
      KV_LOG_WARN << "ucx_staged: endpoint failed: " << s.ToString();
    }
    for (auto& [seq, e] : writes_) e.completion->Complete(s);
    writes_.clear();
    for (Chunk& c : queue_) shared->events.Release(c.dep);
    queue_.clear();
    awaiting_.clear();  // the peer will not hand these slots back (and may be unmapped soon)
  }

  // A started chunk that never reached the peer: its slot is still ours.
  void ChunkFailedLocked(SendBuf& b, const Status& s) {
    credits_.push_back(b.slot);
    auto it = writes_.find(b.chunk.write_seq);
    if (it != writes_.end()) {
      if (it->second.in_flight > 0) --it->second.in_flight;
      if (it->second.error.ok()) it->second.error = s;
      MaybeFinishLocked(it);
    }
  }

  char* PeerSlot(uint32_t slot) const {
    return static_cast<char*>(peer_map->data()) + uint64_t(peer.mailboxes) * kMailboxBytes +
           uint64_t(slot) * peer.slot_stride;
  }

  // Starts the device -> host copy of `chunk` bound for peer slot `slot`: into send buffer `b`,
  // or (zero-copy) straight into the slot.
  Status StartChunk(SendBuf& b, Chunk chunk, uint32_t slot) {
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
    KV_ASSIGN_OR_RETURN(b.event, shared->events.Acquire());
    KV_CUDA_RETURN_IF_ERROR(cudaEventRecord(b.event, done_on), "cudaEventRecord");
    b.chunk = std::move(chunk);
    b.slot = slot;
    b.state = 1;
    copying_.push_back(&b);
    return OkStatus();
  }

  // The chunk's bytes are on the host: put path, write descriptor + data into the peer's slot
  // (the notification follows the data); zero-copy, they are in the slot already: announce it.
  Status PostChunk(SendBuf& b) {
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

  // Whether the chunk at the queue's front belongs to a write that must not start more chunks.
  bool DropFrontLocked() {
    Chunk& c = queue_.front();
    auto it = writes_.find(c.write_seq);
    const bool drop = it == writes_.end() || it->second.completion->done() ||
                      it->second.completion->cancel_requested() || !it->second.error.ok();
    if (!drop) return false;
    shared->events.Release(c.dep);
    queue_.pop_front();
    if (it != writes_.end()) {
      it->second.dropped = true;
      MaybeFinishLocked(it);
    }
    return true;
  }

  void Run() {
    DeviceGuard guard(shared->device);
    (void)::prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);  // see Receiver::Run
    std::unique_lock<std::mutex> lock(mu_);  // the pipeline thread's own
    while (!stop_) {
      bool active = false;
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
        shared->events.Release(b.event);
        shared->events.Release(b.dep);
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
      if (status_.ok() && !writes_.empty() && in_flight_bufs_ == 0 && !ping_ &&
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
  bool StartQueuedLocked(size_t max_chunks = SIZE_MAX) {
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
        shared->events.Release(free_buf->dep);
        shared->events.Release(free_buf->event);
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

Result<std::unique_ptr<WriteHandle>> WriterCore::Write(const WriteRequest& req) {
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
  uint64_t cap = AdaptiveChunkBytes(queued, plan.bytes, shared->options.adaptive_chunk_fill, chunk_cap);
  if (const int m = shared->options.min_chunks_per_write; m > 1) {
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
    DeviceGuard guard(shared->device);
    KV_RETURN_IF_ERROR(guard.status());
    KV_ASSIGN_OR_RETURN(dep, shared->events.Acquire());
    cudaError_t err = cudaEventRecord(dep, static_cast<cudaStream_t>(req.after_stream));
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      shared->events.Release(dep);
      return InvalidArgument(std::string("ucx_staged Write: after_stream is not usable: ") +
                             cudaGetErrorName(err));
    }
  }
  {
    auto lock = LockFromOutside();
    if (!status_.ok() || shut_down_) {
      shared->events.Release(dep);
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
      DeviceGuard guard(shared->device);
      if (guard.status().ok()) (void)StartQueuedLocked(1);
    }
  }
  cv_.notify_all();
  return std::unique_ptr<WriteHandle>(new CompletionHandle(std::move(completion)));
}

void Shared::OnInner(const Notification& n) {
  if ((n.flags & kFlagMagicMask) != kFlagMagic) return;
  const int type = n.flags & 0xFF;
  if (type == kCredit || type == kByeAck) {
    std::shared_ptr<WriterCore> w;
    {
      std::lock_guard<std::mutex> lock(router_mu);
      auto it = writers.find(uint32_t(n.layer));
      if (it != writers.end()) w = it->second.lock();
    }
    if (w) w->OnCredit(n);
    return;
  }
  std::shared_ptr<Receiver> r;
  {
    std::lock_guard<std::mutex> lock(router_mu);
    r = receiver;
  }
  if (r) r->Post(n);
}

class StagedEndpoint : public Endpoint {
 public:
  explicit StagedEndpoint(std::shared_ptr<WriterCore> core) : core_(std::move(core)) {}
  ~StagedEndpoint() override { core_->Shutdown(); }
  Result<std::unique_ptr<WriteHandle>> Write(const WriteRequest& request) override {
    return core_->Write(request);
  }
  Status status() const override { return core_->status(); }
  bool zero_copy() const { return core_->zero_copy; }

 private:
  std::shared_ptr<WriterCore> core_;
};

class StagedTransport : public Transport {
 public:
  explicit StagedTransport(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}
  ~StagedTransport() override {
    std::shared_ptr<Receiver> r;
    {
      std::lock_guard<std::mutex> lock(shared_->router_mu);
      r.swap(shared_->receiver);
    }
    // The inner sink stays: endpoints may outlive this object and still need their credits.
    if (r) r->Stop();
  }

  Status Init() {
    Shared& s = *shared_;
    s.slot_stride = kHeaderBytes + s.options.chunk_bytes;
    const uint64_t raw_len = uint64_t(kMailboxes) * kMailboxBytes + uint64_t(s.options.recv_slots) * s.slot_stride;
    s.staging_len = (raw_len + kStagingAlign - 1) / kStagingAlign * kStagingAlign;
    KV_RETURN_IF_ERROR(AllocateStaging());
    // Doorbell words start clear (cudaHostAlloc'd memory need not be zero).
    for (uint32_t slot = 0; slot < uint32_t(s.options.recv_slots); ++slot) {
      std::memset(s.staging + s.SlotOffset(slot) + kReadyOffset, 0, kHeaderBytes - kReadyOffset);
    }
    KV_ASSIGN_OR_RETURN(s.recv_tables, cuda::PinnedBuffer::Allocate(size_t(s.options.recv_slots) *
                                                                     kTableEntriesPerSlot * sizeof(CopyRun)));
    s.box.resize(4096);
    KV_ASSIGN_OR_RETURN(s.box_reg, s.inner->Register({s.box.data(), s.box.size(), MemoryKind::kHost, -1}));
    auto receiver = std::make_shared<Receiver>(shared_.get());
    KV_RETURN_IF_ERROR(receiver->Start());
    {
      std::lock_guard<std::mutex> lock(s.router_mu);
      s.receiver = receiver;
    }
    std::weak_ptr<Shared> weak = shared_;
    s.inner->SetNotificationSink([weak](const Notification& n) {
      if (auto sh = weak.lock()) sh->OnInner(n);
    });
    AddrWire a{};
    std::memcpy(a.magic, kAddrMagic, sizeof(a.magic));
    a.staging_addr = reinterpret_cast<uint64_t>(s.staging);
    a.staging_len = s.staging_len;
    a.chunk_bytes = s.options.chunk_bytes;
    a.slot_stride = s.slot_stride;
    a.slots = uint32_t(s.options.recv_slots);
    a.mailboxes = kMailboxes;
    std::string inner_addr = s.inner->LocalAddress();
    std::string key = s.staging_reg->RemoteKey();
    a.inner_addr_len = uint32_t(inner_addr.size());
    a.staging_key_len = uint32_t(key.size());
    address_.assign(reinterpret_cast<const char*>(&a), sizeof(a));
    address_ += inner_addr;
    address_ += key;
    return OkStatus();
  }

  std::string name() const override { return "ucx_staged"; }
  Capabilities capabilities() const override {
    Capabilities c;
    c.host_memory = false;
    c.cuda_memory = true;
    c.remote = shared_->inner->capabilities().remote;
    c.notifications = true;
    return c;
  }
  std::string LocalAddress() const override { return address_; }

  Result<std::unique_ptr<Registration>> Register(const MemoryRegion& region) override {
    if (region.kind != MemoryKind::kCuda) {
      return NotSupported("ucx_staged registers only CUDA device memory; use the ucx backend for host memory");
    }
    if (region.addr == nullptr || region.length == 0) {
      return InvalidArgument("ucx_staged Register: null address or zero length");
    }
    KV_ASSIGN_OR_RETURN(cuda::DevicePointerInfo info, cuda::QueryDevicePointer(region.addr, region.length));
    if (info.device != shared_->device) {
      return InvalidArgument("ucx_staged Register: memory is on device " + std::to_string(info.device) +
                             ", the transport on " + std::to_string(shared_->device));
    }
    MemoryRegion r = region;
    r.device = info.device;
    uint32_t id;
    {
      std::lock_guard<std::mutex> lock(shared_->regions_mu);
      id = shared_->next_region_id++;
      shared_->regions[id] = {reinterpret_cast<uint64_t>(region.addr), region.length};
    }
    return std::unique_ptr<Registration>(new StagedRegistration(shared_, r, id));
  }

  Result<std::unique_ptr<Endpoint>> Connect(const PeerDescriptor& peer) override {
    Shared& s = *shared_;
    AddrWire a;
    if (peer.address.size() < sizeof(a)) return InvalidArgument("ucx_staged: peer address is not a ucx_staged address");
    std::memcpy(&a, peer.address.data(), sizeof(a));
    if (std::memcmp(a.magic, kAddrMagic, sizeof(a.magic)) != 0 ||
        peer.address.size() != sizeof(a) + uint64_t(a.inner_addr_len) + a.staging_key_len) {
      return InvalidArgument("ucx_staged: peer address is not a ucx_staged address (or another version)");
    }
    if (a.chunk_bytes == 0 || a.slots == 0 || a.slot_stride != kHeaderBytes + a.chunk_bytes ||
        a.mailboxes == 0 ||
        a.staging_len < uint64_t(a.mailboxes) * kMailboxBytes + uint64_t(a.slots) * a.slot_stride) {
      return InvalidArgument("ucx_staged: peer address describes an unusable staging area");
    }
    auto core = std::make_shared<WriterCore>();
    core->shared = shared_;
    core->peer = a;
    for (size_t i = 0; i < peer.regions.size(); ++i) {
      KeyWire k;
      if (peer.regions[i].key.size() != sizeof(k)) {
        return InvalidArgument("ucx_staged: region " + std::to_string(i) + " has no ucx_staged key");
      }
      std::memcpy(&k, peer.regions[i].key.data(), sizeof(k));
      if (std::memcmp(k.magic, kKeyMagic, sizeof(k.magic)) != 0 || k.length == 0) {
        return InvalidArgument("ucx_staged: region " + std::to_string(i) + " has no ucx_staged key");
      }
      core->remote.push_back({k.region_id, k.length});
    }
    PeerDescriptor inner_peer;
    inner_peer.address = peer.address.substr(sizeof(a), a.inner_addr_len);
    inner_peer.regions.push_back({a.staging_addr, a.staging_len,
                                  peer.address.substr(sizeof(a) + a.inner_addr_len, a.staging_key_len)});
    KV_ASSIGN_OR_RETURN(core->inner_ep, s.inner->Connect(inner_peer));
    const int nbufs = std::max(1, s.options.send_buffers);
    // Our chunks must fit the peer's slots.
    const uint64_t chunk = std::min<uint64_t>(s.options.chunk_bytes, a.chunk_bytes);
    core->buf_stride = kHeaderBytes + chunk;
    core->chunk_cap = chunk;
    ChooseZeroCopy(*core);
    // Zero-copy needs no send buffers: the pinned area only carries the hello record.
    const uint64_t send_len = core->zero_copy ? kMailboxBytes : core->buf_stride * nbufs;
    KV_ASSIGN_OR_RETURN(core->send_staging, cuda::PinnedBuffer::Allocate(send_len));
    KV_ASSIGN_OR_RETURN(core->send_reg, s.inner->Register({core->send_staging->data(), send_len,
                                                           MemoryKind::kHost, -1}));
    KV_ASSIGN_OR_RETURN(core->tables, cuda::PinnedBuffer::Allocate(size_t(nbufs) * kTableEntriesPerSlot * sizeof(CopyRun)));
    KV_ASSIGN_OR_RETURN(core->stream, cuda::Stream::CreateLowestPriority(s.device));
    if (s.options.overlap_kernels) {
      KV_ASSIGN_OR_RETURN(core->kernel_stream, cuda::Stream::CreateLowestPriority(s.device));
    }
    core->lanes.copy = core->stream->get();
    core->lanes.kernel = core->kernel_stream ? core->kernel_stream->get() : core->lanes.copy;
    core->lanes.events = &s.events;
    KV_ASSIGN_OR_RETURN(core->scratch, cuda::DeviceBuffer::Allocate(s.device, size_t(nbufs) * chunk));
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
        core->conn_id = uint32_t(rng());
      } while (core->conn_id == 0 || s.writers.count(core->conn_id));
      s.writers[core->conn_id] = core;
    }
    // Hello: our address and box key into a peer mailbox, then announce it.
    std::string my_addr = s.inner->LocalAddress();
    std::string my_key = s.box_reg->RemoteKey();
    HelloWire h{};
    std::memcpy(h.magic, kHelloMagic, sizeof(h.magic));
    h.nonce = nonce;
    h.conn_id = core->conn_id;
    h.addr_len = uint32_t(my_addr.size());
    h.key_len = uint32_t(my_key.size());
    h.writer_pid = core->zero_copy ? uint32_t(getpid()) : 0;
    h.flags = core->doorbells ? kHelloDoorbells : 0;
    h.box_addr = reinterpret_cast<uint64_t>(s.box.data());
    h.box_len = s.box.size();
    if (sizeof(h) + my_addr.size() + my_key.size() > kMailboxBytes) {
      return Internal("ucx_staged: our UCX address does not fit a hello mailbox");
    }
    char* rec = static_cast<char*>(core->send_staging->data());
    std::memcpy(rec, &h, sizeof(h));
    std::memcpy(rec + sizeof(h), my_addr.data(), my_addr.size());
    std::memcpy(rec + sizeof(h) + my_addr.size(), my_key.data(), my_key.size());
    WriteRequest wr;
    wr.local = core->send_reg.get();
    wr.remote_region = 0;
    wr.ops.push_back({0, uint64_t(mailbox) * kMailboxBytes, sizeof(h) + my_addr.size() + my_key.size()});
    wr.notify = true;
    wr.notification = Msg(kHello, nonce, int32_t(mailbox));
    const Deadline deadline = DeadlineAfterMs(s.options.connect_timeout_ms);
    KV_ASSIGN_OR_RETURN(auto hello, core->inner_ep->Write(wr));
    core->hello_sent = true;
    KV_RETURN_IF_ERROR(hello->Wait(deadline).WithContext("ucx_staged hello"));
    KV_RETURN_IF_ERROR(core->WaitFirstCredit(deadline));
    core->Start(nbufs);
    return std::unique_ptr<Endpoint>(new StagedEndpoint(std::move(core)));
  }

  void SetNotificationSink(NotificationSink sink) override {
    std::lock_guard<std::mutex> lock(shared_->sink_mu);
    shared_->sink = std::move(sink);
  }

 private:
  // The receive staging area: the inner transport's Allocate()d memory (a memfd that a writer
  // on this host can map), page-locked here so that our host -> device copies run at pinned
  // speed. Where the allocation or the page-locking fails: cudaHostAlloc + Register (writers
  // then use UCX puts).
  Status AllocateStaging() {
    Shared& s = *shared_;
    auto allocated = s.inner->Allocate(s.staging_len);
    if (allocated.ok() && allocated.value()->region().length >= s.staging_len) {
      void* p = allocated.value()->region().addr;
      DeviceGuard guard(s.device);
      cudaError_t err = cudaHostRegister(p, s.staging_len, cudaHostRegisterPortable);
      if (err == cudaSuccess) {
        s.staging = static_cast<char*>(p);
        s.staging_reg = std::move(allocated).value();
        s.staging_host_registered = true;
        return OkStatus();
      }
      (void)cudaGetLastError();
      KV_LOG_WARN << "ucx_staged: cannot page-lock the shared staging area (cudaHostRegister: "
                  << cudaGetErrorString(err) << "); using cudaHostAlloc memory, so writers on this "
                  << "host use UCX puts";
    } else if (!allocated.ok()) {
      KV_LOG_INFO << "ucx_staged: no shared staging area (" << allocated.status().ToString()
                  << "); using cudaHostAlloc memory";
    }
    KV_ASSIGN_OR_RETURN(s.staging_pinned, cuda::PinnedBuffer::Allocate(s.staging_len));
    s.staging = static_cast<char*>(s.staging_pinned->data());
    KV_ASSIGN_OR_RETURN(s.staging_reg, s.inner->Register({s.staging, s.staging_len, MemoryKind::kHost, -1}));
    return OkStatus();
  }

  // Zero-copy when allowed and the inner endpoint maps the peer's staging area (same host) and
  // that mapping can be page-locked here; else UCX puts. Logged either way.
  void ChooseZeroCopy(WriterCore& core) {
    if (shared_->options.zero_copy == ZeroCopy::kOff) {
      KV_LOG_INFO << "ucx_staged: UCX puts into the peer's staging slots (zero-copy turned off)";
      return;
    }
    auto map = ucx::MapPeerRegion(*core.inner_ep, 0);
    if (!map.ok()) {
      KV_LOG_INFO << "ucx_staged: UCX puts into the peer's staging slots (" << map.status().ToString() << ")";
      return;
    }
    DeviceGuard guard(shared_->device);
    cudaError_t err = cudaHostRegister(map.value()->data(), map.value()->length(), cudaHostRegisterPortable);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      KV_LOG_WARN << "ucx_staged: the peer's staging area is mapped but cannot be page-locked here "
                  << "(cudaHostRegister: " << cudaGetErrorString(err) << "); using UCX puts";
      return;
    }
    core.peer_map = std::move(map).value();
    core.peer_map_registered = true;
    core.zero_copy = true;
    core.doorbells = shared_->options.doorbells;
    KV_LOG_INFO << "ucx_staged: peer on this host, its staging area mapped: device-to-host copies land "
                << "in its slots directly, UCX carries only announcements and credits (zero-copy; "
                << "KVSTREAM_STAGED_ZERO_COPY=0 forces UCX puts)";
  }

  std::shared_ptr<Shared> shared_;
  std::string address_;
};

}  // namespace

void ApplyStagedEnv(StagedOptions* options) {
  if (const char* z = std::getenv("KVSTREAM_STAGED_ZERO_COPY")) {
    const std::string v = z;
    if (v == "0") options->zero_copy = ZeroCopy::kOff;
    if (v == "1") options->zero_copy = ZeroCopy::kAuto;
  }
  if (const char* c = std::getenv("KVSTREAM_STAGED_CHUNK_MIB")) {
    char* end = nullptr;
    const long mib = std::strtol(c, &end, 10);
    if (end != c && *end == '\0' && mib >= 1 && mib <= 256) options->chunk_bytes = size_t(mib) << 20;
  }
  if (const char* f = std::getenv("KVSTREAM_STAGED_FILL_KIB")) {
    char* end = nullptr;
    const long kib = std::strtol(f, &end, 10);
    if (end != f && *end == '\0' && kib >= 0 && kib <= 65536) options->adaptive_chunk_fill = uint64_t(kib) << 10;
  }
}

std::string EndpointPath(const Endpoint& endpoint) {
  const auto* ep = dynamic_cast<const StagedEndpoint*>(&endpoint);
  if (ep == nullptr) return "";
  return ep->zero_copy() ? "zero_copy" : "ucx_put";
}

Result<std::unique_ptr<Transport>> CreateStagedTransport(const StagedOptions& options) {
  KV_ASSIGN_OR_RETURN(int device, cuda::ResolveDevice(options.device, "ucx_staged"));
  if (options.chunk_bytes == 0 || options.chunk_bytes % 16 != 0 || options.recv_slots <= 0 ||
      options.credits_per_peer <= 0 || options.recv_slots > 0xFFFF) {
    return InvalidArgument("ucx_staged: chunk_bytes must be a positive multiple of 16 and slots/credits positive");
  }
  // Gather/scatter kernels loaded now, not at a first Write() behind running compute.
  KV_RETURN_IF_ERROR(cuda::PrepareDevice(device));
  auto shared = std::make_shared<Shared>(device);
  shared->options = options;
  shared->options.device = device;
  TransportOptions inner;
  inner.backend = "ucx";
  inner.ucx_tls = options.ucx_tls;
  inner.ucx_net_devices = options.ucx_net_devices;
  KV_ASSIGN_OR_RETURN(shared->inner, ucx::CreateUcxTransport(inner));
  auto t = std::make_unique<StagedTransport>(shared);
  KV_RETURN_IF_ERROR(t->Init());
  return std::unique_ptr<Transport>(std::move(t));
}

Result<std::unique_ptr<Transport>> CreateStagedTransport(const TransportOptions& options) {
  StagedOptions o;
  o.device = options.device;
  o.ucx_tls = options.ucx_tls;
  o.ucx_net_devices = options.ucx_net_devices;
  ApplyStagedEnv(&o);
  return CreateStagedTransport(o);
}

Result<std::string> SelectGpuBackend(const TransportOptions& options) {
  TransportOptions o = options;
  o.backend = "ucx";
  KV_ASSIGN_OR_RETURN(auto t, ucx::CreateUcxTransport(o));
  return std::string(t->capabilities().cuda_memory ? "ucx" : "ucx_staged");
}

}  // namespace kvstream::transport::staged
