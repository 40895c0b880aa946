// The receiving side of the UCX backend (transport/ucx/): the memory a peer writes into (a
// Registration: ucp_mem_map'ed, its packed rkey published in RemoteKey(); Allocate()d memory is a
// memfd a same-host writer maps) and the active-message handlers: data messages (CUDA memory on
// either side) land only inside a live registration of this transport, the range their header
// names checked first (anything else is dropped, logged); a notification reaches the
// NotificationSink on the progress thread only once every data message that arrived before it
// has landed.
#pragma once

#include <ucp/api/ucp.h>

#include <memory>
#include <string>

#include "common/status.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_worker.h"

namespace kvstream::transport::ucx {

struct UcxRegionState {
  std::shared_ptr<UcxWorker> worker;
  ucp_mem_h memh = nullptr;
  MemoryRegion region;
  std::string key;
  int memfd = -1;            // Allocate(): the memory is this memfd, mapped at region.addr
  size_t mapped_length = 0;
  bool gated = false;        // offered to same-host writers through the worker's gate
  bool listed = false;       // in the worker's region table (data messages may land here)

  ~UcxRegionState();
};

class UcxRegistration final : public Registration {
 public:
  explicit UcxRegistration(std::shared_ptr<UcxRegionState> s) : s_(std::move(s)) {}
  const MemoryRegion& region() const override { return s_->region; }
  std::string RemoteKey() const override { return s_->key; }
  const std::shared_ptr<UcxRegionState>& state() const { return s_; }

 private:
  std::shared_ptr<UcxRegionState> s_;
};

// Registers `region` (allocate: a new `region.length` bytes, backed by a memfd where same-host
// copies are allowed, else by UCX) with the worker's context.
Result<std::unique_ptr<Registration>> RegisterMemory(std::shared_ptr<UcxWorker> worker,
                                                      const MemoryRegion& region, bool allocate);

// The worker's handler of data active messages (arg: the UcxWorker).
ucs_status_t OnDataMessage(void* arg, const void* header, size_t header_length, void* data,
                           size_t length, const ucp_am_recv_param_t* param);

// The worker's handler of notification active messages (arg: the UcxWorker).
ucs_status_t OnNotificationMessage(void* arg, const void* header, size_t header_length, void* data,
                                   size_t length, const ucp_am_recv_param_t* param);

}  // namespace kvstream::transport::ucx
