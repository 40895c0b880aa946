#include "transport/cuda_ipc/cuda_ipc_transport.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>

#include "common/log.h"
#include "transport/core/host_identity.h"
#include "transport/cuda/control_socket.h"
#include "transport/cuda/cuda_util.h"
#include "transport/cuda_ipc/cuda_ipc_receiver.h"
#include "transport/cuda_ipc/cuda_ipc_wire.h"
#include "transport/cuda_ipc/cuda_ipc_writer.h"

namespace kvstream::transport::cuda_ipc {
namespace {

using cuda::CopyRun;

class CudaIpcTransport : public Transport {
 public:
  explicit CudaIpcTransport(std::shared_ptr<IpcTransportState> shared)
      : shared_(std::move(shared)) {}

  Status Init() {
    KV_ASSIGN_OR_RETURN(receiver_, IpcReceiver::Start(shared_));
    return OkStatus();
  }

  Status StreamWaitLanded(const Notification& n, void* stream, Deadline deadline) override {
    return receiver_->StreamWaitLanded(n, stream, deadline);
  }
  Status ConfirmLanded(const Notification& n) override { return receiver_->ConfirmLanded(n); }

  std::string name() const override { return "cuda_ipc"; }
  Capabilities capabilities() const override {
    Capabilities c;
    c.host_memory = false;
    c.cuda_memory = true;
    c.remote = false;
    c.notifications = true;
    c.notification_mac = true;  // carried by the control socket's frames
    return c;
  }
  std::string LocalAddress() const override { return receiver_->address(); }

  Result<std::unique_ptr<Registration>> Register(const MemoryRegion& region) override {
    return RegisterIpcRegion(region, shared_->grants);
  }

  Result<std::unique_ptr<Endpoint>> Connect(const PeerDescriptor& peer) override {
    auto writer = std::make_shared<IpcWriter>();
    writer->shared = shared_;
    std::vector<KeyWire> keys;
    for (size_t i = 0; i < peer.regions.size(); ++i) {
      auto parsed = ParseKey(peer.regions[i].key);
      if (!parsed.ok()) return parsed.status().WithContext("region " + std::to_string(i));
      if (core::HostIdentity() != parsed.value().host_id) {
        return NotSupported("cuda_ipc: region " + std::to_string(i) +
                            " belongs to another host; cuda_ipc works on one host only");
      }
      if (peer.regions[i].length > parsed.value().length) {
        return InvalidArgument("cuda_ipc: region " + std::to_string(i) + " claims " +
                               std::to_string(peer.regions[i].length) + " bytes, its key " +
                               std::to_string(parsed.value().length));
      }
      keys.push_back(parsed.value());
    }
    const Deadline deadline = DeadlineAfterMs(shared_->options.connect_timeout_ms);
    // The control socket first: the memory comes over it, as descriptors, from the receiver
    // the kernel names (this uid) to the holder of the address's token.
    KV_ASSIGN_OR_RETURN(auto ch, cuda::NotificationChannel::Connect(peer.address, deadline));
    for (size_t i = 0; i < keys.size(); ++i) {
      auto region = MapPeerRegion(*shared_, *ch, keys[i], deadline, &writer->mapped);
      if (!region.ok()) return region.status().WithContext("region " + std::to_string(i));
      writer->targets.push_back({region.value().mapping, region.value().addr, region.value().length});
    }
    writer->channel_fd = ch->fd();
    writer->channel = std::move(ch);
    KV_ASSIGN_OR_RETURN(writer->stream, cuda::Stream::CreateLowestPriority(shared_->device));
    writer->table_capacity = std::max<size_t>(shared_->options.table_entries, 1);
    KV_ASSIGN_OR_RETURN(writer->table,
                        cuda::PinnedBuffer::Allocate(writer->table_capacity * sizeof(CopyRun)));
    writer->wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (writer->wake_fd < 0) return Internal("cuda_ipc: eventfd failed");
    if (cuda::AddressWantsLandedFlags(peer.address)) {
      // Before the completion thread starts: the grant is the only thing the receiver sends.
      Status s = SetUpLandedFlag(*writer, DeadlineAfterMs(shared_->options.connect_timeout_ms));
      if (s.code() == StatusCode::kRemoteDisconnect || s.code() == StatusCode::kTimeout) return s;
      if (!s.ok()) {
        // Without the flag the writes still work, with notifications after completion.
        KV_LOG_WARN << "cuda_ipc: no early notifications for " << peer.address << ": " << s.ToString();
        writer->flag_addr = 0;
        writer->flag_mapping.reset();
      }
    }
    writer->Start();
    return std::unique_ptr<Endpoint>(new IpcEndpoint(std::move(writer)));
  }

  void SetNotificationSink(NotificationSink sink) override {
    std::lock_guard<std::mutex> lock(shared_->sink_mu);
    shared_->sink = std::move(sink);
  }

 private:
  // Writer: asks for a landed flag and maps the receiver's array.
  Status SetUpLandedFlag(IpcWriter& writer, Deadline deadline) {
    KV_ASSIGN_OR_RETURN(writer.mem_ops, cuda::StreamMemOps::Get());
    KV_ASSIGN_OR_RETURN(cuda::FlagGrant g, writer.channel->RequestLandedFlag(deadline));
    KV_ASSIGN_OR_RETURN(KeyWire k, ParseKey(g.key));
    if (core::HostIdentity() != k.host_id) {
      return NotSupported("cuda_ipc: the landed-flag array belongs to another host");
    }
    if ((uint64_t(g.slot) + 1) * sizeof(uint32_t) > k.length) {
      return InvalidArgument("cuda_ipc: landed flag slot " + std::to_string(g.slot) +
                             " lies outside the receiver's array");
    }
    KV_ASSIGN_OR_RETURN(MappedRegion r,
                        MapPeerRegion(*shared_, *writer.channel, k, deadline, &writer.mapped));
    writer.flag_mapping = r.mapping;
    writer.flag_addr = r.addr + uint64_t(g.slot) * sizeof(uint32_t);
    writer.next_seq = g.first_seq;
    return OkStatus();
  }

  std::shared_ptr<IpcTransportState> shared_;
  std::unique_ptr<IpcReceiver> receiver_;
};

}  // namespace

Result<std::unique_ptr<Transport>> CreateCudaIpcTransport(const CudaIpcOptions& options) {
  KV_ASSIGN_OR_RETURN(int device, cuda::ResolveDevice(options.device, "cuda_ipc"));
  KV_RETURN_IF_ERROR(cuda::PrepareDevice(device));
  auto shared = std::make_shared<IpcTransportState>(device);
  shared->options = options;
  shared->options.device = device;
  auto t = std::make_unique<CudaIpcTransport>(shared);
  KV_RETURN_IF_ERROR(t->Init());
  return std::unique_ptr<Transport>(std::move(t));
}

Result<std::unique_ptr<Transport>> CreateCudaIpcTransport(const TransportOptions& options) {
  CudaIpcOptions o = options.cuda_ipc;
  o.device = options.device;
  return CreateCudaIpcTransport(o);
}

}  // namespace kvstream::transport::cuda_ipc
