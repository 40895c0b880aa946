#include "transport/ucx/ucx_worker.h"

#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "common/log.h"
#include "common/time.h"
#include "transport/ucx/ucx_receiver.h"
#include "transport/ucx/ucx_transport.h"

namespace kvstream::transport::ucx {
namespace {

constexpr auto kCloseFlushTimeout = std::chrono::seconds(2);
constexpr auto kSyncCallTimeout = std::chrono::seconds(30);
// The progress thread spins this long after the last event before it sleeps on the event fds;
// while writes are in flight it spins up to kBusySpin without progress before sleeping in
// short naps (a stalled peer should not cost a whole core).
constexpr auto kIdleSpin = std::chrono::microseconds(200);
constexpr auto kBusySpin = std::chrono::milliseconds(5);
constexpr auto kStopLinger = std::chrono::milliseconds(20);

// Whether the UCX transport selection admits shared-memory copies (UCX_TLS semantics:
// empty = all, "^a,b" = all but a and b).
bool TlsAllowsCma(std::string tls) {
  if (tls.empty()) {
    const char* env = std::getenv("UCX_TLS");
    tls = env ? env : "";
  }
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

// Where the listener binds: the first of `net_devices` (UCX's syntax, "eth1,mlx5_0:1") that is
// a network interface with an address (IPv4 first), else every interface (0.0.0.0).
WireSockAddr ListenAddress(const std::string& net_devices) {
  WireSockAddr any;
  any.family = AF_INET;
  ifaddrs* list = nullptr;
  if (net_devices.empty() || getifaddrs(&list) != 0) return any;
  WireSockAddr found;
  std::stringstream ss(net_devices);
  for (std::string dev; found.family == 0 && std::getline(ss, dev, ',');) {
    dev = dev.substr(0, dev.find(':'));
    for (int family : {AF_INET, AF_INET6}) {
      for (ifaddrs* i = list; i != nullptr && found.family == 0; i = i->ifa_next) {
        if (i->ifa_addr != nullptr && i->ifa_addr->sa_family == family && dev == i->ifa_name) {
          found = ToWire(i->ifa_addr);
          // A link-local IPv6 address needs its scope: not worth it here.
          if (family == AF_INET6 && found.addr[0] == 0xfe && (found.addr[1] & 0xc0) == 0x80) {
            found = WireSockAddr{};
          }
        }
      }
    }
  }
  freeifaddrs(list);
  return found.family != 0 ? found : any;
}

uint64_t RandomClientId() {
  uint64_t id = 0;
  while (id == 0) {
    if (getrandom(&id, sizeof(id), 0) != static_cast<ssize_t>(sizeof(id))) id = 0;
  }
  return id;
}

}  // namespace

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

Result<std::shared_ptr<UcxWorker>> UcxWorker::Create(const UcxOptions& options) {
  {
    const char* env = std::getenv("UCX_TLS");
    std::string tls = !options.tls.empty() ? options.tls : (env ? env : "");
    if (TlsLacksPeerFailureTransport(tls)) {
      KV_LOG_WARN << "ucx: UCX_TLS=" << tls << " names only shared-memory transports, which "
                  << "cannot detect a failed peer; kvstream's endpoints need that (UCX peer error "
                  << "handling), so connecting to a peer will fail. Add a network transport, e.g. "
                  << "sm,tcp: peers on this host still copy directly through the same-host gate "
                  << "(docs/transports.md)";
    }
  }
  // Callbacks and copies hold references too (a landing data message holds its region, which
  // holds the worker): when one of them is the last, the worker is destroyed on another thread.
  std::shared_ptr<UcxWorker> w(new UcxWorker(), [](UcxWorker* p) {
    if (p->OnInternalThread()) {
      std::thread([p] { delete p; }).detach();
    } else {
      delete p;
    }
  });
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return FromUcs(st, "ucp_config_read");
  struct ConfigGuard {
    ucp_config_t* c;
    ~ConfigGuard() { ucp_config_release(c); }
  } config_guard{config};
  // Peers' worker addresses are checked (ucx_blob_check.h) in the non-unified layout.
  st = ucp_config_modify(config, "UNIFIED_MODE", "n");
  if (st != UCS_OK) return FromUcs(st, "UCX_UNIFIED_MODE=n").WithContext("ucx");
  if (!options.tls.empty()) {
    st = ucp_config_modify(config, "TLS", options.tls.c_str());
    if (st != UCS_OK) return FromUcs(st, "UCX_TLS=" + options.tls).WithContext("ucx");
  }
  if (!options.net_devices.empty()) {
    st = ucp_config_modify(config, "NET_DEVICES", options.net_devices.c_str());
    if (st != UCS_OK) {
      return FromUcs(st, "UCX_NET_DEVICES=" + options.net_devices).WithContext("ucx");
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
  // With CUDA, the KV pools (memory mapped with the CUDA VMM API) must be registrable:
  //  - registered as the range given, never widened to its whole allocation (UCX 1.13 takes a
  //    nil base for VMM memory and the registration fails): CUDA_COPY_REG_WHOLE_ALLOC=off (a
  //    memory-domain setting: UCX 1.13 warns "invalid configuration" at each worker, whose
  //    check looks at interface settings only; setting it in the environment here did not take);
  //  - without cuda_ipc, which cannot register VMM memory (cuIpcGetMemHandle) and is a same-host
  //    path (kvstream's own cuda_ipc backend is that): left out of an empty selection.
  // Both exist only where UCX has its CUDA transports, so the context is made again with them;
  // what the user set is kept.
  if (ucp_context_query(w->context_, &cattr) == UCS_OK &&
      (cattr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0) {
    const char* env_tls = std::getenv("UCX_TLS");
    const bool default_tls = options.tls.empty() && (env_tls == nullptr || *env_tls == 0);
    const bool whole_alloc_set = std::getenv("UCX_CUDA_COPY_REG_WHOLE_ALLOC") != nullptr;
    if (default_tls || !whole_alloc_set) {
      ucp_cleanup(w->context_);
      w->context_ = nullptr;
      ucp_config_t* again = nullptr;
      st = ucp_config_read(nullptr, nullptr, &again);
      if (st != UCS_OK) return FromUcs(st, "ucp_config_read");
      ucp_config_release(config_guard.c);
      config_guard.c = config = again;
      st = ucp_config_modify(config, "UNIFIED_MODE", "n");
      if (st == UCS_OK && !whole_alloc_set) {
        st = ucp_config_modify(config, "CUDA_COPY_REG_WHOLE_ALLOC", "off");
      }
      if (st == UCS_OK && default_tls) st = ucp_config_modify(config, "TLS", "^cuda_ipc");
      if (st == UCS_OK && !options.tls.empty()) st = ucp_config_modify(config, "TLS", options.tls.c_str());
      if (st == UCS_OK && !options.net_devices.empty()) {
        st = ucp_config_modify(config, "NET_DEVICES", options.net_devices.c_str());
      }
      if (st != UCS_OK) return FromUcs(st, "configuring UCX for CUDA memory").WithContext("ucx");
      st = ucp_init(&params, config, &w->context_);
      if (st != UCS_OK) return FromUcs(st, "ucp_init").WithContext("ucx");
    }
  }
  if (ucp_context_query(w->context_, &cattr) == UCS_OK) {
    unsigned major = 0, minor = 0, release = 0;
    ucp_get_version(&major, &minor, &release);
    w->cuda_memory_ =
        MovesCudaMemory(major, minor, (cattr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0);
  }

  // SERIALIZED: the worker is created here and used only by the progress thread afterwards.
  // Its client id goes out in every connection request it makes (the peer admits it).
  w->client_id_ = RandomClientId();
  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_CLIENT_ID;
  wparams.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  wparams.client_id = w->client_id_;
  st = ucp_worker_create(w->context_, &wparams, &w->worker_);
  if (st != UCS_OK) return FromUcs(st, "ucp_worker_create").WithContext("ucx");

  // Writers connect to the listener; no worker address is published (ucx_admission.h).
  w->admission_ = std::make_unique<Admission>(w.get(), options.admit_any);
  WireSockAddr listen = ListenAddress(options.net_devices);
  {
    sockaddr_storage sa;
    unsigned sa_len = 0;
    listen.port = 1;  // FromWire wants a port; the listener's is picked by the kernel (0)
    FromWire(listen, &sa, &sa_len);
    reinterpret_cast<sockaddr_in*>(&sa)->sin_port = 0;  // same offset in sockaddr_in6
    ucp_listener_params_t lp{};
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);
    lp.sockaddr.addrlen = sa_len;
    lp.conn_handler.cb = &Admission::OnConnRequest;
    lp.conn_handler.arg = w->admission_.get();
    st = ucp_listener_create(w->worker_, &lp, &w->listener_);
    if (st != UCS_OK) {
      return FromUcs(st, "ucp_listener_create on " + ToString(listen))
          .WithContext("ucx: cannot listen for writers (UCX needs its tcp connection manager)");
    }
    ucp_listener_attr_t la{};
    la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    st = ucp_listener_query(w->listener_, &la);
    if (st != UCS_OK) return FromUcs(st, "ucp_listener_query").WithContext("ucx");
    listen.port = ToWire(reinterpret_cast<const sockaddr*>(&la.sockaddr)).port;
    KV_LOG_INFO << "ucx: writers connect to the listener at " << ToString(listen)
                << (options.admit_any ? " (every connection accepted)"
                                      : " (only connections a handshake admits)");
  }
  w->identity_ = LocalHostIdentity();
  w->cma_allowed_ = options.same_host_copy && TlsAllowsCma(options.tls);
  if (w->cma_allowed_) {
    auto gate = SameHostGate::Create();
    if (gate.ok()) {
      w->gate_ = std::move(gate).value();
      const std::string& path = w->gate_->path();
      std::memcpy(w->identity_.gate_path, path.c_str(),
                  std::min(path.size() + 1, sizeof(w->identity_.gate_path)));
    } else {
      KV_LOG_WARN << "ucx: no same-host shortcut for writers to this process: "
                  << gate.status().ToString();
    }
  }
  w->listen_ = listen;

  ucp_am_handler_param_t am{};
  am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                  UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  am.id = kNotifyAmId;
  am.flags = UCP_AM_FLAG_WHOLE_MSG;
  am.cb = &OnNotificationMessage;
  am.arg = w.get();
  st = ucp_worker_set_am_recv_handler(w->worker_, &am);
  if (st != UCS_OK) return FromUcs(st, "ucp_worker_set_am_recv_handler").WithContext("ucx");
  // Data messages: PERSISTENT_DATA so that even a small (eager) one comes as a descriptor that
  // ucp_am_recv_data_nbx can land in CUDA memory.
  am.id = kDataAmId;
  am.flags = UCP_AM_FLAG_WHOLE_MSG | UCP_AM_FLAG_PERSISTENT_DATA;
  am.cb = &OnDataMessage;
  st = ucp_worker_set_am_recv_handler(w->worker_, &am);
  if (st != UCS_OK) return FromUcs(st, "ucp_worker_set_am_recv_handler").WithContext("ucx");

  st = ucp_worker_get_efd(w->worker_, &w->worker_fd_);
  if (st != UCS_OK) return FromUcs(st, "ucp_worker_get_efd").WithContext("ucx");
  w->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (w->wake_fd_ < 0) return Internal("ucx: eventfd: " + std::string(std::strerror(errno)));

  w->copier_ = std::make_unique<TaskThread>();
  // One kernel copy (process_vm_writev or memcpy) runs at about one core's memory bandwidth
  // (4-7 GB/s measured on the H200 host); lanes split a write's bytes over several threads.
  // options.copy_lanes overrides (1 = the copier alone).
  w->max_copy_lanes_ =
      static_cast<int>(std::clamp(std::thread::hardware_concurrency() / 2, 1u, 8u));
  if (options.copy_lanes >= 1) w->max_copy_lanes_ = std::min(options.copy_lanes, 32);
  w->thread_ = std::thread([raw = w.get()] { raw->Loop(); });
  return w;
}

std::string UcxWorker::address() const {
  HostIdentity id = identity_;
  if (gate_) {
    auto token = gate_->Issue();
    if (token.ok()) {
      std::memcpy(id.gate_token, token->data(), sizeof(id.gate_token));
    } else {  // no token, no shortcut: a writer's hello is refused and it uses UCX puts
      KV_LOG_WARN << "ucx: no same-host gate token for this address: " << token.status().ToString();
    }
  }
  return EncodeAddress(id, listen_);
}

UcxWorker::~UcxWorker() {
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
  gate_.reset();
  if (listener_ != nullptr) ucp_listener_destroy(listener_);  // Create() failed after it
  if (wake_fd_ >= 0) close(wake_fd_);
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
}

bool UcxWorker::OnInternalThread() {
  if (OnThread() || (copier_ != nullptr && copier_->OnThread())) return true;
  std::lock_guard<std::mutex> lock(lanes_mu_);
  for (const auto& lane : lanes_) {
    if (lane->OnThread()) return true;
  }
  return false;
}

TaskThread& UcxWorker::copy_lane(int i) {
  std::lock_guard<std::mutex> lock(lanes_mu_);
  while (static_cast<int>(lanes_.size()) < i) lanes_.push_back(std::make_unique<TaskThread>());
  return *lanes_[i - 1];
}

void UcxWorker::Post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(fn));
  }
  if (sleeping_.load()) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
  }
}

Status UcxWorker::RunSync(std::function<Status()> fn) {
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

void UcxWorker::AddRegion(uint64_t addr, uint64_t length, std::weak_ptr<UcxRegionState> region) {
  std::lock_guard<std::mutex> lock(regions_mu_);
  const UcxRegionState* raw = region.lock().get();
  regions_[addr] = RegionEntry{length, std::move(region), raw};
}

void UcxWorker::RemoveRegion(uint64_t addr, const UcxRegionState* region) {
  std::lock_guard<std::mutex> lock(regions_mu_);
  auto it = regions_.find(addr);
  if (it != regions_.end() && it->second.raw == region) regions_.erase(it);
}

std::shared_ptr<UcxRegionState> UcxWorker::FindRegion(uint64_t addr, uint64_t length) const {
  std::lock_guard<std::mutex> lock(regions_mu_);
  auto it = regions_.upper_bound(addr);
  if (it == regions_.begin()) return nullptr;
  --it;
  const uint64_t offset = addr - it->first;
  if (offset > it->second.length || length > it->second.length - offset) return nullptr;
  return it->second.state.lock();
}

void UcxWorker::Loop() {
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
      // No new connections; those accepted are closed (bounded).
      if (listener_ != nullptr) {
        ucp_listener_destroy(listener_);
        listener_ = nullptr;
        admission_->Shutdown();
        for (auto until = Clock::now() + kCloseFlushTimeout;
             admission_->closing() && Clock::now() < until;) {
          if (ucp_worker_progress(worker_) == 0) admission_->Tick();
        }
        watchers.erase(admission_.get());
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

}  // namespace kvstream::transport::ucx
