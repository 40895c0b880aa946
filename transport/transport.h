// The data plane: one interface, several backends (transport/<backend>/).
//
// Model of operation (one-sided, push):
//  1. Each side creates a Transport, registers the memory it exposes (the decode side its KV
//     pool) and publishes LocalAddress() and each Registration's RemoteKey() through the
//     control plane (gRPC handshake).
//  2. The writer (prefill) Connect()s to the peer with that data and posts Write()s: copies
//     from its own registered memory into the peer's registered memory, optionally followed
//     by a notification (request id, layer) that the peer's NotificationSink receives ONLY
//     AFTER every byte of that write is complete at the destination (unless the receiver asked
//     its backend for early notifications: see kNotificationLandedOnEvent).
//  3. The receiver never calls anything per transfer; it just receives notifications.
//
// Guarantees:
//  - Write() is asynchronous: the local source must stay unchanged until the returned
//    WriteHandle is done. Wait() with a deadline never blocks past it; on kTimeout the write
//    may still be in flight (Cancel() it and wait for it to be done, or destroy the endpoint,
//    before reusing the destination).
//  - Adjacent CopyOps (contiguous on both sides) are coalesced by the backend.
//  - A peer that dies or a cut link surfaces as kRemoteDisconnect on pending and later writes
//    and on the endpoint's status, never as a hang.
//  - Destroying an Endpoint stops every write through it (after it returns, nothing more can
//    land in the peer's memory through that endpoint) and finishes them: each of its
//    WriteHandles is then done, OK if it completed, kCanceled (or the error) otherwise. It takes
//    bounded time (a backend may first let in-flight writes finish, for a bounded while).
//    Destroying a Registration deregisters.
//  - Operations a backend lacks return kNotSupported; see Capabilities.
//  - Bad input to Write() (null or foreign local registration, remote region index out of
//    range, an op past the end of either region) is refused with kInvalidArgument before
//    anything is posted; other writes are not disturbed.
//  - Registration, Endpoint and WriteHandle objects may outlive the Transport that made them
//    (each keeps what it needs alive); a Registration must outlive the writes posted from it.
//  - Thread safety: every call may be made from any thread; Write() may be called
//    concurrently on one Endpoint. Do not destroy an Endpoint or Transport from inside the
//    NotificationSink (it runs on the transport's own thread).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/time.h"
#include "transport/options.h"

namespace kvstream::transport {

enum class MemoryKind : uint8_t { kHost = 0, kCuda = 1 };

struct MemoryRegion {
  void* addr = nullptr;
  size_t length = 0;
  MemoryKind kind = MemoryKind::kHost;
  int device = -1;  // CUDA ordinal for kCuda
};

struct Capabilities {
  bool host_memory = false;   // can register and move host memory
  bool cuda_memory = false;   // can register and move CUDA device memory directly
  bool remote = false;        // can reach another host (else same host only)
  bool notifications = false; // Write(..., notify) supported
  bool notification_mac = false;  // Notification::mac reaches the receiver's sink
};

// A registered memory region. RemoteKey() is an opaque blob the peer passes to Connect().
// Destroying it deregisters the memory; a Registration made by Transport::Allocate() also
// frees the memory it owns.
class Registration {
 public:
  virtual ~Registration() = default;
  virtual const MemoryRegion& region() const = 0;
  virtual std::string RemoteKey() const = 0;
};

// What the control plane tells a writer about the peer's memory.
struct RemoteRegion {
  uint64_t addr = 0;       // peer's virtual address of the region start
  uint64_t length = 0;
  std::string key;         // the peer Registration's RemoteKey()
};

struct PeerDescriptor {
  std::string address;                 // peer Transport::LocalAddress()
  std::vector<RemoteRegion> regions;
  // Where the control plane saw the peer (an IP literal, e.g. the gRPC caller's address). A
  // backend whose address names no host of its own (a listener on every interface) connects
  // there; empty: the address alone decides (loopback where it names none).
  std::string host;
};

struct CopyOp {
  uint64_t local_offset = 0;   // into the local registration
  uint64_t remote_offset = 0;  // into the remote region
  uint64_t length = 0;
};

// Bytes of Notification::mac.
inline constexpr size_t kNotificationMacBytes = 16;

struct Notification {
  uint64_t request_id = 0;
  int32_t layer = 0;
  int32_t flags = 0;     // reserved (e.g. last layer / error)
  // Early notifications only (kNotificationLandedOnEvent): the backend's sequence number of
  // the write, what StreamWaitLanded waits for. 0 otherwise.
  uint32_t landed_seq = 0;
  // A tag the writer's caller sets and the receiver's caller checks (the connector's MAC:
  // connector/notification_mac.h). Backends with Capabilities::notification_mac deliver it
  // unchanged; others deliver zeros.
  std::array<uint8_t, kNotificationMacBytes> mac{};
};

// Notification::flags bit of an EARLY notification: sent when the write's copy was enqueued,
// not when it completed. Only a receiver that asked for them gets these (cuda_ipc with
// gpu_landed_wait); the data is complete once the writer's GPU stream has written landed_seq
// into the flag the notification names, so the receiver must call
// Transport::StreamWaitLanded(n, stream, deadline) before work on `stream` reads it, and
// Transport::ConfirmLanded(n) once that work has completed, before it uses the results. The
// other flag bits of such a notification are the backend's (which flag).
inline constexpr int32_t kNotificationLandedOnEvent = 1 << 30;

struct WriteRequest {
  const Registration* local = nullptr;
  int remote_region = 0;        // index into PeerDescriptor::regions
  std::vector<CopyOp> ops;
  bool notify = false;
  Notification notification;    // delivered after the data, if notify
  // Optional producer dependency (GPU backends): a cudaStream_t on the local registration's
  // device. The copy starts only after all work enqueued on it before Write() returned
  // (the backend records an event on it and makes its copy stream wait on that event; the
  // caller's thread is not blocked). Lets prefill post a layer's write right after enqueueing
  // that layer's compute. nullptr = no dependency (the source is ready now). Backends whose
  // sources are never GPU memory return kNotSupported when it is set.
  void* after_stream = nullptr;
};

class WriteHandle {
 public:
  virtual ~WriteHandle() = default;
  virtual bool Done() const = 0;
  // OK once complete at the destination (and notified, if asked); the error otherwise.
  virtual Status Wait(Deadline deadline) = 0;
  virtual uint64_t bytes() const = 0;
  // How many contiguous transfers the backend posted for this write after coalescing adjacent
  // CopyOps (0 where a backend does not report it).
  virtual uint64_t transfers() const { return 0; }
  // Asks the backend to stop this write: what is not posted yet is not posted, and the
  // notification is not sent if it has not gone yet. Non-blocking, any thread, idempotent.
  // The handle still completes only once the backend no longer reads the source and none of
  // the write's bytes are in flight (kCanceled, or OK / the error if it finished first), so
  // Done() / Wait() keep telling when the source may be reused; a write cancelled this way
  // may have landed partly. Returns false where the backend cannot cancel (the write then
  // runs to its end).
  virtual bool Cancel() { return false; }
};

class Endpoint {
 public:
  virtual ~Endpoint() = default;
  virtual Result<std::unique_ptr<WriteHandle>> Write(const WriteRequest& request) = 0;
  // OK while the peer is reachable; kRemoteDisconnect once it is known lost.
  virtual Status status() const = 0;
  // What the peer's Transport::Admit() needs before this endpoint's connection is accepted
  // there (empty: the backend admits nothing itself). Send it back to the peer over the
  // authenticated control plane; writes posted before the peer admits it wait (then fail with
  // kRemoteDisconnect when the peer refuses the connection).
  virtual std::string AdmissionTicket() const { return ""; }
};

// Connections a backend accepted from or refused to writers, and notifications it dropped
// (monotonic since the transport was made).
struct TransportCounters {
  uint64_t connections_admitted = 0;
  uint64_t connections_refused = 0;
};

// Called on a transport thread; must not block.
using NotificationSink = std::function<void(const Notification&)>;

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string name() const = 0;
  virtual Capabilities capabilities() const = 0;
  virtual std::string LocalAddress() const = 0;
  virtual Result<std::unique_ptr<Registration>> Register(const MemoryRegion& region) = 0;
  // Allocates `length` bytes of host memory in the form this backend moves fastest (e.g. UCX
  // shared memory that a peer on the same host maps and copies into directly) and registers
  // it. The Registration owns the memory (contents unspecified) and frees it when
  // destroyed. kNotSupported where a backend has no allocator of its own: use Register().
  virtual Result<std::unique_ptr<Registration>> Allocate(size_t length) {
    return NotSupported(name() + " transport has no allocator; use Register()");
  }
  virtual Result<std::unique_ptr<Endpoint>> Connect(const PeerDescriptor& peer) = 0;
  // Receiver: admits the writer whose endpoint's AdmissionTicket() this is. Backends that admit
  // connections (UCX) accept a writer's connection only once its ticket is admitted (a request
  // that waits longer than a short hold is refused, counted in counters()); the ticket admits
  // one connection, within a bounded time. OK for an empty ticket where the backend needs none;
  // kInvalidArgument for a malformed one.
  virtual Status Admit(const std::string& ticket) {
    if (ticket.empty()) return OkStatus();
    return InvalidArgument(name() + " transport takes no admission tickets");
  }
  virtual TransportCounters counters() const { return {}; }
  // Set before peers connect. Notifications that arrive with no sink are dropped.
  virtual void SetNotificationSink(NotificationSink sink) = 0;
  // For a notification with kNotificationLandedOnEvent: makes `stream` (a cudaStream_t on this
  // transport's device) wait, on the GPU, until that write's data is complete; the host does not
  // block. OK at once for any other notification (its data is already complete).
  // The wait never lasts forever: if the writer's connection closes (writer died) or `deadline`
  // passes first, the transport releases the stream itself, and ConfirmLanded then says the
  // data did not land. kUnavailable when the writer's connection is gone before the wait is
  // issued (treat the layer as lost); kNotSupported from backends that never send early
  // notifications.
  virtual Status StreamWaitLanded(const Notification& n, void* stream, Deadline deadline) {
    if ((n.flags & kNotificationLandedOnEvent) == 0) return OkStatus();
    return NotSupported(name() + " sends no early notifications");
  }
  // After the work that followed StreamWaitLanded(n, ...) has completed: OK if that wait was
  // released by the write's data landing; kUnavailable if the transport released it because
  // the writer died or the deadline passed (the data may be incomplete: discard what was
  // computed from it). OK for a notification without kNotificationLandedOnEvent.
  virtual Status ConfirmLanded(const Notification& n) {
    if ((n.flags & kNotificationLandedOnEvent) == 0) return OkStatus();
    return NotSupported(name() + " sends no early notifications");
  }
};

// Creates a backend by name; kNotSupported if it was not built in.
Result<std::unique_ptr<Transport>> CreateTransport(const TransportOptions& options);
std::vector<std::string> AvailableBackends();

// The backend to create for pools of `memory`, by capability: for CUDA memory, "ucx" means UCX
// itself where it can move CUDA memory (Capabilities::cuda_memory; the UCX transport made to
// ask is discarded), else the host-staged "ucx_staged". Any other request is returned as asked.
// kNotSupported where neither is built in; UCX's error where it cannot start.
Result<std::string> ResolveBackend(const TransportOptions& options, MemoryKind memory);

}  // namespace kvstream::transport
