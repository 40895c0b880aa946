#include "transport/nccl/nccl_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <list>
#include <mutex>
#include <thread>

#include "common/log.h"
#include "transport/core/host_identity.h"
#include "transport/nccl/nccl_comm.h"
#include "transport/nccl/nccl_receiver.h"
#include "transport/nccl/nccl_wire.h"
#include "transport/nccl/nccl_writer.h"

namespace kvstream::transport::nccl {
namespace {

using cuda::DeviceGuard;

class NcclTransport : public Transport {
 public:
  explicit NcclTransport(std::shared_ptr<NcclTransportState> shared) : shared_(std::move(shared)) {}
  ~NcclTransport() override {
    if (accept_thread_.joinable()) {
      uint64_t one = 1;
      (void)!::write(wake_fd_, &one, sizeof(one));
      accept_thread_.join();
    }
    receivers_.clear();
    if (listen_fd_ >= 0) ::close(listen_fd_);
    if (wake_fd_ >= 0) ::close(wake_fd_);
  }

  Status Init() {
    const bool loopback = shared_->options.advertise_host == "127.0.0.1" ||
                          shared_->options.advertise_host == "localhost";
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (listen_fd_ < 0) return Errno("socket");
    int one = 1;
    (void)::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(loopback ? INADDR_LOOPBACK : INADDR_ANY);
    sa.sin_port = 0;
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) return Errno("bind");
    if (::listen(listen_fd_, 16) != 0) return Errno("listen");
    socklen_t len = sizeof(sa);
    if (::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
      return Errno("getsockname");
    }
    port_ = ntohs(sa.sin_port);
    wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake_fd_ < 0) return Errno("eventfd");
    accept_thread_ = std::thread([this] { AcceptLoop(); });
    return OkStatus();
  }

  std::string name() const override { return "nccl"; }
  Capabilities capabilities() const override {
    Capabilities c;
    c.host_memory = false;
    c.cuda_memory = true;
    c.remote = true;
    c.notifications = true;
    c.notification_mac = true;  // carried by the write header
    return c;
  }
  // A fresh admission id per call (nccl_transport.h); "" if the kernel gives no random bytes.
  std::string LocalAddress() const override {
    auto id = shared_->IssueAdmissionId();
    if (!id.ok()) {
      KV_LOG_ERROR << id.status().ToString();
      return "";
    }
    Address a;
    a.host = shared_->options.advertise_host;
    a.port = port_;
    a.unique_id = std::move(id).value();
    return EncodeAddress(a);
  }
  // Writers whose hello presented an unused admission id (and got a communicator), and those
  // refused.
  TransportCounters counters() const override {
    TransportCounters c;
    c.connections_admitted = shared_->hellos_admitted.load();
    c.connections_refused = shared_->hellos_refused.load();
    return c;
  }

  Result<std::unique_ptr<Registration>> Register(const MemoryRegion& region) override {
    if (region.kind != MemoryKind::kCuda) {
      return NotSupported("nccl registers only CUDA device memory (kCuda), not host memory");
    }
    if (region.addr == nullptr || region.length == 0) {
      return InvalidArgument("nccl Register: null address or zero length");
    }
    KV_ASSIGN_OR_RETURN(cuda::DevicePointerInfo info,
                        cuda::QueryDevicePointer(region.addr, region.length));
    if (info.device != shared_->device || (region.device >= 0 && region.device != info.device)) {
      return InvalidArgument("nccl Register: the memory is on device " + std::to_string(info.device) +
                             ", this transport moves device " + std::to_string(shared_->device));
    }
    MemoryRegion r = region;
    r.device = info.device;
    Key k;
    k.length = region.length;
    k.device = info.device;
    std::strncpy(k.pci_bus_id, shared_->pci_bus_id.c_str(), sizeof(k.pci_bus_id) - 1);
    std::strncpy(k.host_id, shared_->host_id.c_str(), sizeof(k.host_id) - 1);
    {
      std::lock_guard<std::mutex> lock(shared_->reg_mu);
      k.registration_id = shared_->next_reg_id++;
      shared_->regs[k.registration_id] = r;
    }
    return std::unique_ptr<Registration>(
        new NcclRegistration(shared_, k.registration_id, r, EncodeKey(k)));
  }

  Result<std::unique_ptr<Endpoint>> Connect(const PeerDescriptor& peer) override {
    KV_ASSIGN_OR_RETURN(Address addr, DecodeAddress(peer.address));
    auto w = std::make_unique<NcclWriter>();
    w->shared = shared_;
    w->mode = shared_->options.copy_mode;
    for (size_t i = 0; i < peer.regions.size(); ++i) {
      auto key = DecodeKey(peer.regions[i].key);
      if (!key.ok()) return key.status().WithContext("region " + std::to_string(i));
      if (peer.regions[i].length > key->length) {
        return InvalidArgument("nccl: region " + std::to_string(i) + " claims " +
                               std::to_string(peer.regions[i].length) + " bytes, its key " +
                               std::to_string(key->length));
      }
      if (shared_->host_id == key->host_id && shared_->pci_bus_id == key->pci_bus_id) {
        return FailedPrecondition("nccl: the peer's region " + std::to_string(i) +
                                  " is on this transport's own GPU (" + shared_->pci_bus_id +
                                  "); NCCL needs its two ranks on different GPUs (use cuda_ipc "
                                  "on one GPU)");
      }
      w->targets.push_back({key->registration_id, peer.regions[i].length});
    }
    const Deadline deadline = DeadlineAfterMs(shared_->options.connect_timeout_ms);
    KV_ASSIGN_OR_RETURN(w->fd, ConnectTcp(addr.host, addr.port, deadline));
    Hello hello;
    hello.device = shared_->device;
    hello.chunk_bytes = shared_->options.chunk_bytes;
    std::strncpy(hello.pci_bus_id, shared_->pci_bus_id.c_str(), sizeof(hello.pci_bus_id) - 1);
    std::strncpy(hello.host_id, shared_->host_id.c_str(), sizeof(hello.host_id) - 1);
    std::memcpy(hello.unique_id, addr.unique_id.data(), kUniqueIdBytes);
    if (!core::SendAll(w->fd, EncodeHello(hello))) return RemoteDisconnect("nccl: sending hello");
    std::string rx;
    KV_ASSIGN_OR_RETURN(std::string payload,
                        ReadFrame(w->fd, &rx, FrameType::kHelloAck, deadline, "hello ack"));
    KV_ASSIGN_OR_RETURN(HelloAck ack, DecodeHelloAck(payload));
    if (ack.code != 0) {
      return Status(static_cast<StatusCode>(ack.code),
                    std::string("nccl: the receiver refused the connection: ") + ack.message);
    }
    if (ack.chunk_bytes == 0 || ack.chunk_bytes > shared_->options.chunk_bytes) {
      return DataLoss("nccl: the receiver agreed on a bad chunk size");
    }
    {
      DeviceGuard guard(shared_->device);
      KV_RETURN_IF_ERROR(guard.status());
      KV_RETURN_IF_ERROR(shared_->InitStaging(&w->staging, ack.chunk_bytes));
      KV_ASSIGN_OR_RETURN(w->comm_stream, cuda::Stream::CreateLowestPriority(shared_->device));
      KV_ASSIGN_OR_RETURN(w->pack_stream, cuda::Stream::CreateLowestPriority(shared_->device));
    }
    const int fd = w->fd;
    auto receiver_alive = [fd]() -> Status {
      char c;
      if (::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0) {
        return RemoteDisconnect("nccl: the receiver closed the control socket while connecting");
      }
      return OkStatus();
    };
    KV_ASSIGN_OR_RETURN(w->comm, InitComm(shared_->device, std::string(ack.unique_id, kUniqueIdBytes),
                                          0, deadline, receiver_alive));
    {
      // On failure ~NcclWriter aborts the communicator and frees the staging buffer and streams.
      DeviceGuard guard(shared_->device);
      KV_RETURN_IF_ERROR(guard.status());
      Status s = WarmUp(w->comm, 0, w->staging.slot(0), w->comm_stream->get(), deadline,
                        receiver_alive);
      if (!s.ok()) return s.WithContext("nccl: warm-up exchange with the receiver");
    }
    w->wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (w->wake_fd < 0) return Errno("eventfd");
    w->Start();
    return std::unique_ptr<Endpoint>(new NcclEndpoint(std::move(w)));
  }

  void SetNotificationSink(NotificationSink sink) override {
    std::lock_guard<std::mutex> lock(shared_->sink_mu);
    shared_->sink = std::move(sink);
  }

 private:
  void AcceptLoop() {
    for (;;) {
      pollfd p[2] = {{wake_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
      int rc = ::poll(p, 2, 200);
      if (rc < 0 && errno != EINTR) {
        KV_LOG_ERROR << "nccl accept poll: " << std::strerror(errno);
        return;
      }
      if (p[0].revents) return;
      receivers_.remove_if([](const std::unique_ptr<NcclReceiver>& r) { return r->finished(); });
      if (!(p[1].revents & POLLIN)) continue;
      for (;;) {
        int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) break;
        SetSocketOptions(fd);
        receivers_.push_back(std::make_unique<NcclReceiver>(shared_, fd));
      }
    }
  }

  std::shared_ptr<NcclTransportState> shared_;
  uint16_t port_ = 0;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  std::list<std::unique_ptr<NcclReceiver>> receivers_;  // accept thread only (and the destructor)
  std::thread accept_thread_;
};

}  // namespace

std::string NcclVersionString() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "NCCL (version unknown)";
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
  return "NCCL " + std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." +
         std::to_string(v % 100);
}

Result<std::unique_ptr<Transport>> CreateNcclTransport(const NcclOptions& options) {
  // Point-to-point only: NVLink SHARP (multicast objects made at communicator init) buys
  // nothing here, and on shared hosts it can take GPUs out of service. Off unless the
  // environment says otherwise (read by NCCL at its first init).
  (void)::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  KV_ASSIGN_OR_RETURN(int device, cuda::ResolveDevice(options.device, "nccl"));
  if (options.chunk_bytes < (1u << 20) || options.chunk_bytes % 16 != 0) {
    return InvalidArgument("nccl: chunk_bytes must be a multiple of 16, at least 1 MiB");
  }
  // Pack/unpack kernels loaded now, not at a first Write() behind running compute.
  KV_RETURN_IF_ERROR(cuda::PrepareDevice(device));
  auto shared = std::make_shared<NcclTransportState>(device);
  shared->options = options;
  shared->options.device = device;
  KV_ASSIGN_OR_RETURN(shared->pci_bus_id, cuda::PciBusId(device));
  shared->host_id = core::HostIdentity();
  auto t = std::make_unique<NcclTransport>(shared);
  KV_RETURN_IF_ERROR(t->Init());
  return std::unique_ptr<Transport>(std::move(t));
}

Result<std::unique_ptr<Transport>> CreateNcclTransport(const TransportOptions& options) {
  NcclOptions o = options.nccl;
  o.device = options.device;
  return CreateNcclTransport(o);
}

}  // namespace kvstream::transport::nccl
