#include "transport/ucx/ucx_writer.h"

#include <chrono>

#include "common/log.h"

#if KVSTREAM_UCX_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvstream::transport::ucx {
namespace {

constexpr auto kCloseFlushTimeout = std::chrono::seconds(2);
constexpr auto kCloseWaitTimeout = std::chrono::seconds(10);

}  // namespace

using internal::CompletionHandle;
using internal::Run;
using internal::WriteCompletion;

void OnEndpointError(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* ep = static_cast<UcxEndpointState*>(arg);
  ep->MarkFailed(RemoteDisconnect(std::string("ucx: peer lost: ") + ucs_status_string(status)));
}

static void MaybeSignalClosed(UcxEndpointState* ep) {
  if (!ep->closing || ep->ep != nullptr || ep->inflight != 0) return;
  {
    std::lock_guard<std::mutex> lock(ep->mu);
    if (ep->closed) return;
    ep->closed = true;
  }
  ep->closed_cv.notify_all();
}

static void ReleaseDep(UcxWriteOp* op) {
#if KVSTREAM_UCX_HAVE_CUDA
  if (op->dep != nullptr) {
    cudaSetDevice(op->dep_device);
    cudaEventDestroy(static_cast<cudaEvent_t>(op->dep));
  }
#endif
  op->dep = nullptr;
}

void FinishWrite(UcxWriteOp* op, Status status) {
  ReleaseDep(op);
  op->completion->Complete(std::move(status));
  UcxEndpointState* ep = op->ep.get();
  --ep->inflight;
  --ep->worker->busy;
  std::shared_ptr<UcxEndpointState> keep = std::move(op->ep);
  delete op;
  MaybeSignalClosed(ep);
}

// A failed request on a lost or closing endpoint reports why the endpoint went away.
static Status OpFailure(UcxWriteOp* op, ucs_status_t st, const char* what) {
  if (op->ep->failed.load()) return op->ep->Error();
  if (st == UCS_ERR_CANCELED) return Canceled("ucx: write canceled: endpoint closed");
  return FromUcs(st, std::string("ucx: ") + what);
}

static void OnNotifySent(void* request, ucs_status_t st, void* user) {
  auto* op = static_cast<UcxWriteOp*>(user);
  if (request != nullptr) ucp_request_free(request);
  FinishWrite(op, st == UCS_OK ? OkStatus() : OpFailure(op, st, "notification"));
}

void OnWriteFlushed(void* request, ucs_status_t st, void* user) {
  auto* op = static_cast<UcxWriteOp*>(user);
  if (request != nullptr) ucp_request_free(request);
  if (st != UCS_OK) return FinishWrite(op, OpFailure(op, st, "flush"));
  if (!op->put_error.ok()) return FinishWrite(op, op->put_error);
  if (!op->notify) return FinishWrite(op, OkStatus());
  if (op->completion->cancel_requested()) {
    return FinishWrite(op, Canceled("ucx: write canceled before its notification"));
  }
  if (op->ep->closing.load() || op->ep->ep == nullptr) {
    return FinishWrite(op, Canceled("ucx: endpoint closed before the notification"));
  }
  // Every put is complete at the destination: now the notification may go.
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                   UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_AM_SEND_FLAG_EAGER;
  p.cb.send = &OnNotifySent;
  p.user_data = op;
  ucs_status_ptr_t r =
      ucp_am_send_nbx(op->ep->ep, kNotifyAmId, op->notify_header.data(),
                      op->notify_header.size(), nullptr, 0, &p);
  if (r == nullptr) return OnNotifySent(nullptr, UCS_OK, op);
  if (UCS_PTR_IS_ERR(r)) return OnNotifySent(nullptr, UCS_PTR_STATUS(r), op);
}

bool EnsureConnected(UcxEndpointState* ep) {
  if (ep->ep != nullptr) return true;
  if (ep->connect_tried) return false;
  ep->connect_tried = true;
  // To the peer's listener, from the socket address our ticket names, never to an address the
  // peer packed: the peer accepts the connection only if it admitted that ticket first.
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_LOCAL_SOCK_ADDR |
                 UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                 UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER | UCP_EP_PARAMS_FLAGS_SEND_CLIENT_ID;
  p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&ep->dial);
  p.sockaddr.addrlen = ep->dial_length;
  p.local_sockaddr.addr = reinterpret_cast<const sockaddr*>(&ep->source);
  p.local_sockaddr.addrlen = ep->source_length;
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler.cb = &OnEndpointError;
  p.err_handler.arg = ep;
  ucs_status_t st = ucp_ep_create(ep->worker->worker(), &p, &ep->ep);
  if (st != UCS_OK) {
    ep->ep = nullptr;
    ep->MarkFailed(FromUcs(st, "ucx: connecting to the peer's listener"));
    return false;
  }
  for (size_t i = 0; i < ep->packed_keys.size(); ++i) {
    ucp_rkey_h rkey = nullptr;
    st = ucp_ep_rkey_unpack(ep->ep, ep->packed_keys[i].data(), &rkey);
    if (st != UCS_OK) {
      ep->MarkFailed(
          FromUcs(st, "ucx: unpacking the memory key of region " + std::to_string(i)));
      break;
    }
    ep->rkeys.push_back(rkey);
  }
  ep->packed_keys.clear();
  return true;
}

static void OnDataSent(void* request, ucs_status_t st, void* user) {
  auto* op = static_cast<UcxWriteOp*>(user);
  if (request != nullptr) ucp_request_free(request);
  if (st != UCS_OK && op->put_error.ok()) op->put_error = OpFailure(op, st, "data message");
  if (--op->am_pending == 0) OnWriteFlushed(nullptr, UCS_OK, op);
}

// Progress thread: every run as a data message; the write goes on (OnWriteFlushed) once all of
// them completed.
static void SendDataMessages(UcxWriteOp* op) {
  UcxEndpointState* ep = op->ep.get();
  if (ep->closing || ep->failed.load()) {
    Status e = ep->Error();
    return FinishWrite(op, e.ok() ? Canceled("ucx: endpoint is closing") : e);
  }
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                   UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_MEMORY_TYPE |
                   UCP_OP_ATTR_FIELD_MEMH;
  // Rendezvous always: the receiver then lands the bytes itself, memory-type-aware.
  p.flags = UCP_AM_SEND_FLAG_RNDV;
  p.memory_type = op->cuda_source ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
  p.memh = op->reg->memh;
  p.cb.send = &OnDataSent;
  p.user_data = op;
  auto* base = static_cast<uint8_t*>(op->reg->region.addr);
  op->am_headers.reserve(op->runs.size());  // no reallocation: UCX holds the pointers
  op->am_pending = 1;  // held while posting
  for (const Run& run : op->runs) {
    if (op->completion->cancel_requested()) {
      op->put_error = Canceled("ucx: write canceled");
      break;
    }
    op->am_headers.push_back(
        EncodeDataHeader(UcxDataHeader{op->remote_base + run.remote_offset, run.length}));
    const std::string& h = op->am_headers.back();
    ucs_status_ptr_t r = ucp_am_send_nbx(ep->ep, kDataAmId, h.data(), h.size(),
                                         base + run.local_offset, run.length, &p);
    if (UCS_PTR_IS_ERR(r)) {
      op->put_error = OpFailure(op, UCS_PTR_STATUS(r), "ucp_am_send_nbx");
      break;
    }
    if (r != nullptr) ++op->am_pending;
  }
  if (--op->am_pending == 0) OnWriteFlushed(nullptr, UCS_OK, op);
}

// Progress thread: sends once the event after_stream recorded has completed (polled each turn
// of the loop), or fails the write with the CUDA error.
static void SendAfterDependency(UcxWriteOp* op) {
#if KVSTREAM_UCX_HAVE_CUDA
  UcxWorker* w = op->ep->worker;
  w->watchers[op] = [op] {
    cudaSetDevice(op->dep_device);
    cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(op->dep));
    if (e == cudaErrorNotReady && !op->completion->cancel_requested() &&
        !op->ep->failed.load()) {
      return false;
    }
    ReleaseDep(op);
    if (e != cudaSuccess && e != cudaErrorNotReady) {
      FinishWrite(op, Internal(std::string("ucx: the write's stream failed: ") +
                               cudaGetErrorString(e)));
    } else if (op->completion->cancel_requested()) {
      FinishWrite(op, Canceled("ucx: write canceled"));
    } else {
      SendDataMessages(op);
    }
    return true;
  };
#else
  FinishWrite(op, Internal("ucx: after_stream without CUDA"));
#endif
}

void StartWrite(UcxWriteOp* op) {
  UcxEndpointState* ep = op->ep.get();
  ++ep->inflight;
  ++ep->worker->busy;
  if (ep->closing) return FinishWrite(op, Canceled("ucx: endpoint is closing"));
  if (op->completion->cancel_requested()) return FinishWrite(op, Canceled("ucx: write canceled"));
  if (!EnsureConnected(ep) || ep->failed.load()) {
    Status e = ep->Error();
    return FinishWrite(op, e.ok() ? RemoteDisconnect("ucx: not connected to the peer") : e);
  }
  op->rkey = ep->rkeys[op->remote_region];
  if (op->runs.empty() && !op->notify) return FinishWrite(op, OkStatus());
  if (op->host_copy && !op->runs.empty()) {
    // The copier owns the op until it posts it back; the progress thread need not spin.
    --ep->worker->busy;
    ep->worker->copier().Post([op] { CopyOnHost(op); });
    return;
  }

  if (op->am_data) {
    if (op->dep != nullptr) return SendAfterDependency(op);
    if (op->runs.empty()) return OnWriteFlushed(nullptr, UCS_OK, op);
    return SendDataMessages(op);
  }

  ucp_request_param_t put{};
  put.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
  put.memh = op->reg->memh;
  auto* base = static_cast<uint8_t*>(op->reg->region.addr);
  // No completion callback per put: the flush below covers all of them, and a request the put
  // returns is released at once (UCX frees it when it completes).
  for (const Run& run : op->runs) {
    if (op->completion->cancel_requested()) {
      op->put_error = Canceled("ucx: write canceled");
      break;
    }
    ucs_status_ptr_t r = ucp_put_nbx(ep->ep, base + run.local_offset, run.length,
                                     op->remote_base + run.remote_offset, op->rkey, &put);
    if (UCS_PTR_IS_ERR(r)) {
      op->put_error = OpFailure(op, UCS_PTR_STATUS(r), "ucp_put_nbx");
      break;
    }
    if (r != nullptr) ucp_request_free(r);
  }
  ucp_request_param_t fl{};
  fl.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  fl.cb.send = &OnWriteFlushed;
  fl.user_data = op;
  ucs_status_ptr_t r = ucp_ep_flush_nbx(ep->ep, &fl);
  if (r == nullptr) return OnWriteFlushed(nullptr, UCS_OK, op);
  if (UCS_PTR_IS_ERR(r)) return OnWriteFlushed(nullptr, UCS_PTR_STATUS(r), op);
}

// ---- closing an endpoint (progress thread) ---------------------------------------------------

static void OnEpClosed(void* request, ucs_status_t, void* user) {
  auto* ep = static_cast<UcxEndpointState*>(user);
  if (request != nullptr) ucp_request_free(request);
  // Puts that could use the keys are finished or canceled by now.
  for (ucp_rkey_h k : ep->rkeys) ucp_rkey_destroy(k);
  ep->rkeys.clear();
  ep->ep = nullptr;
  MaybeSignalClosed(ep);
}

static void ForceClose(UcxEndpointState* ep) {
  if (ep->force_started) return;
  ep->force_started = true;
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  p.cb.send = &OnEpClosed;
  p.user_data = ep;
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep->ep, &p);
  if (r == nullptr) return OnEpClosed(nullptr, UCS_OK, ep);
  if (UCS_PTR_IS_ERR(r)) return OnEpClosed(nullptr, UCS_PTR_STATUS(r), ep);
}

static void OnCloseFlushed(void* request, ucs_status_t st, void* user);

static void FlushForClose(UcxEndpointState* ep) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &OnCloseFlushed;
  p.user_data = ep;
  ucs_status_ptr_t r = ucp_ep_flush_nbx(ep->ep, &p);
  if (r == nullptr) return OnCloseFlushed(nullptr, UCS_OK, ep);
  if (UCS_PTR_IS_ERR(r)) return OnCloseFlushed(nullptr, UCS_PTR_STATUS(r), ep);
}

static void OnCloseFlushed(void* request, ucs_status_t st, void* user) {
  auto* ep = static_cast<UcxEndpointState*>(user);
  if (request != nullptr) ucp_request_free(request);
  if (ep->force_started) return;
  // Notifications sent after an earlier flush, or same-host copies, may still be outstanding:
  // the watcher flushes again (never from here: a flush that completes at once would recurse)
  // until every write has finished, then closes; it forces the close at the deadline.
  if (st == UCS_OK && ep->inflight > 0 && !ep->failed.load() && !Expired(ep->flush_deadline)) {
    ep->reflush = true;
    return;
  }
  ForceClose(ep);
}

void BeginClose(const std::shared_ptr<UcxEndpointState>& ep) {
  ep->closing = true;
  // A reply endpoint's connection is the Admission's: nothing more goes over it from here on,
  // and the writes in flight on it finish by themselves.
  if (ep->borrowed) ep->ep = nullptr;
  if (ep->ep == nullptr) return MaybeSignalClosed(ep.get());  // never connected
  ep->flush_deadline = Clock::now() + kCloseFlushTimeout;
  UcxWorker* w = ep->worker;
  ++w->busy;
  // The watcher holds the UcxEndpointState until the close is over, and forces it at the deadline.
  w->watchers[ep.get()] = [ep, w] {
    if (!ep->force_started && (Expired(ep->flush_deadline) || ep->failed.load())) {
      ForceClose(ep.get());
    } else if (!ep->force_started && ep->reflush) {
      ep->reflush = false;
      FlushForClose(ep.get());
    }
    std::lock_guard<std::mutex> lock(ep->mu);
    if (ep->closed) --w->busy;
    return ep->closed;
  };
  if (ep->failed.load()) return ForceClose(ep.get());
  FlushForClose(ep.get());
}

// ---- the endpoint ----------------------------------------------------------------------------

UcxEndpoint::~UcxEndpoint() {
  std::shared_ptr<UcxEndpointState> ep = state_;
  worker_->Post([ep] { BeginClose(ep); });
  std::unique_lock<std::mutex> lock(ep->mu);
  if (!ep->closed_cv.wait_until(lock, Clock::now() + kCloseWaitTimeout,
                                [&] { return ep->closed; })) {
    // The watcher keeps the state alive; nothing dangles, but the close is late.
    KV_LOG_ERROR << "ucx: endpoint close did not finish within 10 s";
  }
}

Result<std::unique_ptr<WriteHandle>> UcxEndpoint::Write(const WriteRequest& request) {
  KV_RETURN_IF_ERROR(internal::CheckRequestShape(request, state_->regions.size()));
  const auto* local = dynamic_cast<const UcxRegistration*>(request.local);
  if (local == nullptr || local->state()->worker.get() != worker_.get()) {
    return InvalidArgument("local registration was not made by this UCX transport");
  }
  const bool cuda_source = local->region().kind == MemoryKind::kCuda;
  if (request.after_stream != nullptr && !cuda_source) {
    return NotSupported("ucx: after_stream is for CUDA sources; this write's is host memory");
  }
  const RemoteRegion& remote = state_->regions[request.remote_region];
  KV_ASSIGN_OR_RETURN(internal::WritePlan plan,
                      internal::PlanWrite(request.ops, local->region().length, remote.length));
  if (state_->failed.load()) return state_->Error();

  auto completion = std::make_shared<WriteCompletion>(plan.bytes, plan.runs.size());
  auto* op = new UcxWriteOp;
  op->completion = completion;
  op->ep = state_;
  op->reg = local->state();
  op->remote_base = remote.addr;
  op->remote_region = request.remote_region;  // its key: once connected (StartWrite)
  op->host_copy = state_->cma_pid != 0 && state_->host_copy[request.remote_region];
  if (const UcxEndpointState::PeerMap& m = state_->maps[request.remote_region]; m.ptr != nullptr) {
    op->mapped_dst = m.ptr + (remote.addr - m.base);
  }
  op->cuda_source = cuda_source;
  const size_t region = static_cast<size_t>(request.remote_region);
  op->am_data = cuda_source ||
                (region < state_->remote_cuda.size() && state_->remote_cuda[region]);
  if (op->am_data) op->host_copy = false;
#if KVSTREAM_UCX_HAVE_CUDA
  if (request.after_stream != nullptr) {
    cudaEvent_t ev = nullptr;
    cudaError_t e = cudaGetDevice(&op->dep_device);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == cudaSuccess) {
      e = cudaEventRecord(ev, static_cast<cudaStream_t>(request.after_stream));
      if (e != cudaSuccess) cudaEventDestroy(ev);
    }
    if (e != cudaSuccess) {
      delete op;
      return InvalidArgument(std::string("ucx Write: after_stream is not usable: ") +
                             cudaGetErrorString(e));
    }
    op->dep = ev;
  }
#else
  if (request.after_stream != nullptr) {
    delete op;
    return NotSupported("ucx: after_stream needs kvstream built with CUDA");
  }
#endif
  op->runs = std::move(plan.runs);
  op->notify = request.notify;
  if (request.notify) op->notify_header = EncodeNotification(request.notification);
  worker_->Post([op] { StartWrite(op); });
  return std::unique_ptr<WriteHandle>(new CompletionHandle(std::move(completion)));
}

}  // namespace kvstream::transport::ucx
