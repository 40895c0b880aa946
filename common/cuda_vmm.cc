#include "common/cuda_vmm.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>

namespace kvstream::cuda_vmm {
namespace {

// The driver entry points, found once (nullptr members: that one is missing).
struct Driver {
  decltype(&::cuGetErrorName) error_name = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetAttribute) device_attribute = nullptr;
  decltype(&::cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&::cuMemCreate) create = nullptr;
  decltype(&::cuMemRelease) release = nullptr;
  decltype(&::cuMemAddressReserve) reserve = nullptr;
  decltype(&::cuMemAddressFree) address_free = nullptr;
  decltype(&::cuMemMap) map = nullptr;
  decltype(&::cuMemUnmap) unmap = nullptr;
  decltype(&::cuMemSetAccess) set_access = nullptr;
  decltype(&::cuMemExportToShareableHandle) export_handle = nullptr;
  decltype(&::cuMemImportFromShareableHandle) import_handle = nullptr;
  decltype(&::cuMemRetainAllocationHandle) retain = nullptr;
  decltype(&::cuMemGetAllocationPropertiesFromHandle) properties = nullptr;
  decltype(&::cuMemGetAddressRange) address_range = nullptr;  // cuMemGetAddressRange_v2
  std::string missing;  // the first symbol not found, if any
};

const Driver& Drv() {
  static const Driver d = [] {
    Driver r;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib == nullptr) {
      r.missing = "libcuda.so.1";
      return r;
    }
    auto find = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (fn == nullptr && r.missing.empty()) r.missing = name;
    };
    find(r.error_name, "cuGetErrorName");
    find(r.device_get, "cuDeviceGet");
    find(r.device_attribute, "cuDeviceGetAttribute");
    find(r.granularity, "cuMemGetAllocationGranularity");
    find(r.create, "cuMemCreate");
    find(r.release, "cuMemRelease");
    find(r.reserve, "cuMemAddressReserve");
    find(r.address_free, "cuMemAddressFree");
    find(r.map, "cuMemMap");
    find(r.unmap, "cuMemUnmap");
    find(r.set_access, "cuMemSetAccess");
    find(r.export_handle, "cuMemExportToShareableHandle");
    find(r.import_handle, "cuMemImportFromShareableHandle");
    find(r.retain, "cuMemRetainAllocationHandle");
    find(r.properties, "cuMemGetAllocationPropertiesFromHandle");
    find(r.address_range, "cuMemGetAddressRange_v2");
    return r;
  }();
  return d;
}

Status Loaded() {
  const Driver& d = Drv();
  if (!d.missing.empty()) {
    return Unavailable("cuda_vmm: the CUDA driver lacks " + d.missing +
                       " (virtual memory management needs a CUDA 10.2+ driver)");
  }
  return OkStatus();
}

Status Cu(CUresult rc, const char* what) {
  if (rc == CUDA_SUCCESS) return OkStatus();
  const char* name = nullptr;
  if (Drv().error_name != nullptr) (void)Drv().error_name(rc, &name);
  return Internal(std::string("cuda_vmm: ") + what + ": " + (name != nullptr ? name : "CUresult ") +
                  (name != nullptr ? "" : std::to_string(static_cast<int>(rc))));
}

// Makes `device` current (its primary context too: the driver calls need one) and restores the
// previous device when it goes.
class OnDevice {
 public:
  explicit OnDevice(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaFree(nullptr);  // creates the primary context if needed
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      status_ = Unavailable(std::string("cuda_vmm: device ") + std::to_string(device) + ": " +
                            cudaGetErrorName(e));
    }
  }
  ~OnDevice() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  const Status& status() const { return status_; }

 private:
  int previous_ = -1;
  Status status_;
};

CUmemAllocationProp PropFor(int device) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = device;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return p;
}

Result<size_t> Granularity(int device) {
  CUmemAllocationProp p = PropFor(device);
  size_t g = 0;
  KV_RETURN_IF_ERROR(Cu(Drv().granularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                        "cuMemGetAllocationGranularity"));
  if (g == 0) return Internal("cuda_vmm: allocation granularity 0");
  return g;
}

// Reserves `size` bytes of address space, maps `handle` there and grants `device` read/write.
// Releases nothing of `handle`; unwinds its own steps on failure.
Result<CUdeviceptr> MapHandle(CUmemGenericAllocationHandle handle, size_t size, size_t align,
                              int device) {
  const Driver& d = Drv();
  CUdeviceptr va = 0;
  KV_RETURN_IF_ERROR(Cu(d.reserve(&va, size, align, 0, 0), "cuMemAddressReserve"));
  Status s = Cu(d.map(va, size, 0, handle, 0), "cuMemMap");
  if (!s.ok()) {
    (void)d.address_free(va, size);
    return s;
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  s = Cu(d.set_access(va, size, &access, 1), "cuMemSetAccess");
  if (!s.ok()) {
    (void)d.unmap(va, size);
    (void)d.address_free(va, size);
    return s;
  }
  return va;
}

void Unmap(uint64_t va, uint64_t size) {
  if (va == 0) return;
  (void)Drv().unmap(va, size);
  (void)Drv().address_free(va, size);
}

// This process's ShareableDeviceMemory, by base address (its size).
std::mutex& RegistryMu() {
  static std::mutex mu;
  return mu;
}
std::map<uint64_t, uint64_t>& Registry() {
  static auto* r = new std::map<uint64_t, uint64_t>();
  return *r;
}

}  // namespace

Status Supported(int device) {
  KV_RETURN_IF_ERROR(Loaded());
  const Driver& d = Drv();
  OnDevice on(device);
  KV_RETURN_IF_ERROR(on.status());
  CUdevice dev = 0;
  KV_RETURN_IF_ERROR(Cu(d.device_get(&dev, device), "cuDeviceGet"));
  int vmm = 0, posix = 0;
  KV_RETURN_IF_ERROR(Cu(d.device_attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev),
                        "cuDeviceGetAttribute"));
  KV_RETURN_IF_ERROR(Cu(d.device_attribute(&posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev),
                        "cuDeviceGetAttribute"));
  if (vmm == 0) return Unavailable("cuda_vmm: device " + std::to_string(device) + " has no virtual memory management");
  if (posix == 0) {
    return Unavailable("cuda_vmm: device " + std::to_string(device) +
                       " cannot export memory as a POSIX file descriptor");
  }
  return OkStatus();
}

Result<std::unique_ptr<ShareableDeviceMemory>> ShareableDeviceMemory::Allocate(int device,
                                                                               size_t bytes) {
  if (bytes == 0) return InvalidArgument("cuda_vmm: an allocation of 0 bytes");
  KV_RETURN_IF_ERROR(Supported(device));
  const Driver& d = Drv();
  OnDevice on(device);
  KV_RETURN_IF_ERROR(on.status());
  KV_ASSIGN_OR_RETURN(size_t gran, Granularity(device));
  if (bytes > SIZE_MAX - gran) return InvalidArgument("cuda_vmm: allocation size overflows");
  const size_t size = (bytes + gran - 1) / gran * gran;
  CUmemAllocationProp prop = PropFor(device);
  CUmemGenericAllocationHandle handle = 0;
  CUresult rc = d.create(&handle, size, &prop, 0);
  if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
    return ResourceExhausted("cuda_vmm: cuMemCreate of " + std::to_string(size) +
                             " bytes on device " + std::to_string(device) + ": out of memory");
  }
  KV_RETURN_IF_ERROR(Cu(rc, "cuMemCreate"));
  auto va = MapHandle(handle, size, gran, device);
  (void)d.release(handle);  // the mapping keeps the memory
  if (!va.ok()) return va.status();
  std::unique_ptr<ShareableDeviceMemory> m(new ShareableDeviceMemory());
  m->base_ = va.value();
  m->size_ = size;
  m->device_ = device;
  std::lock_guard<std::mutex> lock(RegistryMu());
  Registry()[m->base_] = size;
  return m;
}

ShareableDeviceMemory::~ShareableDeviceMemory() {
  {
    std::lock_guard<std::mutex> lock(RegistryMu());
    Registry().erase(base_);
  }
  OnDevice on(device_);
  // Work still queued on it must not run into an unmapped range.
  (void)cudaDeviceSynchronize();
  Unmap(base_, size_);
}

Result<ExportedAllocation> ExportShareable(const void* ptr) {
  KV_RETURN_IF_ERROR(Loaded());
  const Driver& d = Drv();
  const uint64_t p = reinterpret_cast<uint64_t>(ptr);
  ExportedAllocation out;
  {
    std::lock_guard<std::mutex> lock(RegistryMu());
    auto it = Registry().upper_bound(p);
    if (it != Registry().begin() && p < std::prev(it)->first + std::prev(it)->second) {
      out.base = std::prev(it)->first;
      out.size = std::prev(it)->second;
    }
  }
  const std::string where = "memory at 0x" + [&] {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%llx", static_cast<unsigned long long>(p));
    return std::string(buf);
  }();
  const std::string not_ours =
      " is not a cuMemCreate allocation with POSIX descriptor handles (cudaMalloc'd memory "
      "cannot be shared as a descriptor; allocate it with cuda_vmm::ShareableDeviceMemory)";
  if (out.size == 0) {
    CUdeviceptr base = 0;
    size_t size = 0;
    if (d.address_range(&base, &size, p) != CUDA_SUCCESS) {
      return FailedPrecondition("cuda_vmm: " + where + " is not device memory of this process");
    }
    out.base = base;
    out.size = size;
  }
  CUmemGenericAllocationHandle handle = 0;
  if (d.retain(&handle, reinterpret_cast<void*>(out.base)) != CUDA_SUCCESS) {
    return FailedPrecondition("cuda_vmm: " + where + not_ours);
  }
  CUmemAllocationProp prop{};
  Status s = Cu(d.properties(&prop, handle), "cuMemGetAllocationPropertiesFromHandle");
  if (s.ok() && (prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
    s = FailedPrecondition("cuda_vmm: " + where + not_ours);
  }
  int fd = -1;
  if (s.ok()) {
    s = Cu(d.export_handle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
           "cuMemExportToShareableHandle");
  }
  (void)d.release(handle);  // the retain's reference
  if (!s.ok()) return s;
  (void)::fcntl(fd, F_SETFD, FD_CLOEXEC);
  out.fd = fd;
  out.device = prop.location.id;
  return out;
}

Result<std::unique_ptr<ImportedMapping>> ImportedMapping::Import(int fd, uint64_t size, int device) {
  KV_RETURN_IF_ERROR(Loaded());
  if (fd < 0 || size == 0) return InvalidArgument("cuda_vmm: import of no descriptor or 0 bytes");
  const Driver& d = Drv();
  OnDevice on(device);
  KV_RETURN_IF_ERROR(on.status());
  KV_ASSIGN_OR_RETURN(size_t gran, Granularity(device));
  if (size % gran != 0) {
    return InvalidArgument("cuda_vmm: imported size " + std::to_string(size) +
                           " is not a multiple of the granularity " + std::to_string(gran));
  }
  CUmemGenericAllocationHandle handle = 0;
  KV_RETURN_IF_ERROR(Cu(d.import_handle(&handle, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                        "cuMemImportFromShareableHandle"));
  auto va = MapHandle(handle, size, gran, device);
  (void)d.release(handle);  // the mapping keeps it
  if (!va.ok()) return va.status();
  std::unique_ptr<ImportedMapping> m(new ImportedMapping());
  m->base_ = va.value();
  m->size_ = size;
  m->device_ = device;
  return m;
}

ImportedMapping::~ImportedMapping() {
  OnDevice on(device_);
  Unmap(base_, size_);
}

}  // namespace kvstream::cuda_vmm
