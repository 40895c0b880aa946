// UCX backend of transport/transport.h (ucp RMA puts + active-message notifications).
//
// Files: ucx_worker (context, worker, progress thread), ucx_receiver (registrations and the
// notification handler), ucx_writer and ucx_host_copy (endpoints and writes), ucx_wire.
//
// Threading: one ucp worker per Transport, owned by a dedicated progress thread (the worker is
// created UCS_THREAD_MODE_SINGLE and only that thread calls into it). Callers hand work to it
// through a queue; the thread spins on ucp_worker_progress while anything is in flight and
// sleeps on the worker's event fd (UCP_FEATURE_WAKEUP) plus an eventfd when idle.
//
// Write(): the adjacent CopyOps are coalesced; every run is posted with ucp_put_nbx, then one
// ucp_ep_flush_nbx waits for remote completion of all of them, and only then, if asked, an
// active message {request_id, layer, flags} carries the notification. The receiver's AM
// handler calls the NotificationSink on its progress thread. CUDA memory on either side: each
// run is an active-message rendezvous instead, which the receiver lands only inside memory it
// registered; notifications wait for the data messages that came before them (ucx_writer.h,
// ucx_receiver.h).
//
// Peer failure: endpoints are created with UCP_ERR_HANDLING_MODE_PEER and an error callback;
// the failure marks the endpoint kRemoteDisconnect and fails pending and later writes.
//
// Same host: UCX 1.13 cannot use its shared-memory transports on endpoints with peer-failure
// handling, so when the peer runs on this host (same boot id and pid namespace) and UCX_TLS
// admits shared memory (empty, "sm", "shm", "cma", "all"; UcxOptions::same_host_copy = false
// turns it off), the data is copied by a copier thread instead, but only into a peer proven by
// its same-host gate (ucx_same_host.h: a 0600 Unix socket in a private directory, SO_PEERCRED,
// the token from the address; the peer's pid comes from the kernel, never from a message) and
// only inside the ranges that peer registered, as it grants them: memcpy into Allocate()d
// memory (the memfd the gate passed, mapped here) or process_vm_writev into memory it
// registered. A peer region the gate does not cover is refused by Connect() (kInvalidArgument);
// no gate (or a wrong token, another uid): UCX puts. The copy is complete when it returns, so
// no flush is needed; the notification then goes over the UCX endpoint as above. A pidfd on the
// peer process and the UCX endpoint both report its death.
//
// Wire (ucx_wire.h): the address, memory keys and notifications are envelopes of
// transport/core/envelope.h around UCX's blobs, so a truncated or foreign blob is refused with
// kInvalidArgument.
// Connect() retries ucp_ep_create a few times when UCX reports the peer unreachable (seen on
// overloaded sandboxes).
//
// Endpoint destruction: flush (bounded by kCloseFlushTimeout), then force-close the ucp
// endpoint, then wait until every write through it has completed (canceled ones with
// kCanceled). When the flush completes, every put is complete at the destination and nothing
// more can land. When it does not (peer unresponsive), the endpoint is force-closed anyway:
// over TCP, bytes already handed to the kernel could in principle still reach a live peer,
// which is why the destination must treat that connection as lost.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "common/status.h"
#include "transport/transport.h"

namespace kvstream::transport::ucx {

Result<std::unique_ptr<Transport>> CreateUcxTransport(const TransportOptions& options);

// A same-host peer's Allocate()d region mapped into this process (MAP_SHARED over the peer's
// memfd): bytes stored through data() are in the peer's memory at once, with no copy by UCX
// (the host-staged GPU path lets a device-to-host copy land there directly). The mapping is
// this object's own (a second mapping of the same file, not the endpoint's): it stays valid
// after the endpoint is destroyed and after the peer exits (the pages then belong to no one
// else; nothing written reaches anybody), and it is unmapped when this object is destroyed.
class PeerMapping {
 public:
  PeerMapping(void* map, size_t map_length, size_t offset, size_t length)
      : map_(map), map_length_(map_length), offset_(offset), length_(length) {}
  ~PeerMapping();
  PeerMapping(const PeerMapping&) = delete;
  PeerMapping& operator=(const PeerMapping&) = delete;
  // The region's first byte (the peer's RemoteRegion::addr) and its length.
  void* data() const { return static_cast<char*>(map_) + offset_; }
  size_t length() const { return length_; }

 private:
  void* map_;
  size_t map_length_;
  size_t offset_;
  size_t length_;
};

// Maps region `region` of the peer `endpoint` (made by a UCX transport's Connect) writes into,
// when that endpoint already reaches it as a same-host memfd mapping (peer on this host, the
// region made by the peer's Allocate(), UCX_TLS admitting shared memory, same_host_copy
// on). kNotSupported otherwise (peer elsewhere, memory the peer only registered, another
// backend's endpoint), kInvalidArgument for a region index out of range, or the mmap error.
Result<std::unique_ptr<PeerMapping>> MapPeerRegion(const Endpoint& endpoint, int region);

// Receiver: an endpoint that sends notifications back to the writer whose connection
// `transport` (a UCX transport) admitted for `ticket` (that writer's
// Endpoint::AdmissionTicket()), over that very connection: the writer accepts no connection of
// ours, so nothing has to be admitted there. Write() carries notifications only (no CopyOp,
// remote_region 0, a local registration of `transport`); they reach the writer transport's
// NotificationSink. The endpoint fails (kRemoteDisconnect) once that connection closes.
// kUnavailable when no connection of that ticket is open (not arrived yet, or closed),
// kInvalidArgument for a malformed ticket, kNotSupported for another backend's transport.
Result<std::unique_ptr<Endpoint>> ReplyEndpoint(Transport& transport, const std::string& ticket);

// UCX's own description of the connection `endpoint` (made by a UCX transport's Connect) uses:
// its lanes and the transports behind them (ucp_ep_print_info), e.g. to check that a selection
// (UCX_TLS) took. kNotSupported for another backend's endpoint, kUnavailable before its first
// write (the connection is made then) or once it is closed.
Result<std::string> DescribeEndpoint(const Endpoint& endpoint);

// Whether the backend moves CUDA memory itself (Capabilities::cuda_memory) with a UCX of this
// version whose context reports CUDA memory: from UCX 1.13 (the oldest release tested), writing
// it as active-message rendezvous (ucx_writer.h), never with puts, which copy device memory with
// the host's memcpy before 1.16 (docs/transports.md, "A CUDA-enabled UCX"). Otherwise the GPU
// pools go through ucx_staged.
bool MovesCudaMemory(unsigned ucx_major, unsigned ucx_minor, bool context_reports_cuda);

// `tls` (UCX's syntax, "" = UCX_TLS from the environment, else every transport) without UCX's
// CUDA transports (cuda_copy, cuda_ipc, gdr_copy). For a transport that moves host memory only
// (ucx_staged's inner one): with them, a UCX built with CUDA page-locks every host registration
// itself (cudaHostRegister), which then fails for its owner.
std::string TlsWithoutCuda(const std::string& tls);

// Whether a UCX_TLS selection (UCX's syntax: "a,b", "^a,b"; empty = all) names only transports
// that cannot detect a failed peer (shared memory, self). UCX 1.13 cannot create kvstream's
// error-handling endpoints over those alone, so the backend warns of such a selection up front.
bool TlsLacksPeerFailureTransport(const std::string& tls);

}  // namespace kvstream::transport::ucx
