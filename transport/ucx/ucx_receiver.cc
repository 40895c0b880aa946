#include "transport/ucx/ucx_receiver.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "transport/ucx/ucx_wire.h"

#if KVSTREAM_UCX_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvstream::transport::ucx {

UcxRegionState::~UcxRegionState() {
  if (gated) worker->gate()->Remove(this);
  if (listed) worker->RemoveRegion(reinterpret_cast<uint64_t>(region.addr), this);
  if (memh != nullptr) {
    ucp_context_h ctx = worker->context();
    ucp_mem_h m = memh;
    Status s = worker->RunSync([ctx, m] {
      ucs_status_t st = ucp_mem_unmap(ctx, m);
      return st == UCS_OK ? OkStatus() : FromUcs(st, "ucp_mem_unmap");
    });
    if (!s.ok()) {
      KV_LOG_WARN << "ucx: deregistration failed: " << s.ToString();
    }
  }
  if (mapped_length != 0) munmap(region.addr, mapped_length);
  if (memfd >= 0) close(memfd);
}

Result<std::unique_ptr<Registration>> RegisterMemory(std::shared_ptr<UcxWorker> worker,
                                                      const MemoryRegion& region, bool allocate) {
  auto state = std::make_shared<UcxRegionState>();
  state->worker = worker;
  state->region = region;
  if (allocate && worker->cma_allowed()) {
    // Back it with a memfd that a writer on this host can map and copy into directly.
    int fd = memfd_create("kvstream-region", MFD_CLOEXEC);
    if (fd < 0) return Internal(std::string("ucx: memfd_create: ") + std::strerror(errno));
    state->memfd = fd;  // from here on ~UcxRegionState closes it
    struct stat st {};
    if (ftruncate(fd, static_cast<off_t>(region.length)) != 0 || fstat(fd, &st) != 0) {
      return ResourceExhausted("ucx: sizing a " + std::to_string(region.length) +
                               "-byte memfd: " + std::strerror(errno));
    }
    void* p = mmap(nullptr, region.length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return ResourceExhausted(std::string("ucx: mmap: ") + std::strerror(errno));
    state->region.addr = p;
    state->mapped_length = region.length;
    allocate = false;  // registered with UCX like caller memory
  }
  ucp_context_h ctx = worker->context();
  Status s = worker->RunSync([ctx, state, allocate]() -> Status {
#if KVSTREAM_UCX_HAVE_CUDA
    // UCX's CUDA transports work in the calling thread's current context: the progress thread
    // (which registers, sends and receives) takes the device of the CUDA memory it is given.
    if (state->region.kind == MemoryKind::kCuda && state->region.device >= 0) {
      if (cudaError_t e = cudaSetDevice(state->region.device); e != cudaSuccess) {
        return Internal(std::string("ucx: cudaSetDevice on the progress thread: ") +
                        cudaGetErrorString(e));
      }
    }
#endif
    ucp_mem_map_params_t p{};
    p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    p.address = state->region.addr;
    p.length = state->region.length;
    if (allocate) {
      p.field_mask |= UCP_MEM_MAP_PARAM_FIELD_FLAGS;
      p.flags = UCP_MEM_MAP_ALLOCATE;
    } else {
      p.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
      p.memory_type = state->region.kind == MemoryKind::kCuda ? UCS_MEMORY_TYPE_CUDA
                                                               : UCS_MEMORY_TYPE_HOST;
    }
    ucp_mem_h memh = nullptr;
    ucs_status_t st = ucp_mem_map(ctx, &p, &memh);
    if (st != UCS_OK) return FromUcs(st, "ucx: ucp_mem_map");
    state->memh = memh;  // from here on ~UcxRegionState unmaps
    if (allocate) {
      ucp_mem_attr_t attr{};
      attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
      st = ucp_mem_query(memh, &attr);
      if (st != UCS_OK) return FromUcs(st, "ucx: ucp_mem_query");
      state->region.addr = attr.address;
      state->region.length = std::min(attr.length, state->region.length);
    }
    void* packed = nullptr;
    size_t packed_len = 0;
    st = ucp_rkey_pack(ctx, memh, &packed, &packed_len);
    if (st != UCS_OK) return FromUcs(st, "ucx: ucp_rkey_pack");
    state->key = EncodeKey(packed, packed_len, state->region.kind == MemoryKind::kCuda);
    ucp_rkey_buffer_release(packed);
    return OkStatus();
  });
  KV_RETURN_IF_ERROR(s);
  worker->AddRegion(reinterpret_cast<uint64_t>(state->region.addr), state->region.length, state);
  state->listed = true;
  // Host memory is what a same-host writer may copy into (a memfd: by mapping it).
  if (worker->gate() != nullptr && state->region.kind == MemoryKind::kHost) {
    worker->gate()->Add(state.get(), reinterpret_cast<uint64_t>(state->region.addr),
                        state->region.length, state->memfd);
    state->gated = true;
  }
  return std::unique_ptr<Registration>(new UcxRegistration(std::move(state)));
}

namespace {

// Hands the held notifications whose data messages have all landed to the sink, in order.
void DeliverLanded(UcxWorker* worker) {
  UcxWorker::Landing& l = worker->landing;
  while (!l.held.empty() &&
         (l.receiving.empty() || *l.receiving.begin() >= l.held.front().first)) {
    Notification n = std::move(l.held.front().second);
    l.held.pop_front();
    if (std::shared_ptr<const NotificationSink> sink = worker->sink()) (*sink)(n);
  }
}

struct DataLanding {
  UcxWorker* worker = nullptr;
  std::shared_ptr<UcxRegionState> region;  // kept registered until the bytes are in
  uint64_t id = 0;
  uint64_t addr = 0;
};

void OnDataLanded(void* request, ucs_status_t status, size_t, void* user) {
  auto* d = static_cast<DataLanding*>(user);
  if (request != nullptr) ucp_request_free(request);
  if (status != UCS_OK) {
    // The writer's send fails too (or its peer is lost): it sends no notification for it.
    KV_LOG_WARN << "ucx: a data message did not land: " << ucs_status_string(status);
  }
  UcxWorker* w = d->worker;
  w->landing.receiving.erase(d->id);
  --w->busy;
  delete d;
  DeliverLanded(w);
}

}  // namespace

ucs_status_t OnDataMessage(void* arg, const void* header, size_t header_length, void* data,
                           size_t length, const ucp_am_recv_param_t* param) {
  auto* worker = static_cast<UcxWorker*>(arg);
  auto h = DecodeDataHeader(std::string_view(static_cast<const char*>(header), header_length));
  // Returning UCS_OK without receiving drops the message (UCX releases it and completes the
  // sender's request): nothing lands.
  if (!h.ok()) {
    KV_LOG_WARN << "ucx: dropped a data message: " << h.status().ToString();
    return UCS_OK;
  }
  if ((param->recv_attr & (UCP_AM_RECV_ATTR_FLAG_RNDV | UCP_AM_RECV_ATTR_FLAG_DATA)) == 0 ||
      h->length != length) {
    KV_LOG_WARN << "ucx: dropped a data message: its header announces " << h->length
                << " bytes, it carries " << length;
    return UCS_OK;
  }
  std::shared_ptr<UcxRegionState> region = worker->FindRegion(h->addr, h->length);
  if (region == nullptr) {
    KV_LOG_WARN << "ucx: dropped a data message of " << h->length
                << " bytes: it names memory this process did not register";
    return UCS_OK;
  }
  auto* d = new DataLanding{worker, region, worker->landing.next_id++, h->addr};
  worker->landing.receiving.insert(d->id);
  ++worker->busy;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                   UCP_OP_ATTR_FIELD_MEMORY_TYPE | UCP_OP_ATTR_FIELD_MEMH;
  p.cb.recv_am = &OnDataLanded;
  p.user_data = d;
  p.memory_type = region->region.kind == MemoryKind::kCuda ? UCS_MEMORY_TYPE_CUDA
                                                            : UCS_MEMORY_TYPE_HOST;
  p.memh = region->memh;
  ucs_status_ptr_t r = ucp_am_recv_data_nbx(worker->worker(), data,
                                            reinterpret_cast<void*>(h->addr), h->length, &p);
  if (r == nullptr) {
    OnDataLanded(nullptr, UCS_OK, h->length, d);
    return UCS_OK;
  }
  if (UCS_PTR_IS_ERR(r)) {
    OnDataLanded(nullptr, UCS_PTR_STATUS(r), 0, d);
    return UCS_OK;
  }
  return UCS_INPROGRESS;
}

ucs_status_t OnNotificationMessage(void* arg, const void* header, size_t header_length, void*,
                                   size_t, const ucp_am_recv_param_t*) {
  auto* worker = static_cast<UcxWorker*>(arg);
  auto n = DecodeNotification(std::string_view(static_cast<const char*>(header), header_length));
  if (!n.ok()) {
    KV_LOG_WARN << "ucx: dropped a notification: " << n.status().ToString();
    return UCS_OK;
  }
  // After the data messages that came before it (the writer sends it once they completed).
  worker->landing.held.emplace_back(worker->landing.next_id, std::move(n).value());
  DeliverLanded(worker);
  return UCS_OK;
}

}  // namespace kvstream::transport::ucx
