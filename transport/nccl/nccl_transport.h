// NCCL transport: moves CUDA device memory between two GPUs (same host over NVLink/PCIe, or across
// hosts over NCCL's network) through a two-rank NCCL communicator per writer endpoint. Registered
// as "nccl" only when CUDA and NCCL are built in.
//
// How it maps onto transport.h (two-sided underneath, one-sided to the caller):
//  - LocalAddress(): "nccl:tcp:<host>:<port>:<hex admission id>": this transport's control
//    socket (TCP; <host> from NcclOptions::advertise_host, default 127.0.0.1) and a random
//    128-byte admission id, a fresh one per call (so per handshake: the handshake carries
//    LocalAddress() over the authenticated control plane). A writer's hello must present an id
//    issued and not yet used: the hello uses it up (a replayed address is refused,
//    kFailedPrecondition, counted in counters().connections_refused); ids never presented expire
//    after 10 minutes (at most 256 wait at a time). The NCCL unique id of the communicator is
//    made per admitted connection and travels only in the hello ack on that connection.
//  - Register(kCuda region on this transport's device): RemoteKey = registration id, length,
//    device PCI id and host identity. kHost: kNotSupported.
//  - Connect(): TCP to the peer's control socket, hello / hello ack, then both ends
//    ncclCommInitRankConfig (2 ranks, writer rank 0, receiver rank 1) NON-BLOCKING, polled with
//    a deadline (connect_timeout_ms) while watching the socket; then, inside the same deadline,
//    a 16-byte warm-up send (writer) / receive (receiver) on the stream writes use, waited for
//    to its end: NCCL connects the point-to-point channel on first use (~100 ms), so this puts
//    that into Connect instead of the connection's first Write(). A warm-up that fails or runs
//    past the deadline fails Connect (kRemoteDisconnect / kTimeout / kInternal) with everything
//    released. Both ends on one GPU (same host, same PCI id): kFailedPrecondition before NCCL
//    is touched (NCCL refuses two ranks on a GPU).
//  - Write(): validates and coalesces ops (transport/cuda's CopyPlanner), records an event on
//    `after_stream`, hands the write to the endpoint's thread, which sends a header (runs,
//    bytes, notification) on the control socket and then, on its own lowest-priority streams:
//      direct mode (few or long runs): one ncclSend per run, grouped, straight from the source;
//      pack mode (many scattered runs): a gather kernel packs runs into one of two staging
//      buffers of chunk_bytes, one ncclSend per chunk (packing chunk i+1 overlaps sending i).
//    The receiver's thread posts the matching ncclRecv (into the pool, or into staging followed
//    by the scatter kernel), and once that has completed on its GPU it hands the notification to
//    the sink and acks. The WriteHandle completes on the ack AND the sender's streams being done
//    with the source: so "notified only after every byte landed" holds, and Done() means the
//    source may be reused.
//  - Cancel(): a write not yet handed to NCCL is dropped (kCanceled, no bytes, no notification);
//    one already posted runs to its end.
//  - Peer death: EOF on the control socket (either side) -> ncclCommAbort -> pending and later
//    writes kRemoteDisconnect. NCCL async errors likewise abort the communicator. Every wait
//    (init, group end, close) has a deadline.
//  - ~Endpoint: drops writes not yet posted (kCanceled), lets posted ones finish for at most
//    close_timeout_ms, then aborts the communicator (nothing more can land) and fails the rest
//    with kCanceled.
//  - A write for a receiver registration that was destroyed meanwhile makes the receiver drop
//    the connection (the writer sees kRemoteDisconnect): the byte stream cannot be re-synced.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "transport/options.h"
#include "transport/transport.h"

namespace kvstream::transport::nccl {

// NcclOptions, CopyMode: transport/options.h.

// kUnavailable when no CUDA device is usable (message says why). Sets NCCL_NVLS_ENABLE=0 in the
// process environment unless it is set already (this transport makes point-to-point calls only).
Result<std::unique_ptr<Transport>> CreateNcclTransport(const NcclOptions& options);
// For the registry: options.nccl on options.device.
Result<std::unique_ptr<Transport>> CreateNcclTransport(const TransportOptions& options);

// "NCCL <major>.<minor>.<patch>" of the library loaded at run time.
std::string NcclVersionString();

}  // namespace kvstream::transport::nccl
