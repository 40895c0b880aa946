#include "transport/ucx/ucx_transport.h"
#include "transport/task_thread.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <deque>
#include <functional>
#include <latch>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/log.h"
#include "transport/write_plan.h"

namespace kvstream::transport::ucx {
namespace {

using internal::CompletionHandle;
using internal::Run;
using internal::WriteCompletion;

constexpr unsigned kNotifyAmId = 17;
// Wire version of the notification header and of the address / key envelopes. Bump on any
// layout change; a mismatch is refused, never misread.
constexpr uint32_t kWireVersion = 3;
constexpr uint32_t kNotifyMagic = 0x4b564e00u | kWireVersion;  // "KVN" + version
constexpr char kAddressTag[4] = {'K', 'V', 'U', 'A'};
constexpr char kKeyTag[4] = {'K', 'V', 'U', 'K'};

constexpr auto kCloseFlushTimeout = std::chrono::seconds(2);
constexpr auto kCloseWaitTimeout = std::chrono::seconds(10);
constexpr auto kSyncCallTimeout = std::chrono::seconds(30);
// The progress thread spins this long after the last event before it sleeps on the event fds;
// while writes are in flight it spins up to kBusySpin without progress before sleeping in
// short naps (a stalled peer should not cost a whole core).
constexpr auto kIdleSpin = std::chrono::microseconds(200);
constexpr auto kBusySpin = std::chrono::milliseconds(5);
constexpr auto kStopLinger = std::chrono::milliseconds(20);
// ucp_ep_create can fail with "Destination is unreachable" while the peer's interfaces are
// still coming up or the host is overloaded (seen under gVisor); it is retried this often.
constexpr int kConnectAttempts = 4;

// Little-endian on the wire (both ends are x86-64 or aarch64 little-endian hosts).
struct NotifyWire {
  uint32_t magic;
  int32_t layer;
  uint64_t request_id;
  int32_t flags;
  uint32_t reserved;
};
static_assert(sizeof(NotifyWire) == 24);

uint32_t Fnv1a(const void* data, size_t n) {
  uint32_t h = 2166136261u;
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 16777619u;
  return h;
}

// [tag 4][version 4][length 4][fnv1a 4][payload]: UCX parses addresses and keys without
// bounds checks, so a truncated or foreign blob is refused here instead of reaching it.
std::string Seal(const char (&tag)[4], const void* payload, size_t n) {
  std::string out(16 + n, '\0');
  uint32_t version = kWireVersion, length = static_cast<uint32_t>(n), sum = Fnv1a(payload, n);
  std::memcpy(out.data(), tag, 4);
  std::memcpy(out.data() + 4, &version, 4);
  std::memcpy(out.data() + 8, &length, 4);
  std::memcpy(out.data() + 12, &sum, 4);
  std::memcpy(out.data() + 16, payload, n);
  return out;
}

Result<std::string_view> Unseal(const char (&tag)[4], const std::string& blob, const char* what) {
  if (blob.size() < 16 || std::memcmp(blob.data(), tag, 4) != 0) {
    return InvalidArgument(std::string(what) + " is not a kvstream UCX blob");
  }
  uint32_t version, length, sum;
  std::memcpy(&version, blob.data() + 4, 4);
  std::memcpy(&length, blob.data() + 8, 4);
  std::memcpy(&sum, blob.data() + 12, 4);
  if (version != kWireVersion) {
    return InvalidArgument(std::string(what) + " has wire version " + std::to_string(version) +
                           ", this build speaks " + std::to_string(kWireVersion));
  }
  if (length != blob.size() - 16 || Fnv1a(blob.data() + 16, length) != sum) {
    return InvalidArgument(std::string(what) + " is truncated or corrupt");
  }
  return std::string_view(blob.data() + 16, length);
}

// Who and where a worker runs, carried in front of the ucp address so that a writer on the
// same host (same boot, same pid namespace) can copy with process_vm_writev (CMA) directly.
struct HostIdentity {
  char boot_id[40] = {};
  uint64_t pid_ns = 0;
  uint32_t pid = 0;
  uint64_t start_time = 0;  // /proc/<pid>/stat field 22: tells a reused pid apart
};
static_assert(sizeof(HostIdentity) == 64);

// In front of the packed UCX rkey: where a same-host writer can map the region's memory
// (Allocate() backs it with a memfd; fd = -1 for memory the caller registered).
struct SharedFile {
  int32_t fd = -1;
  uint32_t reserved = 0;
  uint64_t ino = 0;
  uint64_t dev = 0;
  uint64_t base = 0;    // the owner's address of byte 0 of the file
  uint64_t length = 0;
};
static_assert(sizeof(SharedFile) == 40);

uint64_t ProcessStartTime(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return 0;
  size_t close = line.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return 0;
  std::istringstream in(line.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && (in >> field); ++i) {
    if (i == 22) return std::strtoull(field.c_str(), nullptr, 10);
  }
  return 0;
}

// Maps the whole memfd `f` of process `pid` (shared, read-write) when it is still the file the
// key names (inode and device) and covers region `r`; MAP_FAILED otherwise.
void* MapSharedFile(uint32_t pid, const SharedFile& f, const RemoteRegion& r) {
  if (f.fd < 0 || f.length == 0 || r.addr < f.base || r.length > f.length ||
      r.addr - f.base > f.length - r.length) {
    return MAP_FAILED;
  }
  std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(f.fd);
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return MAP_FAILED;
  struct stat st {};
  void* p = MAP_FAILED;
  if (fstat(fd, &st) == 0 && st.st_ino == f.ino && st.st_dev == f.dev &&
      static_cast<uint64_t>(st.st_size) >= f.length) {
    p = mmap(nullptr, f.length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  close(fd);
  return p;
}

HostIdentity LocalIdentity() {
  HostIdentity id;
  std::ifstream b("/proc/sys/kernel/random/boot_id");
  std::string boot;
  std::getline(b, boot);
  std::strncpy(id.boot_id, boot.c_str(), sizeof(id.boot_id) - 1);
  char link[64] = {};
  if (readlink("/proc/self/ns/pid", link, sizeof(link) - 1) > 0) {
    const char* open = std::strchr(link, '[');
    if (open) id.pid_ns = std::strtoull(open + 1, nullptr, 10);
  }
  id.pid = static_cast<uint32_t>(getpid());
  id.start_time = ProcessStartTime(getpid());
  return id;
}

// Whether the UCX transport selection admits shared-memory copies (UCX_TLS semantics:
// empty = all, "^a,b" = all but a and b).
bool TlsAllowsCma(std::string tls) {
  if (tls.empty()) {
    const char* env = std::getenv("UCX_TLS");
    tls = env ? env : "";
  }
  if (const char* off = std::getenv("KVSTREAM_UCX_CMA"); off && std::string(off) == "0") return false;
  if (tls.empty()) return true;
  bool exclude = tls[0] == '^';
  if (exclude) tls.erase(0, 1);
  bool named = false;
  std::stringstream ss(tls);
  for (std::string t; std::getline(ss, t, ',');) {
    if (t == "sm" || t == "shm" || t == "cma" || t == "all") named = true;
  }
  return exclude ? !named : named;
}

Status FromUcs(ucs_status_t s, const std::string& what) {
  std::string m = what + ": " + ucs_status_string(s);
  switch (s) {
    case UCS_OK: return OkStatus();
    case UCS_ERR_CANCELED: return Canceled(m);
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_NOT_CONNECTED: return RemoteDisconnect(m);
    case UCS_ERR_TIMED_OUT: return Timeout(m);
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_NO_RESOURCE:
    case UCS_ERR_EXCEEDS_LIMIT: return ResourceExhausted(m);
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR: return InvalidArgument(m);
    case UCS_ERR_UNSUPPORTED: return NotSupported(m);
    default: return Internal(m);
  }
}


// ---- the worker and its progress thread ------------------------------------------------------

class Worker {
 public:
  static Result<std::shared_ptr<Worker>> Create(const TransportOptions& options);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  ucp_context_h context() const { return context_; }
  ucp_worker_h worker() const { return worker_; }
  const std::string& address() const { return address_; }
  bool cuda_memory() const { return cuda_memory_; }
  const HostIdentity& identity() const { return identity_; }
  bool cma_allowed() const { return cma_allowed_; }
  TaskThread& copier() { return *copier_; }
  // Same-host copies run on up to max_copy_lanes() threads: the copier is lane 0, lanes 1.. are
  // extra threads made on first use (a daemon that never copies on its host never starts them).
  int max_copy_lanes() const { return max_copy_lanes_; }
  TaskThread& copy_lane(int i);
  bool OnThread() const { return std::this_thread::get_id() == thread_.get_id(); }

  // Runs fn on the progress thread, in order of posting.
  void Post(std::function<void()> fn);
  // Runs fn on the progress thread and returns its status (inline when already on it).
  Status RunSync(std::function<Status()> fn);

  void SetSink(NotificationSink sink) {
    auto p = sink ? std::make_shared<const NotificationSink>(std::move(sink)) : nullptr;
    std::lock_guard<std::mutex> lock(sink_mu_);
    sink_ = std::move(p);
  }

  // Progress-thread only: writes and closes in flight keep the thread spinning.
  int busy = 0;
  // Progress-thread only: periodic checks (close deadlines) run each loop while non-empty.
  std::unordered_map<void*, std::function<bool()>> watchers;

 private:
  Worker() = default;
  void Loop();
  static ucs_status_t OnAm(void* arg, const void* header, size_t header_length, void* data,
                           size_t length, const ucp_am_recv_param_t* param);

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::string address_;
  bool cuda_memory_ = false;
  HostIdentity identity_;
  bool cma_allowed_ = false;
  std::unique_ptr<TaskThread> copier_;
  int max_copy_lanes_ = 1;
  std::mutex lanes_mu_;
  std::vector<std::unique_ptr<TaskThread>> lanes_;  // lanes 1.. (index i - 1)
  int worker_fd_ = -1;
  int wake_fd_ = -1;
  std::thread thread_;

  std::mutex mu_;
  std::deque<std::function<void()>> queue_;
  std::atomic<bool> sleeping_{false};
  std::atomic<bool> stopping_{false};

  std::mutex sink_mu_;
  std::shared_ptr<const NotificationSink> sink_;
};

Result<std::shared_ptr<Worker>> Worker::Create(const TransportOptions& options) {
  std::shared_ptr<Worker> w(new Worker());
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return FromUcs(st, "ucp_config_read");
  struct ConfigGuard {
    ucp_config_t* c;
    ~ConfigGuard() { ucp_config_release(c); }
  } config_guard{config};
  if (!options.ucx_tls.empty()) {
    st = ucp_config_modify(config, "TLS", options.ucx_tls.c_str());
    if (st != UCS_OK) return FromUcs(st, "UCX_TLS=" + options.ucx_tls).WithContext("ucx");
  }
  if (!options.ucx_net_devices.empty()) {
    st = ucp_config_modify(config, "NET_DEVICES", options.ucx_net_devices.c_str());
    if (st != UCS_OK) {
      return FromUcs(st, "UCX_NET_DEVICES=" + options.ucx_net_devices).WithContext("ucx");
    }
  }

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.name = "kvstream";
  st = ucp_init(&params, config, &w->context_);
  if (st != UCS_OK) return FromUcs(st, "ucp_init").WithContext("ucx");

  ucp_context_attr_t cattr{};
  cattr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (ucp_context_query(w->context_, &cattr) == UCS_OK) {
    w->cuda_memory_ = (cattr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
  }

  // SERIALIZED: the worker is created here and used only by the progress thread afterwards.
  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  st = ucp_worker_create(w->context_, &wparams, &w->worker_);
  if (st != UCS_OK) return FromUcs(st, "ucp_worker_create").WithContext("ucx");

  ucp_address_t* addr = nullptr;
  size_t addr_len = 0;
  st = ucp_worker_get_address(w->worker_, &addr, &addr_len);
  if (st != UCS_OK) return FromUcs(st, "ucp_worker_get_address").WithContext("ucx");
  w->identity_ = LocalIdentity();
  w->cma_allowed_ = TlsAllowsCma(options.ucx_tls);
  std::string payload(sizeof(HostIdentity) + addr_len, '\0');
  std::memcpy(payload.data(), &w->identity_, sizeof(HostIdentity));
  std::memcpy(payload.data() + sizeof(HostIdentity), addr, addr_len);
  w->address_ = Seal(kAddressTag, payload.data(), payload.size());
  ucp_worker_release_address(w->worker_, addr);

  ucp_am_handler_param_t am{};
  am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                  UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  am.id = kNotifyAmId;
  am.flags = UCP_AM_FLAG_WHOLE_MSG;
  am.cb = &Worker::OnAm;
  am.arg = w.get();
  st = ucp_worker_set_am_recv_handler(w->worker_, &am);
  if (st != UCS_OK) return FromUcs(st, "ucp_worker_set_am_recv_handler").WithContext("ucx");

  st = ucp_worker_get_efd(w->worker_, &w->worker_fd_);
  if (st != UCS_OK) return FromUcs(st, "ucp_worker_get_efd").WithContext("ucx");
  w->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (w->wake_fd_ < 0) return Internal("ucx: eventfd: " + std::string(std::strerror(errno)));

  w->copier_ = std::make_unique<TaskThread>();
  // One kernel copy (process_vm_writev or memcpy) runs at about one core's memory bandwidth
  // (4-7 GB/s measured on the H200 host); lanes split a write's bytes over several threads.
  // KVSTREAM_UCX_COPY_LANES overrides (1 = the copier alone).
  w->max_copy_lanes_ =
      static_cast<int>(std::clamp(std::thread::hardware_concurrency() / 2, 1u, 8u));
  if (const char* e = std::getenv("KVSTREAM_UCX_COPY_LANES")) {
    const int v = std::atoi(e);
    if (v >= 1) w->max_copy_lanes_ = std::min(v, 32);
  }
  w->thread_ = std::thread([raw = w.get()] { raw->Loop(); });
  return w;
}

Worker::~Worker() {
  if (thread_.joinable()) {
    stopping_.store(true);
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
    thread_.join();
  }
  // Reverse order of creation. A copier task waits for its lanes, so once the copier is
  // drained no lane has work left.
  copier_.reset();
  lanes_.clear();
  if (wake_fd_ >= 0) close(wake_fd_);
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
}

TaskThread& Worker::copy_lane(int i) {
  std::lock_guard<std::mutex> lock(lanes_mu_);
  while (static_cast<int>(lanes_.size()) < i) lanes_.push_back(std::make_unique<TaskThread>());
  return *lanes_[i - 1];
}

void Worker::Post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(fn));
  }
  if (sleeping_.load()) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
  }
}

Status Worker::RunSync(std::function<Status()> fn) {
  if (OnThread()) return fn();
  struct Sync {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    Status status;
  };
  auto sync = std::make_shared<Sync>();
  Post([sync, fn = std::move(fn)] {
    Status s = fn();
    {
      std::lock_guard<std::mutex> lock(sync->mu);
      sync->status = std::move(s);
      sync->done = true;
    }
    sync->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(sync->mu);
  if (!sync->cv.wait_until(lock, Clock::now() + kSyncCallTimeout, [&] { return sync->done; })) {
    return Internal("ucx: progress thread did not answer within 30 s");
  }
  return sync->status;
}

void Worker::Loop() {
  std::deque<std::function<void()>> batch;
  auto last_event = Clock::now();
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      batch.swap(queue_);
    }
    bool active = !batch.empty();
    for (auto& fn : batch) fn();
    batch.clear();
    while (ucp_worker_progress(worker_) != 0) active = true;
    if (!watchers.empty()) {
      for (auto it = watchers.begin(); it != watchers.end();) {
        it = it->second() ? watchers.erase(it) : std::next(it);
      }
    }
    auto now = Clock::now();
    if (active) {
      last_event = now;
      continue;
    }
    if (stopping_.load() && busy == 0) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!queue_.empty()) continue;
      }
      // Let connection set-up messages UCX still has queued go out before the worker is
      // destroyed (UCX 1.13 asserts on a pending wireup reply when purging it).
      for (auto until = Clock::now() + kStopLinger; Clock::now() < until;) {
        if (ucp_worker_progress(worker_) == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      break;
    }
    if (now - last_event < (busy > 0 ? std::chrono::microseconds(kBusySpin) : kIdleSpin)) {
      continue;
    }
    sleeping_.store(true);
    bool queued;
    {
      std::lock_guard<std::mutex> lock(mu_);
      queued = !queue_.empty();
    }
    if (!queued && !stopping_.load() && ucp_worker_arm(worker_) == UCS_OK) {
      pollfd fds[2] = {{worker_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      poll(fds, 2, busy > 0 || !watchers.empty() ? 1 : 100);
      if (fds[1].revents & POLLIN) {
        uint64_t v;
        [[maybe_unused]] ssize_t n = read(wake_fd_, &v, sizeof(v));
      }
    }
    sleeping_.store(false);
    if (busy == 0) last_event = Clock::now();
  }
}

ucs_status_t Worker::OnAm(void* arg, const void* header, size_t header_length, void*, size_t,
                          const ucp_am_recv_param_t*) {
  auto* self = static_cast<Worker*>(arg);
  NotifyWire wire;
  if (header_length != sizeof(wire)) {
    KV_LOG_WARN << "ucx: dropped a notification with a " << header_length << "-byte header";
    return UCS_OK;
  }
  std::memcpy(&wire, header, sizeof(wire));
  if (wire.magic != kNotifyMagic) {
    KV_LOG_WARN << "ucx: dropped a notification of another wire version";
    return UCS_OK;
  }
  std::shared_ptr<const NotificationSink> sink;
  {
    std::lock_guard<std::mutex> lock(self->sink_mu_);
    sink = self->sink_;
  }
  if (sink) (*sink)(Notification{wire.request_id, wire.layer, wire.flags});
  return UCS_OK;
}

// ---- registrations ------------------------------------------------------------------------------

struct RegState {
  std::shared_ptr<Worker> worker;
  ucp_mem_h memh = nullptr;
  MemoryRegion region;
  std::string key;
  int memfd = -1;            // Allocate(): the memory is this memfd, mapped at region.addr
  size_t mapped_length = 0;

  ~RegState() {
    if (memh != nullptr) {
      ucp_context_h ctx = worker->context();
      ucp_mem_h m = memh;
      Status s = worker->RunSync([ctx, m] {
        ucs_status_t st = ucp_mem_unmap(ctx, m);
        return st == UCS_OK ? OkStatus() : FromUcs(st, "ucp_mem_unmap");
      });
      if (!s.ok()) {
        KV_LOG_WARN << "ucx: deregistration failed: " << s.ToString();
      }
    }
    if (mapped_length != 0) munmap(region.addr, mapped_length);
    if (memfd >= 0) close(memfd);
  }
};

class UcxRegistration final : public Registration {
 public:
  explicit UcxRegistration(std::shared_ptr<RegState> s) : s_(std::move(s)) {}
  const MemoryRegion& region() const override { return s_->region; }
  std::string RemoteKey() const override { return s_->key; }
  const std::shared_ptr<RegState>& state() const { return s_; }

 private:
  std::shared_ptr<RegState> s_;
};

// ---- endpoints and writes -------------------------------------------------------------------

struct EpState {
  Worker* worker = nullptr;
  ucp_ep_h ep = nullptr;
  std::vector<ucp_rkey_h> rkeys;
  std::vector<RemoteRegion> regions;  // keys cleared; addr and length kept

  // Same-host peer reachable with process_vm_writev (0 = use UCX puts). Set before use.
  pid_t cma_pid = 0;
  int pidfd = -1;  // tells when that process exits
  // Per remote region: the peer's memfd mapped here (nullptr = none); writes then memcpy.
  struct PeerMap {
    uint8_t* ptr = nullptr;
    size_t length = 0;
    uint64_t base = 0;
  };
  std::vector<PeerMap> maps;
  std::vector<SharedFile> shared;  // from the keys, per region

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

  ~EpState() {
    for (PeerMap& m : maps) {
      if (m.ptr != nullptr) munmap(m.ptr, m.length);
    }
    if (pidfd >= 0) close(pidfd);
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

void OnEpError(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* ep = static_cast<EpState*>(arg);
  ep->MarkFailed(RemoteDisconnect(std::string("ucx: peer lost: ") + ucs_status_string(status)));
}

struct WriteOp {
  std::shared_ptr<WriteCompletion> completion;
  std::shared_ptr<EpState> ep;
  std::shared_ptr<RegState> reg;
  uint64_t remote_base = 0;
  ucp_rkey_h rkey = nullptr;
  uint8_t* mapped_dst = nullptr;  // the remote region mapped here (same host, memfd)
  std::vector<Run> runs;
  bool notify = false;
  NotifyWire wire{};
  Status put_error;
};

void MaybeSignalClosed(EpState* ep) {
  if (!ep->closing || ep->ep != nullptr || ep->inflight != 0) return;
  {
    std::lock_guard<std::mutex> lock(ep->mu);
    if (ep->closed) return;
    ep->closed = true;
  }
  ep->closed_cv.notify_all();
}

void FinishWrite(WriteOp* op, Status status) {
  op->completion->Complete(std::move(status));
  EpState* ep = op->ep.get();
  --ep->inflight;
  --ep->worker->busy;
  std::shared_ptr<EpState> keep = std::move(op->ep);
  delete op;
  MaybeSignalClosed(ep);
}

// A failed request on a lost or closing endpoint reports why the endpoint went away.
Status OpFailure(WriteOp* op, ucs_status_t st, const char* what) {
  if (op->ep->failed.load()) return op->ep->Error();
  if (st == UCS_ERR_CANCELED) return Canceled("ucx: write canceled: endpoint closed");
  return FromUcs(st, std::string("ucx: ") + what);
}

void OnNotifySent(void* request, ucs_status_t st, void* user) {
  auto* op = static_cast<WriteOp*>(user);
  if (request != nullptr) ucp_request_free(request);
  FinishWrite(op, st == UCS_OK ? OkStatus() : OpFailure(op, st, "notification"));
}

void OnWriteFlushed(void* request, ucs_status_t st, void* user) {
  auto* op = static_cast<WriteOp*>(user);
  if (request != nullptr) ucp_request_free(request);
  if (st != UCS_OK) return FinishWrite(op, OpFailure(op, st, "flush"));
  if (!op->put_error.ok()) return FinishWrite(op, op->put_error);
  if (!op->notify) return FinishWrite(op, OkStatus());
  if (op->completion->cancel_requested()) {
    return FinishWrite(op, Canceled("ucx: write canceled before its notification"));
  }
  if (op->ep->closing.load() || op->ep->ep == nullptr) {
    return FinishWrite(op, Canceled("ucx: endpoint closed before the notification"));
  }
  // Every put is complete at the destination: now the notification may go.
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                   UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_AM_SEND_FLAG_EAGER;
  p.cb.send = &OnNotifySent;
  p.user_data = op;
  ucs_status_ptr_t r =
      ucp_am_send_nbx(op->ep->ep, kNotifyAmId, &op->wire, sizeof(op->wire), nullptr, 0, &p);
  if (r == nullptr) return OnNotifySent(nullptr, UCS_OK, op);
  if (UCS_PTR_IS_ERR(r)) return OnNotifySent(nullptr, UCS_PTR_STATUS(r), op);
}

// ---- same-host copies (CMA) ------------------------------------------------------------------

bool ProcessExited(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

void AfterCmaCopy(WriteOp* op, Status st) {
  EpState* ep = op->ep.get();
  ++ep->worker->busy;
  if (!st.ok()) {
    if (st.code() == StatusCode::kRemoteDisconnect) ep->MarkFailed(st);
    return FinishWrite(op, std::move(st));
  }
  // process_vm_writev returned: every byte is in the peer's memory, no flush needed.
  OnWriteFlushed(nullptr, UCS_OK, op);
}

// Copies `runs` (a lane's share of the op) with process_vm_writev, or memcpy into the mapped
// peer memory; checks cancel, close, failure and the peer's exit between slices.
Status CopyLane(WriteOp* op, const std::vector<Run>& runs) {
  constexpr size_t kBatch = 64;
  EpState* ep = op->ep.get();
  auto* base = static_cast<uint8_t*>(op->reg->region.addr);
  size_t idx = 0;
  uint64_t done_in_run = 0;
  while (idx < runs.size()) {
    if (ep->closing.load()) return Canceled("ucx: endpoint closed");
    if (op->completion->cancel_requested()) return Canceled("ucx: write canceled");
    if (ep->failed.load()) return ep->Error();
    if (ProcessExited(ep->pidfd)) return RemoteDisconnect("ucx: the peer process exited");
    if (op->mapped_dst != nullptr) {
      // A shared mapping of the peer's memory: copy in slices so cancel and close act fast.
      constexpr uint64_t kSlice = 8 << 20;
      const Run& run = runs[idx];
      uint64_t n = std::min<uint64_t>(kSlice, run.length - done_in_run);
      std::memcpy(op->mapped_dst + run.remote_offset + done_in_run,
                  base + run.local_offset + done_in_run, n);
      done_in_run += n;
      if (done_in_run == run.length) {
        ++idx;
        done_in_run = 0;
      }
      continue;
    }
    iovec local[kBatch], remote[kBatch];
    size_t n = 0;
    for (size_t j = idx; j < runs.size() && n < kBatch; ++j, ++n) {
      uint64_t skip = j == idx ? done_in_run : 0;
      local[n] = {base + runs[j].local_offset + skip, runs[j].length - skip};
      remote[n] = {reinterpret_cast<void*>(op->remote_base + runs[j].remote_offset + skip),
                   runs[j].length - skip};
    }
    ssize_t got = process_vm_writev(ep->cma_pid, local, n, remote, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      std::string m = std::string("ucx: process_vm_writev: ") + std::strerror(e);
      return e == ESRCH    ? RemoteDisconnect(m)
             : e == EFAULT ? FailedPrecondition(m + " (a region is no longer mapped)")
             : e == ENOMEM ? ResourceExhausted(m)
                           : Internal(m);
    }
    if (got == 0) return Internal("ucx: process_vm_writev made no progress");
    for (uint64_t left = static_cast<uint64_t>(got); left > 0 && idx < runs.size();) {
      uint64_t rest = runs[idx].length - done_in_run;
      if (left >= rest) {
        left -= rest;
        ++idx;
        done_in_run = 0;
      } else {
        done_in_run += left;
        left = 0;
      }
    }
  }
  return OkStatus();
}

// How many threads copy one same-host write: one per 4 MiB, up to the worker's lanes (as
// measured in bench/results/transfer_staged_lanes_2026-11-29.md; the host-staged path's 8 MiB
// chunks get 2 — finer lanes for it are not measured yet).
int CopyLanesFor(uint64_t bytes, int max_lanes) {
  constexpr uint64_t kMinLaneBytes = 4 << 20;
  return static_cast<int>(std::clamp<uint64_t>(bytes / kMinLaneBytes, 1, max_lanes));
}

// Splits runs into `lanes` groups of about equal bytes (cutting runs where needed).
std::vector<std::vector<Run>> SplitRuns(const std::vector<Run>& runs, uint64_t total, int lanes) {
  std::vector<std::vector<Run>> out(lanes);
  const uint64_t per = (total + lanes - 1) / lanes;
  int lane = 0;
  uint64_t in_lane = 0;
  for (Run r : runs) {
    while (r.length > 0) {
      const uint64_t take = lane == lanes - 1 ? r.length : std::min(r.length, per - in_lane);
      out[lane].push_back(Run{r.local_offset, r.remote_offset, take});
      r.local_offset += take;
      r.remote_offset += take;
      r.length -= take;
      in_lane += take;
      if (in_lane == per && lane < lanes - 1) {
        ++lane;
        in_lane = 0;
      }
    }
  }
  return out;
}

// Runs on the copier thread; hands the op back to the progress thread when done.
void CmaCopy(WriteOp* op) {
  EpState* ep = op->ep.get();
  uint64_t total = 0;
  for (const Run& r : op->runs) total += r.length;
  const int lanes = CopyLanesFor(total, ep->worker->max_copy_lanes());
  Status st;
  if (lanes <= 1) {
    st = CopyLane(op, op->runs);
  } else {
    std::vector<std::vector<Run>> parts = SplitRuns(op->runs, total, lanes);
    std::vector<Status> results(lanes);
    std::latch done(lanes - 1);
    for (int i = 1; i < lanes; ++i) {
      ep->worker->copy_lane(i).Post([&, i] {
        results[i] = CopyLane(op, parts[i]);
        done.count_down();
      });
    }
    results[0] = CopyLane(op, parts[0]);
    done.wait();
    // The most telling failure: a lost peer or a real error over a cancel another lane saw.
    for (Status& r : results) {
      if (r.ok()) continue;
      if (st.ok() || (st.code() == StatusCode::kCanceled && r.code() != StatusCode::kCanceled)) {
        st = r;
      }
    }
  }
  // The notification is sent by the progress thread after this: make the copies visible first.
  std::atomic_thread_fence(std::memory_order_release);
  ep->worker->Post([op, st = std::move(st)]() mutable { AfterCmaCopy(op, std::move(st)); });
}

void StartWrite(WriteOp* op) {
  EpState* ep = op->ep.get();
  ++ep->inflight;
  ++ep->worker->busy;
  if (ep->closing) return FinishWrite(op, Canceled("ucx: endpoint is closing"));
  if (op->completion->cancel_requested()) return FinishWrite(op, Canceled("ucx: write canceled"));
  if (ep->failed.load()) return FinishWrite(op, ep->Error());
  if (op->runs.empty() && !op->notify) return FinishWrite(op, OkStatus());
  if (ep->cma_pid != 0 && !op->runs.empty()) {
    // The copier owns the op until it posts it back; the progress thread need not spin.
    --ep->worker->busy;
    ep->worker->copier().Post([op] { CmaCopy(op); });
    return;
  }

  ucp_request_param_t put{};
  put.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
  put.memh = op->reg->memh;
  auto* base = static_cast<uint8_t*>(op->reg->region.addr);
  // No completion callback per put: the flush below covers all of them, and a request the put
  // returns is released at once (UCX frees it when it completes).
  for (const Run& run : op->runs) {
    if (op->completion->cancel_requested()) {
      op->put_error = Canceled("ucx: write canceled");
      break;
    }
    ucs_status_ptr_t r = ucp_put_nbx(ep->ep, base + run.local_offset, run.length,
                                     op->remote_base + run.remote_offset, op->rkey, &put);
    if (UCS_PTR_IS_ERR(r)) {
      op->put_error = OpFailure(op, UCS_PTR_STATUS(r), "ucp_put_nbx");
      break;
    }
    if (r != nullptr) ucp_request_free(r);
  }
  ucp_request_param_t fl{};
  fl.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  fl.cb.send = &OnWriteFlushed;
  fl.user_data = op;
  ucs_status_ptr_t r = ucp_ep_flush_nbx(ep->ep, &fl);
  if (r == nullptr) return OnWriteFlushed(nullptr, UCS_OK, op);
  if (UCS_PTR_IS_ERR(r)) return OnWriteFlushed(nullptr, UCS_PTR_STATUS(r), op);
}

// ---- closing an endpoint (progress thread) ---------------------------------------------------

void OnEpClosed(void* request, ucs_status_t, void* user) {
  auto* ep = static_cast<EpState*>(user);
  if (request != nullptr) ucp_request_free(request);
  // Puts that could use the keys are finished or canceled by now.
  for (ucp_rkey_h k : ep->rkeys) ucp_rkey_destroy(k);
  ep->rkeys.clear();
  ep->ep = nullptr;
  MaybeSignalClosed(ep);
}

void ForceClose(EpState* ep) {
  if (ep->force_started) return;
  ep->force_started = true;
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  p.cb.send = &OnEpClosed;
  p.user_data = ep;
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep->ep, &p);
  if (r == nullptr) return OnEpClosed(nullptr, UCS_OK, ep);
  if (UCS_PTR_IS_ERR(r)) return OnEpClosed(nullptr, UCS_PTR_STATUS(r), ep);
}

void OnCloseFlushed(void* request, ucs_status_t st, void* user);

void FlushForClose(EpState* ep) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &OnCloseFlushed;
  p.user_data = ep;
  ucs_status_ptr_t r = ucp_ep_flush_nbx(ep->ep, &p);
  if (r == nullptr) return OnCloseFlushed(nullptr, UCS_OK, ep);
  if (UCS_PTR_IS_ERR(r)) return OnCloseFlushed(nullptr, UCS_PTR_STATUS(r), ep);
}

void OnCloseFlushed(void* request, ucs_status_t st, void* user) {
  auto* ep = static_cast<EpState*>(user);
  if (request != nullptr) ucp_request_free(request);
  if (ep->force_started) return;
  // Notifications sent after an earlier flush, or same-host copies, may still be outstanding:
  // the watcher flushes again (never from here: a flush that completes at once would recurse)
  // until every write has finished, then closes; it forces the close at the deadline.
  if (st == UCS_OK && ep->inflight > 0 && !ep->failed.load() && !Expired(ep->flush_deadline)) {
    ep->reflush = true;
    return;
  }
  ForceClose(ep);
}

void BeginClose(const std::shared_ptr<EpState>& ep) {
  ep->closing = true;
  ep->flush_deadline = Clock::now() + kCloseFlushTimeout;
  Worker* w = ep->worker;
  ++w->busy;
  // The watcher holds the EpState until the close is over, and forces it at the deadline.
  w->watchers[ep.get()] = [ep, w] {
    if (!ep->force_started && (Expired(ep->flush_deadline) || ep->failed.load())) {
      ForceClose(ep.get());
    } else if (!ep->force_started && ep->reflush) {
      ep->reflush = false;
      FlushForClose(ep.get());
    }
    std::lock_guard<std::mutex> lock(ep->mu);
    if (ep->closed) --w->busy;
    return ep->closed;
  };
  if (ep->failed.load()) return ForceClose(ep.get());
  FlushForClose(ep.get());
}

class UcxEndpoint final : public Endpoint {
 public:
  UcxEndpoint(std::shared_ptr<Worker> worker, std::shared_ptr<EpState> state)
      : worker_(std::move(worker)), state_(std::move(state)) {}

  ~UcxEndpoint() override {
    std::shared_ptr<EpState> ep = state_;
    worker_->Post([ep] { BeginClose(ep); });
    std::unique_lock<std::mutex> lock(ep->mu);
    if (!ep->closed_cv.wait_until(lock, Clock::now() + kCloseWaitTimeout,
                                  [&] { return ep->closed; })) {
      // The watcher keeps the state alive; nothing dangles, but the close is late.
      KV_LOG_ERROR << "ucx: endpoint close did not finish within 10 s";
    }
  }

  Result<std::unique_ptr<WriteHandle>> Write(const WriteRequest& request) override {
    KV_RETURN_IF_ERROR(internal::CheckRequestShape(request, state_->regions.size()));
    if (request.after_stream != nullptr) {
      return NotSupported("ucx: after_stream needs a GPU backend; this one moves host memory");
    }
    const auto* local = dynamic_cast<const UcxRegistration*>(request.local);
    if (local == nullptr || local->state()->worker.get() != worker_.get()) {
      return InvalidArgument("local registration was not made by this UCX transport");
    }
    const RemoteRegion& remote = state_->regions[request.remote_region];
    KV_ASSIGN_OR_RETURN(internal::WritePlan plan,
                        internal::PlanWrite(request.ops, local->region().length, remote.length));
    if (state_->failed.load()) return state_->Error();

    auto completion = std::make_shared<WriteCompletion>(plan.bytes, plan.runs.size());
    auto* op = new WriteOp;
    op->completion = completion;
    op->ep = state_;
    op->reg = local->state();
    op->remote_base = remote.addr;
    op->rkey = state_->rkeys[request.remote_region];
    if (const EpState::PeerMap& m = state_->maps[request.remote_region]; m.ptr != nullptr) {
      op->mapped_dst = m.ptr + (remote.addr - m.base);
    }
    op->runs = std::move(plan.runs);
    op->notify = request.notify;
    op->wire = NotifyWire{kNotifyMagic, request.notification.layer,
                          request.notification.request_id, request.notification.flags, 0};
    worker_->Post([op] { StartWrite(op); });
    return std::unique_ptr<WriteHandle>(new CompletionHandle(std::move(completion)));
  }

  Status status() const override { return state_->failed.load() ? state_->Error() : OkStatus(); }
  const EpState& state() const { return *state_; }

 private:
  std::shared_ptr<Worker> worker_;
  std::shared_ptr<EpState> state_;
};

// ---- the transport -----------------------------------------------------------------------

class UcxTransport final : public Transport {
 public:
  explicit UcxTransport(std::shared_ptr<Worker> w) : worker_(std::move(w)) {}
  ~UcxTransport() override { worker_->SetSink(nullptr); }

  std::string name() const override { return "ucx"; }
  Capabilities capabilities() const override {
    Capabilities c;
    c.host_memory = true;
    c.cuda_memory = worker_->cuda_memory();
    c.remote = true;
    c.notifications = true;
    return c;
  }
  std::string LocalAddress() const override { return worker_->address(); }
  void SetNotificationSink(NotificationSink sink) override { worker_->SetSink(std::move(sink)); }

  Result<std::unique_ptr<Registration>> Register(const MemoryRegion& region) override {
    if (region.addr == nullptr || region.length == 0) {
      return InvalidArgument("ucx: cannot register an empty region");
    }
    if (region.kind == MemoryKind::kCuda && !worker_->cuda_memory()) {
      return NotSupported("ucx: this UCX build cannot register CUDA memory");
    }
    return Map(region, /*allocate=*/false);
  }

  Result<std::unique_ptr<Registration>> Allocate(size_t length) override {
    if (length == 0) return InvalidArgument("ucx: cannot allocate 0 bytes");
    MemoryRegion region;
    region.length = length;
    return Map(region, /*allocate=*/true);
  }

  Result<std::unique_ptr<Endpoint>> Connect(const PeerDescriptor& peer) override {
    KV_ASSIGN_OR_RETURN(std::string_view sealed,
                        Unseal(kAddressTag, peer.address, "peer address"));
    if (sealed.size() <= sizeof(HostIdentity)) {
      return InvalidArgument("peer address is too short");
    }
    HostIdentity peer_id;
    std::memcpy(&peer_id, sealed.data(), sizeof(peer_id));
    std::string_view address = sealed.substr(sizeof(HostIdentity));
    std::vector<std::string_view> keys;
    std::vector<SharedFile> shared;
    for (size_t i = 0; i < peer.regions.size(); ++i) {
      std::string what = "memory key of region " + std::to_string(i);
      KV_ASSIGN_OR_RETURN(std::string_view key, Unseal(kKeyTag, peer.regions[i].key, what.c_str()));
      if (key.size() <= sizeof(SharedFile)) return InvalidArgument(what + " is too short");
      SharedFile f;
      std::memcpy(&f, key.data(), sizeof(f));
      shared.push_back(f);
      keys.push_back(key.substr(sizeof(SharedFile)));
    }
    auto ep = std::make_shared<EpState>();
    ep->shared = std::move(shared);
    ep->maps.resize(peer.regions.size());
    ep->worker = worker_.get();
    ep->regions = peer.regions;
    for (auto& r : ep->regions) r.key.clear();
    Worker* w = worker_.get();
    auto create = [ep, w, address, &keys]() -> Status {
      ucp_ep_params_t p{};
      p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                     UCP_EP_PARAM_FIELD_ERR_HANDLER;
      p.address = reinterpret_cast<const ucp_address_t*>(address.data());
      p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      p.err_handler.cb = &OnEpError;
      p.err_handler.arg = ep.get();
      ucs_status_t st = ucp_ep_create(w->worker(), &p, &ep->ep);
      if (st != UCS_OK) return FromUcs(st, "ucx: ucp_ep_create");
      for (size_t i = 0; i < keys.size(); ++i) {
        ucp_rkey_h rkey = nullptr;
        st = ucp_ep_rkey_unpack(ep->ep, keys[i].data(), &rkey);
        if (st != UCS_OK) {
          Status s = FromUcs(st, "ucx: unpacking the memory key of region " + std::to_string(i));
          ep->failed.store(true);  // nothing was posted: close it right away
          BeginClose(ep);
          return s;
        }
        ep->rkeys.push_back(rkey);
      }
      return OkStatus();
    };
    Status created = worker_->RunSync(create);
    for (int attempt = 1; attempt < kConnectAttempts && !created.ok() && ep->ep == nullptr &&
                          created.code() == StatusCode::kRemoteDisconnect;
         ++attempt) {
      std::this_thread::sleep_for(std::chrono::milliseconds(25 << attempt));
      created = worker_->RunSync(create);
    }
    KV_RETURN_IF_ERROR(created);
    SetUpCma(*ep, peer_id);
    return std::unique_ptr<Endpoint>(new UcxEndpoint(worker_, std::move(ep)));
  }

 private:
  // Same host and allowed by UCX_TLS: copy with process_vm_writev instead of UCX puts (UCX
  // 1.13 cannot use its shared-memory transports on endpoints with peer-failure handling).
  // The pid must still name the process that published the address (start time), and a
  // one-byte read of the first region proves the kernel lets us reach it.
  void SetUpCma(EpState& ep, const HostIdentity& peer) {
    const HostIdentity& me = worker_->identity();
    if (!worker_->cma_allowed() || ep.regions.empty() || peer.pid == 0 ||
        std::strncmp(me.boot_id, peer.boot_id, sizeof(me.boot_id)) != 0 || me.boot_id[0] == 0 ||
        me.pid_ns != peer.pid_ns) {
      return;
    }
    int fd = static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(peer.pid), 0));
    if (fd < 0) return;
    uint8_t byte;
    iovec l{&byte, 1}, r{reinterpret_cast<void*>(ep.regions[0].addr), 1};
    if (ProcessStartTime(static_cast<pid_t>(peer.pid)) != peer.start_time ||
        process_vm_readv(static_cast<pid_t>(peer.pid), &l, 1, &r, 1, 0) != 1) {
      close(fd);
      return;
    }
    ep.pidfd = fd;
    ep.cma_pid = static_cast<pid_t>(peer.pid);
    int mapped = 0;
    for (size_t i = 0; i < ep.regions.size(); ++i) mapped += MapPeerFile(ep, peer.pid, i);
    KV_LOG_INFO << "ucx: peer pid " << peer.pid << " is on this host: writes copy directly ("
                << mapped << " of " << ep.regions.size() << " regions mapped, the others with "
                << "process_vm_writev)";
  }

  // Maps the peer's memfd behind region i, when it published one and it is the same file
  // (inode and device) covering the region; true when mapped.
  static bool MapPeerFile(EpState& ep, uint32_t pid, size_t i) {
    void* p = MapSharedFile(pid, ep.shared[i], ep.regions[i]);
    if (p == MAP_FAILED) return false;
    ep.maps[i] = EpState::PeerMap{static_cast<uint8_t*>(p), ep.shared[i].length, ep.shared[i].base};
    return true;
  }

  Result<std::unique_ptr<Registration>> Map(const MemoryRegion& region, bool allocate) {
    auto state = std::make_shared<RegState>();
    state->worker = worker_;
    state->region = region;
    SharedFile shared;
    if (allocate && worker_->cma_allowed()) {
      // Back it with a memfd that a writer on this host can map and copy into directly.
      int fd = memfd_create("kvstream-region", MFD_CLOEXEC);
      if (fd < 0) return Internal(std::string("ucx: memfd_create: ") + std::strerror(errno));
      state->memfd = fd;  // from here on ~RegState closes it
      struct stat st {};
      if (ftruncate(fd, static_cast<off_t>(region.length)) != 0 || fstat(fd, &st) != 0) {
        return ResourceExhausted("ucx: sizing a " + std::to_string(region.length) +
                                 "-byte memfd: " + std::strerror(errno));
      }
      void* p = mmap(nullptr, region.length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) return ResourceExhausted(std::string("ucx: mmap: ") + std::strerror(errno));
      state->region.addr = p;
      state->mapped_length = region.length;
      shared = SharedFile{fd, 0, static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_dev),
                          reinterpret_cast<uint64_t>(p), region.length};
      allocate = false;  // registered with UCX like caller memory
    }
    ucp_context_h ctx = worker_->context();
    Status s = worker_->RunSync([ctx, state, allocate, shared]() -> Status {
      ucp_mem_map_params_t p{};
      p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
      p.address = state->region.addr;
      p.length = state->region.length;
      if (allocate) {
        p.field_mask |= UCP_MEM_MAP_PARAM_FIELD_FLAGS;
        p.flags = UCP_MEM_MAP_ALLOCATE;
      } else {
        p.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
        p.memory_type = state->region.kind == MemoryKind::kCuda ? UCS_MEMORY_TYPE_CUDA
                                                                 : UCS_MEMORY_TYPE_HOST;
      }
      ucp_mem_h memh = nullptr;
      ucs_status_t st = ucp_mem_map(ctx, &p, &memh);
      if (st != UCS_OK) return FromUcs(st, "ucx: ucp_mem_map");
      state->memh = memh;  // from here on ~RegState unmaps
      if (allocate) {
        ucp_mem_attr_t attr{};
        attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
        st = ucp_mem_query(memh, &attr);
        if (st != UCS_OK) return FromUcs(st, "ucx: ucp_mem_query");
        state->region.addr = attr.address;
        state->region.length = std::min(attr.length, state->region.length);
      }
      void* packed = nullptr;
      size_t packed_len = 0;
      st = ucp_rkey_pack(ctx, memh, &packed, &packed_len);
      if (st != UCS_OK) return FromUcs(st, "ucx: ucp_rkey_pack");
      std::string payload(sizeof(SharedFile) + packed_len, '\0');
      std::memcpy(payload.data(), &shared, sizeof(SharedFile));
      std::memcpy(payload.data() + sizeof(SharedFile), packed, packed_len);
      state->key = Seal(kKeyTag, payload.data(), payload.size());
      ucp_rkey_buffer_release(packed);
      return OkStatus();
    });
    KV_RETURN_IF_ERROR(s);
    return std::unique_ptr<Registration>(new UcxRegistration(std::move(state)));
  }

  std::shared_ptr<Worker> worker_;
};

}  // namespace

Result<std::unique_ptr<Transport>> CreateUcxTransport(const TransportOptions& options) {
  KV_ASSIGN_OR_RETURN(std::shared_ptr<Worker> worker, Worker::Create(options));
  return std::unique_ptr<Transport>(new UcxTransport(std::move(worker)));
}

PeerMapping::~PeerMapping() {
  if (map_ != nullptr) munmap(map_, map_length_);
}

Result<std::unique_ptr<PeerMapping>> MapPeerRegion(const Endpoint& endpoint, int region) {
  const auto* ep = dynamic_cast<const UcxEndpoint*>(&endpoint);
  if (ep == nullptr) return NotSupported("ucx MapPeerRegion: not an endpoint of the UCX backend");
  const EpState& st = ep->state();
  if (region < 0 || static_cast<size_t>(region) >= st.regions.size()) {
    return InvalidArgument("ucx MapPeerRegion: region " + std::to_string(region) +
                           " out of range (peer has " + std::to_string(st.regions.size()) + ")");
  }
  const size_t i = static_cast<size_t>(region);
  // The endpoint's own mapping proves the checks of SetUpCma passed (same host, the pid still
  // the publisher, a memfd covering the region); map the file once more for the caller.
  if (st.cma_pid == 0 || st.maps[i].ptr == nullptr) {
    return NotSupported("ucx: region " + std::to_string(region) +
                        " is not reachable as a same-host mapping (peer on another host, memory "
                        "the peer registered rather than allocated, or shared memory off)");
  }
  void* p = MapSharedFile(static_cast<uint32_t>(st.cma_pid), st.shared[i], st.regions[i]);
  if (p == MAP_FAILED) {
    return Unavailable("ucx: mapping the peer's memfd again failed: " +
                       std::string(std::strerror(errno)));
  }
  return std::make_unique<PeerMapping>(p, st.shared[i].length,
                                       st.regions[i].addr - st.shared[i].base, st.regions[i].length);
}

}  // namespace kvstream::transport::ucx
