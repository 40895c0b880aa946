// What one host-staged transport's parts share (transport/staged/): the options, the inner UCX
// transport, the receive staging area, the registered regions, the sink, and the router that
// hands the inner transport's notifications to the receiver thread or to a writer.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/cuda/cuda_util.h"
#include "transport/staged/staged_transport.h"
#include "transport/staged/staged_wire.h"
#include "transport/transport.h"

namespace kvstream::transport::staged {

struct RegionInfo {
  uint64_t addr = 0;
  uint64_t length = 0;
};

// The receive side: one thread per transport (staged_receiver.cc).
class StagedReceiver {
 public:
  virtual ~StagedReceiver() = default;
  // Stops the thread and waits for its copies (idempotent).
  virtual void Stop() = 0;
  // A message from a writer (hello, chunk, bye, abandon), from the inner transport's thread.
  virtual void Post(const Notification& n) = 0;
};

class StagedWriter;  // staged_writer.h

struct StagedContext {
  StagedOptions options;
  int device = -1;
  std::unique_ptr<Transport> inner;
  cuda::EventPool events;
  explicit StagedContext(int dev) : device(dev), events(dev) {}
  ~StagedContext() {
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

  std::mutex sink_mu;
  NotificationSink sink;

  std::mutex router_mu;
  std::map<uint32_t, std::weak_ptr<StagedWriter>> writers;  // by conn id
  std::shared_ptr<StagedReceiver> receiver;

  uint64_t MailboxOffset(uint32_t i) const { return uint64_t(i) * kMailboxBytes; }
  uint64_t SlotOffset(uint32_t slot) const {
    return uint64_t(kMailboxes) * kMailboxBytes + uint64_t(slot) * slot_stride;
  }
  // The inner transport's sink: credits and acknowledgements to their writer, the rest to the
  // receiver thread.
  void OnInner(const Notification& n);
};

class StagedRegistration : public Registration {
 public:
  StagedRegistration(std::shared_ptr<StagedContext> context, MemoryRegion region, uint32_t id)
      : context_(std::move(context)), region_(region), id_(id) {}
  ~StagedRegistration() override {
    std::lock_guard<std::mutex> lock(context_->regions_mu);
    context_->regions.erase(id_);
  }
  const MemoryRegion& region() const override { return region_; }
  std::string RemoteKey() const override {
    return EncodeKey(StagedKey{id_, region_.device, region_.length});
  }

 private:
  std::shared_ptr<StagedContext> context_;
  MemoryRegion region_;
  uint32_t id_;
};

// Starts the receiver thread of `context` (which must outlive it: the transport stops it).
Result<std::shared_ptr<StagedReceiver>> StartReceiver(StagedContext* context);

// The writer side of Transport::Connect(): connects to `peer`, says hello, waits for the first
// credit and starts the endpoint's pipeline thread.
Result<std::unique_ptr<Endpoint>> ConnectWriter(const std::shared_ptr<StagedContext>& context,
                                                const PeerDescriptor& peer);

}  // namespace kvstream::transport::staged
