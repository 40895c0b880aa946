// The receiver side of nccl (internal to transport/nccl/): one NcclReceiver per accepted writer
// connection: the handshake, the communicator (rank 1), then for each write header the receives
// (into the pool, or into staging followed by the scatter kernel), the notification once the
// bytes are in the pool, and the ack, in write order. nccl_transport.h says what the backend
// guarantees.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/time.h"
#include "transport/nccl/nccl_comm.h"
#include "transport/nccl/nccl_wire.h"

namespace kvstream::transport::nccl {

// A write whose header arrived: its receives are posted, `done` is recorded after them.
struct NcclIncomingWrite {
  WriteHeader header;
  cudaEvent_t done = nullptr;
  Clock::time_point t_header, t_posted, t_landed;  // trace
};

class NcclReceiver {
 public:
  // Takes `fd` (an accepted control socket) and starts the connection's thread.
  NcclReceiver(std::shared_ptr<NcclTransportState> shared, int fd);
  // Stops the thread (the communicator is aborted), closes the socket.
  ~NcclReceiver();
  NcclReceiver(const NcclReceiver&) = delete;
  NcclReceiver& operator=(const NcclReceiver&) = delete;
  // True once the connection ended (its resources are released).
  bool finished() const { return finished_.load(); }

 private:
  Status Alive();
  Status Handshake();
  Status Group(const std::function<Status()>& calls, const char* what);
  // Posts the receives (and unpacks) of one write.
  Status Post(NcclIncomingWrite& in);
  Status Loop();
  void Run();

  std::shared_ptr<NcclTransportState> shared_;
  int fd_ = -1;
  int wake_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<bool> finished_{false};
  ncclComm_t comm_ = nullptr;
  std::unique_ptr<cuda::Stream> comm_stream_, unpack_stream_;
  Staging staging_;
  std::string rx_;
  ChunkPlan plan_;
  std::vector<cuda::CopyRun> runs_;
  cuda::PackedTable table_;
  std::thread thread_;  // last
};

}  // namespace kvstream::transport::nccl
