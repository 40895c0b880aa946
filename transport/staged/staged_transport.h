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
//  - Connect(): makes the inner UCX endpoint to the peer's staging area; its admission ticket is
//    the endpoint's (Endpoint::AdmissionTicket), and the peer's Admit() passes it to its inner
//    transport: the inner listeners accept only admitted connections, as the ucx backend's do.
//    At the first Write() (so after the peer admitted it) the endpoint says hello through a
//    mailbox, naming its ticket; the peer answers over that same connection
//    (ucx::ReplyEndpoint: credits and completions; no connection goes back) and grants this
//    endpoint up to `credits_per_peer` staging slots. No slot within connect_timeout_ms of the
//    hello (connection refused, peer gone) fails the endpoint.
//  - Notifications keep their MAC (Notification::mac travels in the chunk descriptor).
//  - Two ways for a chunk's bytes into the peer's slot, chosen per endpoint at Connect():
//    * zero-copy (same host): the inner endpoint maps the peer's staging memfd
//      (ucx::MapPeerRegion) and this process page-locks its own mapping, so the writer's
//      device -> host copy lands directly in the peer's slot; doorbell words in the shared slot
//      headers say a chunk is ready and hand the slot back (UCX carries a wake-up announcement
//      only). Chosen when the mapping and the page-locking both succeed (logged), unless
//      zero_copy is kOff.
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
#include "transport/options.h"
#include "transport/transport.h"

namespace kvstream::transport::staged {

// kUnavailable without a usable GPU; kNotSupported when UCX is not built in.
Result<std::unique_ptr<Transport>> CreateStagedTransport(const StagedOptions& options);
// For the registry (backend "ucx_staged"): options.staged, with options.device and options.ucx.
Result<std::unique_ptr<Transport>> CreateStagedTransport(const TransportOptions& options);

// How an endpoint made by a ucx_staged transport's Connect() moves chunks: "zero_copy" (device
// -> host copies straight into the same-host peer's slots) or "ucx_put"; "" for an endpoint of
// another backend.
std::string EndpointPath(const Endpoint& endpoint);

}  // namespace kvstream::transport::staged
