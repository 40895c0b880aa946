#include "transport/cuda_ipc/cuda_ipc_receiver.h"

#include <mutex>

#include "common/log.h"
#include "transport/cuda_ipc/cuda_ipc_wire.h"

namespace kvstream::transport::cuda_ipc {

Result<std::unique_ptr<IpcReceiver>> IpcReceiver::Start(std::shared_ptr<IpcTransportState> state) {
  std::unique_ptr<IpcReceiver> r(new IpcReceiver(std::move(state)));
  KV_RETURN_IF_ERROR(r->Listen());
  if (r->state_->options.gpu_landed_wait) {
    // Without landed flags the receiver still works, with late notifications (logged).
    Status s = r->MakeLandedFlags();
    if (!s.ok()) {
      KV_LOG_WARN << "cuda_ipc: gpu_landed_wait unavailable, notifications stay late: "
                  << s.ToString();
      if (r->flags_) r->flags_->Stop();
      r->flags_reg_.reset();
      r->flags_.reset();
    }
  }
  return r;
}

IpcReceiver::~IpcReceiver() {
  // The watchdog may drop listener connections, and the listener calls into the table:
  // stop the first, then the second, then free the table.
  if (flags_) flags_->Stop();
  listener_.reset();
  flags_reg_.reset();
  flags_.reset();
}

Status IpcReceiver::Listen() {
  std::weak_ptr<IpcTransportState> weak = state_;
  KV_ASSIGN_OR_RETURN(
      listener_,
      cuda::NotificationListener::Start(
          "kvstream-cuda-ipc",
          [weak, this](const Notification& n) {
            auto sh = weak.lock();
            if (!sh) return;
            // The table learns of the write before the consumer can ask to wait for it.
            if ((n.flags & kNotificationLandedOnEvent) != 0 && flags_ != nullptr) {
              flags_->OnEarly(static_cast<uint32_t>(n.flags & cuda::kLandedConnMask), n.landed_seq);
            }
            std::lock_guard<std::mutex> lock(sh->sink_mu);
            if (sh->sink) sh->sink(n);
          },
          [this](uint32_t conn, uint32_t) -> Result<cuda::FlagGrant> {
            if (flags_ == nullptr) return NotSupported("gpu_landed_wait is off");
            return flags_->Grant(conn);
          },
          [this](uint32_t conn) {
            if (flags_ != nullptr) flags_->OnClosed(conn);
          },
          // Registered memory goes out only as its descriptor, only on a connection that passed
          // the hello (this uid, the address's token).
          [grants = state_->grants](uint32_t, uint64_t id) { return grants->Grant(id); }));
  return OkStatus();
}

Status IpcReceiver::MakeLandedFlags() {
  KV_ASSIGN_OR_RETURN(flags_, cuda::LandedFlagTable::Create(
                                  state_->device, &state_->events,
                                  [l = listener_.get()](uint32_t conn) { l->Drop(conn); }));
  MemoryRegion r{flags_->array(), flags_->array_bytes(), MemoryKind::kCuda, state_->device};
  KV_ASSIGN_OR_RETURN(flags_reg_, RegisterIpcRegion(r, state_->grants));
  flags_->SetArrayKey(flags_reg_->RemoteKey());
  return OkStatus();
}

std::string IpcReceiver::address() const {
  return listener_->address() + (flags_ != nullptr ? cuda::kLandedFlagsSuffix : "");
}

Status IpcReceiver::StreamWaitLanded(const Notification& n, void* stream, Deadline deadline) {
  if ((n.flags & kNotificationLandedOnEvent) == 0) return OkStatus();
  if (stream == nullptr) return InvalidArgument("cuda_ipc StreamWaitLanded: no stream");
  if (flags_ == nullptr) return NotSupported("cuda_ipc: this receiver has no landed flags");
  return flags_->Wait(n, static_cast<cudaStream_t>(stream), deadline);
}

Status IpcReceiver::ConfirmLanded(const Notification& n) {
  if ((n.flags & kNotificationLandedOnEvent) == 0) return OkStatus();
  if (flags_ == nullptr) return NotSupported("cuda_ipc: this receiver has no landed flags");
  return flags_->Confirm(n);
}

}  // namespace kvstream::transport::cuda_ipc
