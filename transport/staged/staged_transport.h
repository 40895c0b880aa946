// Host-staged UCX transport for CUDA device memory ("ucx_staged"), for UCX builds that cannot
// touch GPU memory (Debian's): device -> pinned host -> UCX -> pinned host -> device, chunked and
// pipelined. It is built on the UCX backend's public Transport interface (transport/ucx/), not
// on UCX directly.
//
// How it maps onto transport.h:
//  - Each transport owns an inner UCX transport and a pinned receive staging area of
//    `recv_slots` slots (each a descriptor header plus `chunk_bytes` of data) registered with it,
//    plus hello mailboxes. LocalAddress() encodes the inner address and the staging area's key.
//  - Register(kCuda region): no UCX registration; the region gets an id, and RemoteKey() names
//    it (id, length). kHost regions: kNotSupported (use the ucx backend for host memory).
//  - Connect(): connects the inner UCX endpoint to the peer's staging area and says hello
//    through a mailbox; the peer connects back (for credits and completions) and grants this
//    endpoint up to `credits_per_peer` staging slots.
//  - Write(): validates and coalesces the ops, cuts them into chunks of <= chunk_bytes, and a
//    per-endpoint pipeline thread, for each chunk: waits for a free local pinned buffer and a
//    credit (a peer slot), copies device -> pinned on a LOWEST-priority stream (waiting first on
//    `after_stream`, recorded when Write() was called), puts descriptor + data into the peer's
//    slot and announces it with a UCX active message. The peer's transport thread copies the
//    slot pinned -> device (lowest-priority stream), hands the slot back as a credit, and once
//    every chunk of the write is on the device it calls its NotificationSink (if asked) and
//    tells the writer, whose WriteHandle then completes. So a handle is done only when the data
//    is in the peer's device memory.
//  - Peer death: the inner endpoint's kRemoteDisconnect fails pending and later writes and the
//    endpoint's status.
//  - ~Endpoint: fails queued chunks with kCanceled, waits (bounded, close_timeout_ms) for the
//    chunks already sent to complete, then says goodbye; the peer drains and acknowledges, and
//    drops anything that arrives for this endpoint afterwards, so nothing more lands.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "transport/transport.h"

namespace kvstream::transport::staged {

struct StagedOptions {
  int device = -1;                     // device of registered regions and streams; -1 = current
  size_t chunk_bytes = 8ull << 20;     // data bytes per chunk (one staging slot)
  // Pipeline depth: a send buffer is busy from its D2H copy until the UCX put is done, a peer
  // slot (credit) from the D2H copy until the peer's H2D copy is done and the credit is back.
  // Six of each keep D2H of chunk k+1, the put of chunk k and the peer's H2D of chunk k-1 all
  // in flight with room for the credit round trip.
  int recv_slots = 12;                 // receive staging slots (shared by all writers)
  int send_buffers = 6;                // per-endpoint pinned send buffers (pipeline depth)
  int credits_per_peer = 6;            // slots granted to one writer
  std::string ucx_tls;                 // passed to the inner UCX transport
  std::string ucx_net_devices;
  int64_t connect_timeout_ms = 10000;  // hello -> first credits
  int64_t close_timeout_ms = 10000;    // ~Endpoint's bound on draining
};

// kUnavailable without a usable GPU; kNotSupported when UCX is not built in.
Result<std::unique_ptr<Transport>> CreateStagedTransport(const StagedOptions& options);
// For the registry (backend "ucx_staged").
Result<std::unique_ptr<Transport>> CreateStagedTransport(const TransportOptions& options);

// The UCX path for GPU memory on this host: "ucx" when UCX reports CUDA memory support
// (ucp_context_query lists UCS_MEMORY_TYPE_CUDA, as NVIDIA's HPC-X builds do), else
// "ucx_staged". The inner UCX transport used to ask is created with `options` and discarded.
Result<std::string> SelectGpuBackend(const TransportOptions& options);

}  // namespace kvstream::transport::staged
