#include "transport/ucx/ucx_transport.h"

#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "transport/core/peer_process.h"
#include "transport/ucx/ucx_receiver.h"
#include "transport/ucx/ucx_wire.h"
#include "transport/ucx/ucx_worker.h"
#include "transport/ucx/ucx_writer.h"

namespace kvstream::transport::ucx {
namespace {

// ucp_ep_create can fail with "Destination is unreachable" while the peer's interfaces are
// still coming up or the host is overloaded (seen under gVisor); it is retried this often.
constexpr int kConnectAttempts = 4;
// At most this many memory regions per peer (a daemon publishes one).
constexpr size_t kMaxRegions = 1024;

// ---- the transport -----------------------------------------------------------------------

class UcxTransport final : public Transport {
 public:
  explicit UcxTransport(std::shared_ptr<UcxWorker> w) : worker_(std::move(w)) {}
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
    return RegisterMemory(worker_, region, /*allocate=*/false);
  }

  Result<std::unique_ptr<Registration>> Allocate(size_t length) override {
    if (length == 0) return InvalidArgument("ucx: cannot allocate 0 bytes");
    MemoryRegion region;
    region.length = length;
    return RegisterMemory(worker_, region, /*allocate=*/true);
  }

  Result<std::unique_ptr<Endpoint>> Connect(const PeerDescriptor& peer) override {
    KV_ASSIGN_OR_RETURN(UcxAddress address, DecodeAddress(peer.address));
    if (peer.regions.size() > kMaxRegions) {
      return InvalidArgument("ucx: peer names " + std::to_string(peer.regions.size()) +
                             " memory regions, more than the " + std::to_string(kMaxRegions) +
                             " allowed");
    }
    for (size_t i = 0; i < peer.regions.size(); ++i) {
      const RemoteRegion& r = peer.regions[i];
      if (r.addr == 0 || r.length == 0 || r.addr + r.length < r.addr) {
        return InvalidArgument("ucx: region " + std::to_string(i) + " of the peer (address " +
                               std::to_string(r.addr) + ", " + std::to_string(r.length) +
                               " bytes) is not a memory range");
      }
    }
    std::vector<std::string_view> keys;
    std::vector<MemfdDescriptor> memfds;
    for (size_t i = 0; i < peer.regions.size(); ++i) {
      KV_ASSIGN_OR_RETURN(UcxKey key, DecodeKey(peer.regions[i].key,
                                                "memory key of region " + std::to_string(i)));
      memfds.push_back(key.memfd);
      keys.push_back(key.rkey);
    }
    auto ep = std::make_shared<UcxEndpointState>();
    ep->memfds = std::move(memfds);
    ep->maps.resize(peer.regions.size());
    ep->worker = worker_.get();
    ep->regions = peer.regions;
    for (auto& r : ep->regions) r.key.clear();
    UcxWorker* w = worker_.get();
    auto create = [ep, w, worker_address = address.worker_address, &keys]() -> Status {
      ucp_ep_params_t p{};
      p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                     UCP_EP_PARAM_FIELD_ERR_HANDLER;
      p.address = reinterpret_cast<const ucp_address_t*>(worker_address.data());
      p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      p.err_handler.cb = &OnEndpointError;
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
    SetUpCma(*ep, address.identity);
    return std::unique_ptr<Endpoint>(new UcxEndpoint(worker_, std::move(ep)));
  }

 private:
  // Same host and allowed by UCX_TLS: copy with process_vm_writev instead of UCX puts (UCX
  // 1.13 cannot use its shared-memory transports on endpoints with peer-failure handling).
  // The pid must still name the process that published the address (start time), and a
  // one-byte read of the first region proves the kernel lets us reach it.
  void SetUpCma(UcxEndpointState& ep, const HostIdentity& peer) {
    if (!worker_->cma_allowed() || ep.regions.empty() || peer.pid == 0 ||
        !SameHost(worker_->identity(), peer)) {
      return;
    }
    const auto pid = static_cast<pid_t>(peer.pid);
    internal::PeerProcess process(pid);
    if (!process.valid()) return;
    uint8_t byte;
    iovec l{&byte, 1}, r{reinterpret_cast<void*>(ep.regions[0].addr), 1};
    if (internal::ProcessStartTime(pid) != peer.start_time ||
        process_vm_readv(pid, &l, 1, &r, 1, 0) != 1) {
      return;
    }
    ep.peer_process = std::move(process);
    ep.cma_pid = pid;
    int mapped = 0;
    for (size_t i = 0; i < ep.regions.size(); ++i) mapped += MapPeerFile(ep, peer.pid, i);
    KV_LOG_INFO << "ucx: peer pid " << peer.pid << " is on this host: writes copy directly ("
                << mapped << " of " << ep.regions.size() << " regions mapped, the others with "
                << "process_vm_writev)";
  }

  // Maps the peer's memfd behind region i, when it published one and it is the same file
  // (inode and device) covering the region; true when mapped.
  static bool MapPeerFile(UcxEndpointState& ep, uint32_t pid, size_t i) {
    void* p = MapPeerMemfd(static_cast<pid_t>(pid), ep.memfds[i], ep.regions[i]);
    if (p == MAP_FAILED) return false;
    ep.maps[i] = UcxEndpointState::PeerMap{static_cast<uint8_t*>(p), ep.memfds[i].length,
                                           ep.memfds[i].base};
    return true;
  }

  std::shared_ptr<UcxWorker> worker_;
};

}  // namespace

Result<std::unique_ptr<Transport>> CreateUcxTransport(const TransportOptions& options) {
  KV_ASSIGN_OR_RETURN(std::shared_ptr<UcxWorker> worker, UcxWorker::Create(options.ucx));
  return std::unique_ptr<Transport>(new UcxTransport(std::move(worker)));
}

PeerMapping::~PeerMapping() {
  if (map_ != nullptr) munmap(map_, map_length_);
}

bool MovesCudaMemory(unsigned ucx_major, unsigned ucx_minor, bool context_reports_cuda) {
  return context_reports_cuda && (ucx_major > 1 || (ucx_major == 1 && ucx_minor >= 16));
}

Result<std::unique_ptr<PeerMapping>> MapPeerRegion(const Endpoint& endpoint, int region) {
  const auto* ep = dynamic_cast<const UcxEndpoint*>(&endpoint);
  if (ep == nullptr) return NotSupported("ucx MapPeerRegion: not an endpoint of the UCX backend");
  const UcxEndpointState& st = ep->state();
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
  void* p = MapPeerMemfd(st.cma_pid, st.memfds[i], st.regions[i]);
  if (p == MAP_FAILED) {
    return Unavailable("ucx: mapping the peer's memfd again failed: " +
                       std::string(std::strerror(errno)));
  }
  return std::make_unique<PeerMapping>(p, st.memfds[i].length,
                                       st.regions[i].addr - st.memfds[i].base, st.regions[i].length);
}

}  // namespace kvstream::transport::ucx
