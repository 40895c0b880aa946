// Host-staged UCX transport for CUDA device memory ("ucx_staged"), for UCX builds that cannot
// touch GPU memory (Debian's): device -> pinned host -> UCX -> pinned host -> device, chunked and
// pipelined. It is built on the UCX backend's public Transport interface (transport/ucx/), not
// on UCX directly.
//
// How it maps onto transport.h:
//  - Each transport owns an inner UCX transport and a receive staging area of `recv_slots`
//    slots (each a descriptor header plus `chunk_bytes` of data) plus hello mailboxes. The area
//    comes from the inner transport's Allocate() (a memfd a same-host writer can map) and is
//    page-locked with cudaHostRegister; where either fails, from cudaHostAlloc + Register().
//    LocalAddress() encodes the inner address and the staging area's key.
//  - Register(kCuda region): no UCX registration; the region gets an id, and RemoteKey() names
//    it (id, length). kHost regions: kNotSupported (use the ucx backend for host memory).
//  - Connect(): connects the inner UCX endpoint to the peer's staging area and says hello
//    through a mailbox; the peer connects back (for credits and completions) and grants this
//    endpoint up to `credits_per_peer` staging slots.
//  - Two ways for a chunk's bytes into the peer's slot, chosen per endpoint at Connect():
//    * zero-copy (same host): the inner endpoint maps the peer's staging memfd
//      (ucx::MapPeerRegion) and this process page-locks its own mapping, so the writer's
//      device -> host copy lands directly in the peer's slot; UCX then carries only the
//      descriptor's announcement (an active message) and the credits, or with `doorbells`
//      words in the shared slot headers do (the announcement stays as a wake-up). Chosen when the mapping
//      and the page-locking both succeed (logged), unless zero_copy is kOff or the environment
//      says KVSTREAM_STAGED_ZERO_COPY=0.
//    * UCX put (any two hosts): device -> one of `send_buffers` pinned send buffers, then a UCX
//      write of descriptor + data into the peer's slot.
//  - Write(): validates and coalesces the ops, cuts them into chunks of <= chunk_bytes, and a
//    per-endpoint pipeline thread, for each chunk: waits for a free send buffer and a credit
//    (a peer slot), copies device -> host on a LOWEST-priority stream (waiting first on
//    `after_stream`, recorded when Write() was called), and announces the chunk. Chunks are
//    sized per write (adaptive_chunk_fill): small for a lone layer, chunk_bytes for a long
//    queue. Scattered sources are gathered (and scattered destinations scattered) by a kernel
//    on a second lowest-priority stream, overlapping the neighbouring chunks' copies. The peer's
//    transport thread copies the slot -> device (lowest-priority stream), hands the slot back
//    as a credit, and once every chunk of the write is on the device it calls its
//    NotificationSink (if asked) and tells the writer, whose WriteHandle then completes. So a
//    handle is done only when the data is in the peer's device memory.
//  - Cancel(): chunks not started are not started; the handle completes (kCanceled) once every
//    started chunk has been handed back by the peer; a write whose last chunk had started runs
//    to its end (OK). No notification for a canceled write.
//  - Peer death: the inner endpoint's kRemoteDisconnect (or a failed ping) fails pending and
//    later writes and the endpoint's status; a zero-copy endpoint drops its mapping of the
//    peer's staging area once its copies into it have finished.
//  - A writer that is lost without a goodbye (killed, endpoint failed) does not keep its
//    slots: the receiver notices (its connection back fails, or a ping does) and hands them to
//    other writers once no copy uses them and the writer process has exited (same host) or
//    `reclaim_quarantine_ms` has passed (slot_ledger.h).
//  - ~Endpoint: fails queued chunks with kCanceled, waits (bounded, close_timeout_ms) for the
//    chunks already started to be handed back, then says goodbye; the peer frees the slots,
//    acknowledges, and drops anything that arrives for this endpoint afterwards.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "transport/transport.h"

namespace kvstream::transport::staged {

enum class ZeroCopy {
  kAuto,  // same-host peers: device -> host copies straight into the peer's slots when possible
  kOff,   // always UCX puts (to measure both paths side by side)
};

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
  ZeroCopy zero_copy = ZeroCopy::kAuto;
  // A write smaller than min_chunks_per_write * chunk_bytes is cut into that many chunks (of at
  // least 1 MiB) so that the receiver's host -> device copy of its first part overlaps the
  // device -> host copy of the rest (one layer's latency); 1 = chunks of chunk_bytes always.
  int min_chunks_per_write = 1;
  // Chunk size per write, so that a lone layer does not wait for a large first chunk's
  // device -> host copy before its host -> device copy starts (and for the last one's after):
  // a write is cut into chunks of sqrt((bytes queued ahead + its bytes) * adaptive_chunk_fill),
  // rounded up to 64 KiB, at least 1 MiB, at most chunk_bytes. With equal copy rates both
  // ways a pipeline of chunks of size s takes (bytes + s) / rate plus s-independent latency, and
  // each chunk costs a fixed overhead o: the square root balances the two with
  // adaptive_chunk_fill ~= o * rate. Writes posted behind a queue get larger chunks (the queue
  // hides their fill). 0 = always chunk_bytes.
  uint64_t adaptive_chunk_fill = 256 << 10;
  // Gather/scatter kernels (scattered blocks on either side) run on a second stream, so that one
  // chunk's kernel overlaps the next chunk's copy instead of following it; false = one stream
  // per side (the previous behaviour, kept to measure both side by side).
  bool overlap_kernels = true;
  // How often the pipeline threads look at copy events (and doorbells) while chunks are in
  // flight (they also wake on every message). 0 = busy wait (a core each while chunks are in
  // flight, and the receiver's for 2 ms after its last chunk): no sleep and wake-up per look.
  int64_t poll_us = 0;
  // Zero-copy endpoints: announce chunks and hand slots back through doorbell words in the
  // shared staging area (each side polls them while chunks are in flight) rather than through a
  // UCX message each way; the writer still sends the announcement as a wake-up. false = UCX
  // messages only (the previous behaviour, kept to measure both side by side).
  bool doorbells = true;
  // Receiver: a lost writer's slots are reused once the writer process is known to have exited,
  // or after this long (a copy or put of it could still be landing).
  int64_t reclaim_quarantine_ms = 2000;
  // Receiver: a writer that holds slots and has heard nothing for this long gets a ping, so a
  // dead one shows up as a failed send.
  int64_t writer_ping_ms = 250;
};

// Applies the environment's overrides to `options`: KVSTREAM_STAGED_ZERO_COPY=0 (zero_copy =
// kOff; 1 = kAuto), KVSTREAM_STAGED_CHUNK_MIB=N (chunk_bytes = N MiB, 1..256),
// KVSTREAM_STAGED_FILL_KIB=N (adaptive_chunk_fill = N KiB, 0..65536; 0 = off); unset or
// malformed values change nothing. The registry's CreateStagedTransport(TransportOptions) calls
// it, so the daemons can be switched without a rebuild; the StagedOptions overload does not.
void ApplyStagedEnv(StagedOptions* options);

// kUnavailable without a usable GPU; kNotSupported when UCX is not built in.
Result<std::unique_ptr<Transport>> CreateStagedTransport(const StagedOptions& options);
// For the registry (backend "ucx_staged").
Result<std::unique_ptr<Transport>> CreateStagedTransport(const TransportOptions& options);

// How an endpoint made by a ucx_staged transport's Connect() moves chunks: "zero_copy" (device
// -> host copies straight into the same-host peer's slots) or "ucx_put"; "" for an endpoint of
// another backend.
std::string EndpointPath(const Endpoint& endpoint);

// The UCX path for GPU memory on this host: "ucx" when UCX reports CUDA memory support
// (ucp_context_query lists UCS_MEMORY_TYPE_CUDA, as NVIDIA's HPC-X builds do), else
// "ucx_staged". The inner UCX transport used to ask is created with `options` and discarded.
Result<std::string> SelectGpuBackend(const TransportOptions& options);

}  // namespace kvstream::transport::staged
