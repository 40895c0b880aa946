#include "transport/staged/staged_transport.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "common/log.h"
#include "transport/cuda/cuda_util.h"
#include "transport/staged/staged_chunk_copy.h"
#include "transport/staged/staged_context.h"
#include "transport/staged/staged_wire.h"
#include "transport/staged/staged_writer.h"
#include "transport/ucx/ucx_transport.h"

namespace kvstream::transport::staged {

void StagedContext::OnInner(const Notification& n) {
  if ((n.flags & kFlagMagicMask) != kFlagMagic) return;
  const int type = n.flags & 0xFF;
  if (type == kCredit || type == kByeAck) {
    std::shared_ptr<StagedWriter> w;
    {
      std::lock_guard<std::mutex> lock(router_mu);
      auto it = writers.find(uint32_t(n.layer));
      if (it != writers.end()) w = it->second.lock();
    }
    if (w) w->OnCredit(n);
    return;
  }
  std::shared_ptr<StagedReceiver> r;
  {
    std::lock_guard<std::mutex> lock(router_mu);
    r = receiver;
  }
  if (r) r->Post(n);
}

namespace {

using cuda::CopyRun;
using cuda::DeviceGuard;

class StagedTransport : public Transport {
 public:
  explicit StagedTransport(std::shared_ptr<StagedContext> context) : context_(std::move(context)) {}
  ~StagedTransport() override {
    std::shared_ptr<StagedReceiver> r;
    {
      std::lock_guard<std::mutex> lock(context_->router_mu);
      r.swap(context_->receiver);
    }
    // The inner sink stays: endpoints may outlive this object and still need their credits.
    if (r) r->Stop();
  }

  Status Init() {
    StagedContext& s = *context_;
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
    KV_ASSIGN_OR_RETURN(std::shared_ptr<StagedReceiver> receiver, StartReceiver(context_.get()));
    {
      std::lock_guard<std::mutex> lock(s.router_mu);
      s.receiver = receiver;
    }
    std::weak_ptr<StagedContext> weak = context_;
    s.inner->SetNotificationSink([weak](const Notification& n) {
      if (auto sh = weak.lock()) sh->OnInner(n);
    });
    StagedAddress a;
    a.area.staging_addr = reinterpret_cast<uint64_t>(s.staging);
    a.area.staging_len = s.staging_len;
    a.area.chunk_bytes = s.options.chunk_bytes;
    a.area.slot_stride = s.slot_stride;
    a.area.slots = uint32_t(s.options.recv_slots);
    a.area.mailboxes = kMailboxes;
    a.staging_key = s.staging_reg->RemoteKey();
    address_ = a;  // the inner address is made for each LocalAddress() (a new same-host token)
    return OkStatus();
  }

  std::string name() const override { return "ucx_staged"; }
  Capabilities capabilities() const override {
    Capabilities c;
    c.host_memory = false;
    c.cuda_memory = true;
    c.remote = context_->inner->capabilities().remote;
    c.notifications = true;
    c.notification_mac = true;
    return c;
  }
  std::string LocalAddress() const override {
    StagedAddress a = address_;
    a.inner_address = context_->inner->LocalAddress();
    return EncodeAddress(a);
  }
  // The writer's inner UCX connection is the one admitted (its ticket is the endpoint's); the
  // receiver answers over it, so no connection goes the other way.
  Status Admit(const std::string& ticket) override { return context_->inner->Admit(ticket); }
  TransportCounters counters() const override { return context_->inner->counters(); }

  Result<std::unique_ptr<Registration>> Register(const MemoryRegion& region) override {
    if (region.kind != MemoryKind::kCuda) {
      return NotSupported("ucx_staged registers only CUDA device memory; use the ucx backend for host memory");
    }
    if (region.addr == nullptr || region.length == 0) {
      return InvalidArgument("ucx_staged Register: null address or zero length");
    }
    KV_ASSIGN_OR_RETURN(cuda::DevicePointerInfo info, cuda::QueryDevicePointer(region.addr, region.length));
    if (info.device != context_->device) {
      return InvalidArgument("ucx_staged Register: memory is on device " + std::to_string(info.device) +
                             ", the transport on " + std::to_string(context_->device));
    }
    MemoryRegion r = region;
    r.device = info.device;
    uint32_t id;
    {
      std::lock_guard<std::mutex> lock(context_->regions_mu);
      id = context_->next_region_id++;
      context_->regions[id] = {reinterpret_cast<uint64_t>(region.addr), region.length};
    }
    return std::unique_ptr<Registration>(new StagedRegistration(context_, r, id));
  }

  Result<std::unique_ptr<Endpoint>> Connect(const PeerDescriptor& peer) override {
    return ConnectWriter(context_, peer);
  }

  void SetNotificationSink(NotificationSink sink) override {
    std::lock_guard<std::mutex> lock(context_->sink_mu);
    context_->sink = std::move(sink);
  }

 private:
  // The receive staging area: the inner transport's Allocate()d memory (a memfd that a writer
  // on this host can map), page-locked here so that our host -> device copies run at pinned
  // speed. Where the allocation or the page-locking fails: cudaHostAlloc + Register (writers
  // then use UCX puts).
  Status AllocateStaging() {
    StagedContext& s = *context_;
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

  std::shared_ptr<StagedContext> context_;
  StagedAddress address_;  // without its inner address (LocalAddress adds one)
};


}  // namespace

Result<std::unique_ptr<Transport>> CreateStagedTransport(const StagedOptions& options) {
  KV_ASSIGN_OR_RETURN(int device, cuda::ResolveDevice(options.device, "ucx_staged"));
  if (options.chunk_bytes == 0 || options.chunk_bytes % 16 != 0 || options.recv_slots <= 0 ||
      options.credits_per_peer <= 0 || options.recv_slots > 0xFFFF) {
    return InvalidArgument("ucx_staged: chunk_bytes must be a positive multiple of 16 and slots/credits positive");
  }
  // Gather/scatter kernels loaded now, not at a first Write() behind running compute.
  KV_RETURN_IF_ERROR(cuda::PrepareDevice(device));
  auto shared = std::make_shared<StagedContext>(device);
  shared->options = options;
  shared->options.device = device;
  TransportOptions inner;
  inner.backend = "ucx";
  inner.ucx = options.ucx;
  KV_ASSIGN_OR_RETURN(shared->inner, ucx::CreateUcxTransport(inner));
  if (shared->inner->capabilities().cuda_memory) {
    // A UCX built with CUDA: host memory only here, or its CUDA transports would page-lock the
    // staging area themselves (and kvstream's own page-locking would then fail).
    shared->inner.reset();
    inner.ucx.tls = ucx::TlsWithoutCuda(options.ucx.tls);
    KV_ASSIGN_OR_RETURN(shared->inner, ucx::CreateUcxTransport(inner));
  }
  auto t = std::make_unique<StagedTransport>(shared);
  KV_RETURN_IF_ERROR(t->Init());
  return std::unique_ptr<Transport>(std::move(t));
}

Result<std::unique_ptr<Transport>> CreateStagedTransport(const TransportOptions& options) {
  StagedOptions o = options.staged;
  o.device = options.device;
  o.ucx = options.ucx;
  return CreateStagedTransport(o);
}

}  // namespace kvstream::transport::staged
