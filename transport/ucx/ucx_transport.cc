#include "transport/ucx/ucx_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "transport/core/peer_process.h"
#include "transport/ucx/ucx_receiver.h"
#include "transport/ucx/ucx_same_host.h"
#include "transport/ucx/ucx_wire.h"
#include "transport/ucx/ucx_worker.h"
#include "transport/ucx/ucx_writer.h"

#if KVSTREAM_UCX_HAVE_CUDA
#include "transport/cuda/cuda_util.h"
#endif

namespace kvstream::transport::ucx {
namespace {

// At most this many memory regions per peer (a daemon publishes one).
constexpr size_t kMaxRegions = 1024;

// The peer's listener as this writer dials it: its own address, or, for a listener on every
// interface, the host the control plane saw the peer at (loopback when none is known).
Result<WireSockAddr> ListenerToDial(WireSockAddr listener, const std::string& host) {
  if (!IsWildcard(listener)) return listener;
  WireSockAddr to = listener;
  std::memset(to.addr, 0, sizeof(to.addr));
  in6_addr a6;
  in_addr a4;
  std::string h = host;
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  if (!h.empty() && inet_pton(AF_INET, h.c_str(), &a4) == 1) {
    to.family = AF_INET;
    std::memcpy(to.addr, &a4, 4);
  } else if (!h.empty() && inet_pton(AF_INET6, h.c_str(), &a6) == 1) {
    to.family = AF_INET6;
    std::memcpy(to.addr, &a6, 16);
  } else if (h.empty()) {
    to.family = AF_INET;
    to.addr[0] = 127;
    to.addr[3] = 1;
  } else {
    return InvalidArgument("ucx: the peer's host '" + host + "' is not an IP address");
  }
  return to;
}

// The address and a port of this host that a connection to `to` leaves from: the address the
// kernel routes `to` from, a port it hands out now (bound once, then freed for UCX to bind).
Result<WireSockAddr> ReserveSource(const WireSockAddr& to) {
  sockaddr_storage dst, src;
  unsigned dst_len = 0;
  FromWire(to, &dst, &dst_len);
  auto fail = [&](const char* what) {
    return Unavailable(std::string("ucx: no local address towards ") + ToString(to) + " (" +
                       what + ": " + std::strerror(errno) + ")");
  };
  int s = socket(to.family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return fail("socket");
  socklen_t len = sizeof(src);
  const bool routed = connect(s, reinterpret_cast<sockaddr*>(&dst), dst_len) == 0 &&
                      getsockname(s, reinterpret_cast<sockaddr*>(&src), &len) == 0;
  close(s);
  if (!routed) return fail("route");
  WireSockAddr from = ToWire(reinterpret_cast<sockaddr*>(&src));
  from.port = 1;
  unsigned src_len = 0;
  FromWire(from, &src, &src_len);
  reinterpret_cast<sockaddr_in*>(&src)->sin_port = 0;  // same offset in sockaddr_in6
  s = socket(to.family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return fail("socket");
  len = sizeof(src);
  const bool bound = bind(s, reinterpret_cast<sockaddr*>(&src), src_len) == 0 &&
                     getsockname(s, reinterpret_cast<sockaddr*>(&src), &len) == 0;
  close(s);
  if (!bound) return fail("bind");
  return ToWire(reinterpret_cast<sockaddr*>(&src));
}

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
    c.notification_mac = true;
    return c;
  }
  std::string LocalAddress() const override { return worker_->address(); }
  Status Admit(const std::string& ticket) override {
    if (ticket.empty()) return InvalidArgument("ucx: an empty admission ticket");
    KV_ASSIGN_OR_RETURN(UcxTicket t, DecodeTicket(ticket));
    UcxWorker* w = worker_.get();
    return worker_->RunSync([w, t] {
      w->admission().Expect(t);
      return OkStatus();
    });
  }
  TransportCounters counters() const override {
    TransportCounters c;
    c.connections_admitted = worker_->admission().admitted();
    c.connections_refused = worker_->admission().refused();
    return c;
  }
  void SetNotificationSink(NotificationSink sink) override { worker_->SetSink(std::move(sink)); }
  const std::shared_ptr<UcxWorker>& worker() const { return worker_; }

  Result<std::unique_ptr<Registration>> Register(const MemoryRegion& region) override {
    if (region.addr == nullptr || region.length == 0) {
      return InvalidArgument("ucx: cannot register an empty region");
    }
    if (region.kind == MemoryKind::kCuda && !worker_->cuda_memory()) {
      return NotSupported("ucx: this UCX build cannot register CUDA memory");
    }
#if KVSTREAM_UCX_HAVE_CUDA
    if (region.kind == MemoryKind::kCuda) {
      // CUDA memory is registered only as what it is: device memory of the device named (if
      // one is), inside one allocation. UCX checks neither, and data messages land in whatever
      // a registration spans.
      auto info = cuda::QueryDevicePointer(region.addr, region.length);
      if (!info.ok()) return info.status().WithContext("ucx Register");
      if (region.device >= 0 && info->device != region.device) {
        return InvalidArgument("ucx Register: the memory is on device " +
                               std::to_string(info->device) + ", the region names device " +
                               std::to_string(region.device));
      }
      MemoryRegion r = region;
      r.device = info->device;
      return RegisterMemory(worker_, r, /*allocate=*/false);
    }
#endif
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
    std::vector<bool> remote_cuda;
    for (size_t i = 0; i < peer.regions.size(); ++i) {
      KV_ASSIGN_OR_RETURN(UcxKey key, DecodeKey(peer.regions[i].key,
                                                "memory key of region " + std::to_string(i)));
      keys.push_back(key.rkey);
      remote_cuda.push_back(key.cuda);
    }
    auto ep = std::make_shared<UcxEndpointState>();
    ep->remote_cuda = std::move(remote_cuda);
    ep->maps.resize(peer.regions.size());
    ep->host_copy.assign(peer.regions.size(), false);
    ep->worker = worker_.get();
    ep->regions = peer.regions;
    for (auto& r : ep->regions) r.key.clear();
    // Before any UCX connection: a same-host peer proves itself and what it registered.
    KV_RETURN_IF_ERROR(SetUpSameHost(*ep, address.identity));
    KV_ASSIGN_OR_RETURN(WireSockAddr to, ListenerToDial(address.listener, peer.host));
    // The connection is made at the first write, from a socket address fixed now: the ticket
    // names it, so the receiver can admit it before it arrives (ucx_admission.h).
    KV_ASSIGN_OR_RETURN(WireSockAddr from, ReserveSource(to));
    FromWire(to, &ep->dial, &ep->dial_length);
    FromWire(from, &ep->source, &ep->source_length);
    for (std::string_view k : keys) ep->packed_keys.emplace_back(k);
    ep->ticket = EncodeTicket(UcxTicket{worker_->client_id(), from});
    return std::unique_ptr<Endpoint>(new UcxEndpoint(worker_, std::move(ep)));
  }

 private:
  // Same host and allowed by UCX_TLS: copy directly instead of UCX puts (UCX 1.13 cannot use
  // its shared-memory transports on endpoints with peer-failure handling), but only into the
  // process proven by its gate (ucx_same_host.h) and only inside the ranges it granted: a
  // region of the peer that its gate does not cover is refused (kInvalidArgument). No gate, or
  // a gate that grants nothing: UCX puts.
  Status SetUpSameHost(UcxEndpointState& ep, const HostIdentity& peer) {
    if (!worker_->cma_allowed() || ep.regions.empty() || peer.gate_path[0] == 0 ||
        !SameHost(worker_->identity(), peer)) {
      return OkStatus();
    }
    GateToken token;
    std::memcpy(token.data(), peer.gate_token, token.size());
    auto grant = JoinGate(peer.gate_path, token);
    if (!grant.ok()) {
      KV_LOG_INFO << "ucx: no same-host shortcut to the peer (" << grant.status().ToString()
                  << "): writes go through UCX";
      return OkStatus();
    }
    int mapped = 0, copied = 0;
    // CUDA regions are not the gate's: they move as data messages, landed by the receiver only
    // inside what it registered (ucx_worker.h), whichever host the writer is on.
    auto cuda = [&](size_t i) { return i < ep.remote_cuda.size() && ep.remote_cuda[i]; };
    for (size_t i = 0; i < ep.regions.size(); ++i) {
      if (cuda(i)) continue;
      const RemoteRegion& r = ep.regions[i];
      const GrantedRange* g = grant->Covering(r.addr, r.length);
      if (g == nullptr) {
        return InvalidArgument("ucx: region " + std::to_string(i) +
                               " is not memory the peer registered (its same-host gate, pid " +
                               std::to_string(grant->pid) + ", grants no such range)");
      }
      if (g->fd < 0) continue;
      void* p = mmap(nullptr, g->length, PROT_READ | PROT_WRITE, MAP_SHARED, g->fd, 0);
      int fd = p == MAP_FAILED ? -1 : fcntl(g->fd, F_DUPFD_CLOEXEC, 0);
      if (fd < 0) {
        if (p != MAP_FAILED) munmap(p, g->length);
        continue;
      }
      ep.maps[i] = UcxEndpointState::PeerMap{static_cast<uint8_t*>(p), g->length, g->addr, fd};
      ep.host_copy[i] = true;
      ++mapped;
    }
    // Registered memory (no memfd) is written with process_vm_writev: only where the kernel
    // lets this process reach the peer (ptrace access), tried on the first such region.
    for (size_t i = 0; i < ep.regions.size(); ++i) {
      if (ep.maps[i].ptr != nullptr || cuda(i)) continue;
      uint8_t byte;
      iovec l{&byte, 1}, rv{reinterpret_cast<void*>(ep.regions[i].addr), 1};
      if (process_vm_readv(grant->pid, &l, 1, &rv, 1, 0) != 1) break;
      for (size_t j = i; j < ep.regions.size(); ++j) {
        if (ep.maps[j].ptr != nullptr || cuda(j)) continue;
        ep.host_copy[j] = true;
        ++copied;
      }
      break;
    }
    if (mapped + copied == 0) return OkStatus();
    ep.cma_pid = grant->pid;
    ep.peer_process = std::move(grant->process);
    KV_LOG_INFO << "ucx: peer pid " << ep.cma_pid << " proved itself on this host: writes copy "
                << "directly (" << mapped << " regions mapped, " << copied
                << " with process_vm_writev, " << ep.regions.size() - mapped - copied
                << " through UCX)";
    return OkStatus();
  }

  std::shared_ptr<UcxWorker> worker_;
};

}  // namespace

Result<std::unique_ptr<Transport>> CreateUcxTransport(const TransportOptions& options) {
  KV_ASSIGN_OR_RETURN(std::shared_ptr<UcxWorker> worker, UcxWorker::Create(options.ucx));
  return std::unique_ptr<Transport>(new UcxTransport(std::move(worker)));
}

Result<std::unique_ptr<Endpoint>> ReplyEndpoint(Transport& transport, const std::string& ticket) {
  auto* t = dynamic_cast<UcxTransport*>(&transport);
  if (t == nullptr) return NotSupported("ucx ReplyEndpoint: not a transport of the UCX backend");
  KV_ASSIGN_OR_RETURN(UcxTicket from, DecodeTicket(ticket));
  std::shared_ptr<UcxWorker> worker = t->worker();
  auto state = std::make_shared<UcxEndpointState>();
  state->worker = worker.get();
  state->borrowed = true;
  state->connect_tried = true;
  // One empty region: notification-only writes name region 0 and copy nothing.
  state->regions.resize(1);
  state->rkeys.push_back(nullptr);
  state->host_copy.assign(1, false);
  state->maps.resize(1);
  UcxWorker* w = worker.get();
  KV_RETURN_IF_ERROR(w->RunSync([w, from, state]() -> Status {
    ucp_ep_h ep = w->admission().Find(from);
    if (ep == nullptr) {
      return Unavailable("ucx: no open connection was admitted for this ticket (from " +
                         ToString(from.source) + ")");
    }
    state->ep = ep;
    w->admission().AddReply(ep, state);
    return OkStatus();
  }));
  return std::unique_ptr<Endpoint>(new UcxEndpoint(std::move(worker), std::move(state)));
}

PeerMapping::~PeerMapping() {
  if (map_ != nullptr) munmap(map_, map_length_);
}

Result<std::string> DescribeEndpoint(const Endpoint& endpoint) {
  const auto* ep = dynamic_cast<const UcxEndpoint*>(&endpoint);
  if (ep == nullptr) return NotSupported("ucx DescribeEndpoint: not an endpoint of the UCX backend");
  const UcxEndpointState* st = &ep->state();
  std::string out;
  KV_RETURN_IF_ERROR(st->worker->RunSync([st, &out]() -> Status {
    if (st->ep == nullptr || st->borrowed) {
      return Unavailable("ucx: the endpoint has no connection of its own (no write yet, or closed)");
    }
    char* buf = nullptr;
    size_t len = 0;
    FILE* f = open_memstream(&buf, &len);
    if (f == nullptr) return Internal("ucx: open_memstream failed");
    ucp_ep_print_info(st->ep, f);
    std::fclose(f);
    out.assign(buf, len);
    std::free(buf);
    return OkStatus();
  }));
  return out;
}

bool MovesCudaMemory(unsigned ucx_major, unsigned ucx_minor, bool context_reports_cuda) {
  return context_reports_cuda && (ucx_major > 1 || (ucx_major == 1 && ucx_minor >= 13));
}

std::string TlsWithoutCuda(const std::string& tls_in) {
  static const char* kCuda[] = {"cuda_copy", "cuda_ipc", "gdr_copy", "cuda"};
  auto is_cuda = [](const std::string& t) {
    for (const char* c : kCuda) {
      if (t == c) return true;
    }
    return false;
  };
  std::string tls = tls_in;
  if (tls.empty()) {
    const char* env = std::getenv("UCX_TLS");
    tls = env ? env : "";
  }
  const std::string none = "cuda_copy,cuda_ipc,gdr_copy";
  if (tls.empty() || tls == "all") return "^" + none;
  const bool exclude = tls[0] == '^';
  std::string out;
  std::stringstream ss(exclude ? tls.substr(1) : tls);
  for (std::string t; std::getline(ss, t, ',');) {
    if (t.empty() || (!exclude && is_cuda(t))) continue;
    if (t == "all" && !exclude) return "^" + none;
    out += (out.empty() ? "" : ",") + t;
  }
  if (exclude) return "^" + (out.empty() ? none : out + "," + none);
  return out.empty() ? "^" + none : out;
}

bool TlsLacksPeerFailureTransport(const std::string& tls) {
  if (tls.empty() || tls[0] == '^') return false;  // all, or all but some: tcp remains unless named
  static const char* kNoPeerFailure[] = {"sm", "shm", "mm", "posix", "sysv", "cma",
                                         "knem", "xpmem", "self"};
  std::stringstream ss(tls);
  for (std::string t; std::getline(ss, t, ',');) {
    bool shm = false;
    for (const char* n : kNoPeerFailure) shm = shm || t == n;
    if (!shm && !t.empty()) return false;
  }
  return true;
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
  // The endpoint's own mapping of the memfd the peer's gate granted: map it once more.
  const UcxEndpointState::PeerMap& m = st.maps[i];
  if (st.cma_pid == 0 || m.ptr == nullptr || m.fd < 0) {
    return NotSupported("ucx: region " + std::to_string(region) +
                        " is not reachable as a same-host mapping (peer on another host, memory "
                        "the peer registered rather than allocated, or shared memory off)");
  }
  void* p = mmap(nullptr, m.length, PROT_READ | PROT_WRITE, MAP_SHARED, m.fd, 0);
  if (p == MAP_FAILED) {
    return Unavailable("ucx: mapping the peer's memfd again failed: " +
                       std::string(std::strerror(errno)));
  }
  return std::make_unique<PeerMapping>(p, m.length, st.regions[i].addr - m.base,
                                       st.regions[i].length);
}

}  // namespace kvstream::transport::ucx
