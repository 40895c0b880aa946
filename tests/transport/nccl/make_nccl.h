// The nccl transport as the GPU tests make it: on `device`, in `mode`, with staging chunks of
// chunk_bytes (0 = the default) and a 15 s connect deadline.
#pragma once

#include <cstdint>
#include <memory>

#include "common/status.h"
#include "transport/nccl/nccl_transport.h"
#include "transport/transport.h"

namespace kvstream::testing {

inline Result<std::unique_ptr<transport::Transport>> MakeNccl(
    int device, transport::nccl::CopyMode mode = transport::nccl::CopyMode::kAuto,
    uint64_t chunk_bytes = 0) {
  transport::nccl::NcclOptions o;
  o.device = device;
  o.copy_mode = mode;
  if (chunk_bytes) o.chunk_bytes = chunk_bytes;
  o.connect_timeout_ms = 15000;
  return transport::nccl::CreateNcclTransport(o);
}

}  // namespace kvstream::testing
