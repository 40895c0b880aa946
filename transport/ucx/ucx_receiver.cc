#include "transport/ucx/ucx_receiver.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "transport/ucx/ucx_wire.h"

namespace kvstream::transport::ucx {

UcxRegionState::~UcxRegionState() {
  if (gated) worker->gate()->Remove(this);
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
    state->key = EncodeKey(packed, packed_len);
    ucp_rkey_buffer_release(packed);
    return OkStatus();
  });
  KV_RETURN_IF_ERROR(s);
  // Host memory is what a same-host writer may copy into (a memfd: by mapping it).
  if (worker->gate() != nullptr && state->region.kind == MemoryKind::kHost) {
    worker->gate()->Add(state.get(), reinterpret_cast<uint64_t>(state->region.addr),
                        state->region.length, state->memfd);
    state->gated = true;
  }
  return std::unique_ptr<Registration>(new UcxRegistration(std::move(state)));
}

ucs_status_t OnNotificationMessage(void* arg, const void* header, size_t header_length, void*,
                                   size_t, const ucp_am_recv_param_t*) {
  auto* worker = static_cast<UcxWorker*>(arg);
  auto n = DecodeNotification(std::string_view(static_cast<const char*>(header), header_length));
  if (!n.ok()) {
    KV_LOG_WARN << "ucx: dropped a notification: " << n.status().ToString();
    return UCS_OK;
  }
  if (std::shared_ptr<const NotificationSink> sink = worker->sink()) (*sink)(*n);
  return UCS_OK;
}

}  // namespace kvstream::transport::ucx
