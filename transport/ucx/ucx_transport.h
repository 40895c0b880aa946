// UCX backend of transport/transport.h (ucp RMA puts + active-message notifications).
//
// Threading: one ucp worker per Transport, owned by a dedicated progress thread (the worker is
// created UCS_THREAD_MODE_SINGLE and only that thread calls into it). Callers hand work to it
// through a queue; the thread spins on ucp_worker_progress while anything is in flight and
// sleeps on the worker's event fd (UCP_FEATURE_WAKEUP) plus an eventfd when idle.
//
// Write(): the adjacent CopyOps are coalesced; every run is posted with ucp_put_nbx, then one
// ucp_ep_flush_nbx waits for remote completion of all of them, and only then, if asked, an
// active message {request_id, layer, flags} carries the notification. The receiver's AM
// handler calls the NotificationSink on its progress thread.
//
// Peer failure: endpoints are created with UCP_ERR_HANDLING_MODE_PEER and an error callback;
// the failure marks the endpoint kRemoteDisconnect and fails pending and later writes.
//
// Endpoint destruction: flush (bounded by kCloseFlushTimeout), then force-close the ucp
// endpoint, then wait until every write through it has completed (canceled ones with
// kCanceled). When the flush completes, every put is complete at the destination and nothing
// more can land. When it does not (peer unresponsive), the endpoint is force-closed anyway:
// over TCP, bytes already handed to the kernel could in principle still reach a live peer,
// which is why the destination must treat that connection as lost.
#pragma once

#include <memory>

#include "common/status.h"
#include "transport/transport.h"

namespace kvstream::transport::ucx {

Result<std::unique_ptr<Transport>> CreateUcxTransport(const TransportOptions& options);

}  // namespace kvstream::transport::ucx
