// The receiver side of cuda_ipc (internal to transport/cuda_ipc/): the control socket writers
// notify on, and, with gpu_landed_wait, the landed-flag table their early notifications name
// (transport/cuda/landed_flags.h). cuda_ipc_transport.h says what the backend guarantees.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "common/time.h"
#include "transport/cuda/control_socket.h"
#include "transport/cuda/landed_flags.h"
#include "transport/cuda_ipc/cuda_ipc_writer.h"
#include "transport/transport.h"

namespace kvstream::transport::cuda_ipc {

class IpcReceiver {
 public:
  // Listens for writers; notifications go to state->sink. With options.gpu_landed_wait it also
  // offers landed flags (without the driver's stream memory operations it stays late, logged).
  static Result<std::unique_ptr<IpcReceiver>> Start(std::shared_ptr<IpcTransportState> state);
  // Stops the watchdog, then the listener (writers see EOF), then frees the flag table.
  ~IpcReceiver();
  IpcReceiver(const IpcReceiver&) = delete;
  IpcReceiver& operator=(const IpcReceiver&) = delete;

  // The listener's address, with the "#lf" suffix when landed flags are offered.
  std::string address() const;
  // Transport::StreamWaitLanded / ConfirmLanded.
  Status StreamWaitLanded(const Notification& n, void* stream, Deadline deadline);
  Status ConfirmLanded(const Notification& n);

 private:
  explicit IpcReceiver(std::shared_ptr<IpcTransportState> state) : state_(std::move(state)) {}
  Status Listen();
  // The flag array, registered like any region so that writers map it with the key.
  Status MakeLandedFlags();

  std::shared_ptr<IpcTransportState> state_;
  std::unique_ptr<cuda::NotificationListener> listener_;
  // With gpu_landed_wait (null otherwise): set before the address is known.
  std::unique_ptr<cuda::LandedFlagTable> flags_;
  std::unique_ptr<Registration> flags_reg_;
};

}  // namespace kvstream::transport::cuda_ipc
