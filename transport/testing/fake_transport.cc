#include "transport/testing/fake_transport.h"
#include "transport/task_thread.h"

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "transport/core/write_completion.h"
#include "transport/core/write_plan.h"

namespace kvstream::transport::testing {
namespace {

using internal::CompletionHandle;
using internal::Run;
using internal::WriteCompletion;

// What a peer can reach: registrations, sink, liveness. Holds no thread, so the last
// reference may drop anywhere.
struct FakeCore {
  uint64_t id = 0;
  std::mutex mu;  // guards regs, sink; held while copying into this core's memory
  std::map<uint64_t, MemoryRegion> regs;
  uint64_t next_reg = 1;
  std::shared_ptr<const NotificationSink> sink;
  std::atomic<bool> disconnected{false};

  std::mutex fault_mu;
  int fail_countdown = 0;
  Status fail_status;
  std::atomic<int64_t> delay_us{0};
  std::atomic<int> drop_notifications{FakeTransport::kNoLayer};
  std::atomic<uint64_t> started{0};
};

std::mutex g_mu;
std::map<uint64_t, std::weak_ptr<FakeCore>> g_cores;
uint64_t g_next_core = 1;

// The writes of a transport run in order on one thread, owned only by user-facing objects
// (transport, endpoints), never by its own jobs, so it is never destroyed on its own thread.
using Executor = TaskThread;

class FakeRegistration final : public Registration {
 public:
  FakeRegistration(std::shared_ptr<FakeCore> core, uint64_t id, MemoryRegion region,
                   std::shared_ptr<uint8_t[]> owned)
      : core_(std::move(core)), id_(id), region_(region), owned_(std::move(owned)) {}
  ~FakeRegistration() override {
    std::lock_guard<std::mutex> lock(core_->mu);
    core_->regs.erase(id_);
  }
  const MemoryRegion& region() const override { return region_; }
  std::string RemoteKey() const override {
    return "fake:" + std::to_string(core_->id) + ":" + std::to_string(id_);
  }
  const FakeCore* core() const { return core_.get(); }
  const std::shared_ptr<uint8_t[]>& owned() const { return owned_; }

 private:
  std::shared_ptr<FakeCore> core_;
  uint64_t id_;
  MemoryRegion region_;
  std::shared_ptr<uint8_t[]> owned_;
};

struct FakeEpState {
  std::shared_ptr<FakeCore> local;
  std::weak_ptr<FakeCore> peer;
  std::vector<RemoteRegion> regions;
  std::vector<uint64_t> reg_ids;
  std::mutex mu;  // held while a write copies; Endpoint destruction takes it to stop writes
  bool closed = false;
  uint64_t next_seq = 0;
  std::map<uint64_t, std::shared_ptr<WriteCompletion>> pending;  // guarded by mu

  Status Check(const std::shared_ptr<FakeCore>& p) const {
    if (local->disconnected.load()) return RemoteDisconnect("fake: this transport is disconnected");
    if (p == nullptr) return RemoteDisconnect("fake: peer transport is gone");
    if (p->disconnected.load()) return RemoteDisconnect("fake: peer is disconnected");
    return OkStatus();
  }
};

class FakeEndpoint final : public Endpoint {
 public:
  FakeEndpoint(std::shared_ptr<FakeEpState> s, std::shared_ptr<Executor> exec)
      : s_(std::move(s)), exec_(std::move(exec)) {}
  ~FakeEndpoint() override {
    std::lock_guard<std::mutex> lock(s_->mu);  // waits for a copy in progress
    s_->closed = true;
    for (auto& [seq, c] : s_->pending) c->Complete(Canceled("fake: endpoint closed"));
    s_->pending.clear();
  }

  Result<std::unique_ptr<WriteHandle>> Write(const WriteRequest& request) override {
    KV_RETURN_IF_ERROR(internal::CheckRequestShape(request, s_->regions.size()));
    if (request.after_stream != nullptr) {
      return NotSupported("fake: after_stream needs a GPU backend; this one moves host memory");
    }
    const auto* local = dynamic_cast<const FakeRegistration*>(request.local);
    if (local == nullptr || local->core() != s_->local.get()) {
      return InvalidArgument("local registration was not made by this fake transport");
    }
    const RemoteRegion& remote = s_->regions[request.remote_region];
    KV_ASSIGN_OR_RETURN(internal::WritePlan plan,
                        internal::PlanWrite(request.ops, local->region().length, remote.length));
    KV_RETURN_IF_ERROR(status());

    auto completion = std::make_shared<WriteCompletion>(plan.bytes, plan.runs.size());
    uint64_t seq;
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      seq = s_->next_seq++;
      s_->pending[seq] = completion;
    }
    exec_->Post([s = s_, completion, seq, src = static_cast<const uint8_t*>(local->region().addr),
                 keep = local->owned(), runs = std::move(plan.runs),
                 reg_id = s_->reg_ids[request.remote_region], dst = remote.addr,
                 dst_len = remote.length, notify = request.notify,
                 note = request.notification] {
      FakeCore& core = *s->local;
      core.started.fetch_add(1);
      struct Unlist {
        FakeEpState* s;
        uint64_t seq;
        ~Unlist() {
          std::lock_guard<std::mutex> lock(s->mu);
          s->pending.erase(seq);
        }
      } unlist{s.get(), seq};
      {
        std::lock_guard<std::mutex> lock(core.fault_mu);
        if (core.fail_countdown > 0 && --core.fail_countdown == 0) {
          return completion->Complete(core.fail_status);
        }
      }
      if (int64_t d = core.delay_us.load(); d > 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(d));
      }
      std::shared_ptr<const NotificationSink> sink;
      {
        std::lock_guard<std::mutex> ep_lock(s->mu);
        if (s->closed) return completion->Complete(Canceled("fake: endpoint closed"));
        if (completion->cancel_requested()) return completion->Complete(Canceled("fake: canceled"));
        std::shared_ptr<FakeCore> peer = s->peer.lock();
        if (Status st = s->Check(peer); !st.ok()) return completion->Complete(st);
        std::lock_guard<std::mutex> peer_lock(peer->mu);
        auto it = peer->regs.find(reg_id);
        if (it == peer->regs.end()) {
          return completion->Complete(
              FailedPrecondition("fake: the peer deregistered the destination region"));
        }
        auto* base = reinterpret_cast<uint8_t*>(dst);
        for (const Run& r : runs) std::memcpy(base + r.remote_offset, src + r.local_offset, r.length);
        (void)dst_len;
        const int drop = core.drop_notifications.load();
        if (notify && drop != FakeTransport::kAnyLayer && drop != note.layer) sink = peer->sink;
      }
      if (sink) (*sink)(note);
      completion->Complete(OkStatus());
    });
    return std::unique_ptr<WriteHandle>(new CompletionHandle(std::move(completion)));
  }

  Status status() const override { return s_->Check(s_->peer.lock()); }

 private:
  std::shared_ptr<FakeEpState> s_;
  std::shared_ptr<Executor> exec_;
};

class FakeTransportImpl final : public FakeTransport {
 public:
  FakeTransportImpl() : core_(std::make_shared<FakeCore>()), exec_(std::make_shared<Executor>()) {
    std::lock_guard<std::mutex> lock(g_mu);
    core_->id = g_next_core++;
    g_cores[core_->id] = core_;
  }
  ~FakeTransportImpl() override {
    {
      std::lock_guard<std::mutex> lock(g_mu);
      g_cores.erase(core_->id);
    }
    SetNotificationSink(nullptr);
  }

  std::string name() const override { return "fake"; }
  Capabilities capabilities() const override {
    Capabilities c;
    c.host_memory = true;
    c.notifications = true;
    c.notification_mac = true;
    return c;
  }
  std::string LocalAddress() const override { return "fake:" + std::to_string(core_->id); }

  Result<std::unique_ptr<Registration>> Register(const MemoryRegion& region) override {
    if (region.addr == nullptr || region.length == 0) {
      return InvalidArgument("fake: cannot register an empty region");
    }
    if (region.kind != MemoryKind::kHost) return NotSupported("fake: host memory only");
    return Add(region, nullptr);
  }

  Result<std::unique_ptr<Registration>> Allocate(size_t length) override {
    if (length == 0) return InvalidArgument("fake: cannot allocate 0 bytes");
    std::shared_ptr<uint8_t[]> mem(new (std::nothrow) uint8_t[length]);
    if (mem == nullptr) return ResourceExhausted("fake: cannot allocate " + std::to_string(length));
    MemoryRegion region;
    region.addr = mem.get();
    region.length = length;
    return Add(region, std::move(mem));
  }

  Result<std::unique_ptr<Endpoint>> Connect(const PeerDescriptor& peer) override {
    uint64_t peer_id = 0;
    if (std::sscanf(peer.address.c_str(), "fake:%lu", &peer_id) != 1) {
      return InvalidArgument("fake: '" + peer.address + "' is not a fake transport address");
    }
    std::shared_ptr<FakeCore> p;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      auto it = g_cores.find(peer_id);
      if (it != g_cores.end()) p = it->second.lock();
    }
    if (p == nullptr) return Unavailable("fake: no transport at " + peer.address + " here");
    auto s = std::make_shared<FakeEpState>();
    s->local = core_;
    s->peer = p;
    s->regions = peer.regions;
    std::lock_guard<std::mutex> lock(p->mu);
    for (size_t i = 0; i < peer.regions.size(); ++i) {
      const RemoteRegion& r = peer.regions[i];
      uint64_t core_id = 0, reg_id = 0;
      std::string where = "fake: region " + std::to_string(i);
      if (std::sscanf(r.key.c_str(), "fake:%lu:%lu", &core_id, &reg_id) != 2 || core_id != peer_id) {
        return InvalidArgument(where + ": key '" + r.key + "' is not a key of " + peer.address);
      }
      auto it = p->regs.find(reg_id);
      if (it == p->regs.end()) return InvalidArgument(where + ": not registered at the peer");
      auto base = reinterpret_cast<uint64_t>(it->second.addr);
      if (r.addr < base || r.length > it->second.length || r.addr - base > it->second.length - r.length) {
        return InvalidArgument(where + ": [addr, +length) is outside its registration");
      }
      s->reg_ids.push_back(reg_id);
    }
    return std::unique_ptr<Endpoint>(new FakeEndpoint(std::move(s), exec_));
  }

  void SetNotificationSink(NotificationSink sink) override {
    auto p = sink ? std::make_shared<const NotificationSink>(std::move(sink)) : nullptr;
    std::lock_guard<std::mutex> lock(core_->mu);
    core_->sink = std::move(p);
  }

  void FailNthWrite(int n, Status status) override {
    std::lock_guard<std::mutex> lock(core_->fault_mu);
    core_->fail_countdown = n;
    core_->fail_status = std::move(status);
  }
  void SetWriteDelay(std::chrono::microseconds delay) override {
    core_->delay_us.store(delay.count());
  }
  void Disconnect() override {
    // Taking the memory lock waits for a copy into this transport that is in progress.
    std::lock_guard<std::mutex> lock(core_->mu);
    core_->disconnected.store(true);
  }
  void DropNotifications(int layer) override { core_->drop_notifications.store(layer); }
  uint64_t writes_started() const override { return core_->started.load(); }

 private:
  Result<std::unique_ptr<Registration>> Add(const MemoryRegion& region,
                                            std::shared_ptr<uint8_t[]> owned) {
    std::lock_guard<std::mutex> lock(core_->mu);
    uint64_t id = core_->next_reg++;
    core_->regs[id] = region;
    return std::unique_ptr<Registration>(
        new FakeRegistration(core_, id, region, std::move(owned)));
  }

  std::shared_ptr<FakeCore> core_;
  std::shared_ptr<Executor> exec_;
};

}  // namespace

std::unique_ptr<FakeTransport> FakeTransport::Create() {
  return std::make_unique<FakeTransportImpl>();
}

Result<std::unique_ptr<Transport>> CreateFakeTransport(const TransportOptions&) {
  return std::unique_ptr<Transport>(FakeTransport::Create());
}

}  // namespace kvstream::transport::testing
