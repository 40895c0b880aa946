#include "transport/cuda/cuda_util.h"

#include <dlfcn.h>

#include <chrono>
#include <thread>

#include "common/log.h"
#include "kernels/scatter_copy.h"

namespace kvstream::transport::cuda {

Status CudaStatus(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return OkStatus();
  std::string m(what);
  m += ": ";
  m += cudaGetErrorName(err);
  m += ": ";
  m += cudaGetErrorString(err);
  return Internal(std::move(m));
}

Result<int> UsableDeviceCount() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return Unavailable(std::string("no usable CUDA device: cudaGetDeviceCount: ") +
                       cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
  }
  if (count <= 0) return Unavailable("no usable CUDA device: cudaGetDeviceCount returned 0");
  return count;
}

Result<int> ResolveDevice(int requested, std::string_view backend) {
  KV_ASSIGN_OR_RETURN(int count, UsableDeviceCount());
  int device = requested;
  if (device < 0) {
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return CudaStatus(err, "cudaGetDevice");
  }
  if (device >= count) {
    return InvalidArgument(std::string(backend) + ": device " + std::to_string(device) +
                           " does not exist (" + std::to_string(count) + " visible)");
  }
  return device;
}

Status PrepareDevice(int device) {
  DeviceGuard guard(device);
  KV_RETURN_IF_ERROR(guard.status());
  KV_CUDA_RETURN_IF_ERROR(cudaFree(nullptr), "initialising the CUDA context");
  // A lazily loaded kernel's first launch waits for whatever the process is computing at that
  // moment (kernels/scatter_copy.h).
  return kernels::PreloadScatterKernels();
}

DeviceGuard::DeviceGuard(int device) {
  cudaError_t err = cudaGetDevice(&previous_);
  if (err != cudaSuccess) {
    status_ = CudaStatus(err, "cudaGetDevice");
    return;
  }
  if (previous_ == device) return;
  err = cudaSetDevice(device);
  if (err != cudaSuccess) {
    status_ = CudaStatus(err, "cudaSetDevice(" + std::to_string(device) + ")");
    return;
  }
  restore_ = true;
}

DeviceGuard::~DeviceGuard() {
  if (restore_) (void)cudaSetDevice(previous_);
}

EventPool::~EventPool() {
  DeviceGuard guard(device_);
  for (cudaEvent_t e : all_) (void)cudaEventDestroy(e);
}

Result<cudaEvent_t> EventPool::Acquire() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_.empty()) {
      cudaEvent_t e = free_.back();
      free_.pop_back();
      return e;
    }
  }
  DeviceGuard guard(device_);
  KV_RETURN_IF_ERROR(guard.status());
  cudaEvent_t e = nullptr;
  KV_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                          "cudaEventCreateWithFlags");
  std::lock_guard<std::mutex> lock(mu_);
  all_.push_back(e);
  return e;
}

void EventPool::Release(cudaEvent_t event) {
  if (event == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(event);
}

size_t EventPool::created() const {
  std::lock_guard<std::mutex> lock(mu_);
  return all_.size();
}

Result<std::unique_ptr<Stream>> Stream::CreateLowestPriority(int device) {
  DeviceGuard guard(device);
  KV_RETURN_IF_ERROR(guard.status());
  int least = 0, greatest = 0;
  KV_CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least, &greatest),
                          "cudaDeviceGetStreamPriorityRange");
  std::unique_ptr<Stream> s(new Stream());
  // "least" is the numerically largest value: the lowest scheduling priority.
  KV_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&s->stream_, cudaStreamNonBlocking, least),
                          "cudaStreamCreateWithPriority");
  s->device_ = device;
  s->priority_ = least;
  return s;
}

Stream::~Stream() {
  if (stream_ == nullptr) return;
  DeviceGuard guard(device_);
  (void)cudaStreamDestroy(stream_);
}

namespace {
// Busy-polls briefly (copies of a layer take microseconds), then backs off to short sleeps.
template <typename Query>
Status PollUntil(Query query, Deadline deadline, const char* what) {
  auto start = Clock::now();
  for (;;) {
    cudaError_t err = query();
    if (err == cudaSuccess) return OkStatus();
    if (err != cudaErrorNotReady) return CudaStatus(err, what);
    if (Expired(deadline)) return Timeout(std::string(what) + ": deadline passed");
    if (Clock::now() - start < std::chrono::microseconds(200)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}
}  // namespace

Status WaitStreamIdle(cudaStream_t stream, Deadline deadline) {
  return PollUntil([&] { return cudaStreamQuery(stream); }, deadline, "cudaStreamQuery");
}

Status WaitEvent(cudaEvent_t event, Deadline deadline) {
  return PollUntil([&] { return cudaEventQuery(event); }, deadline, "cudaEventQuery");
}

Result<std::unique_ptr<PinnedBuffer>> PinnedBuffer::Allocate(size_t bytes) {
  if (bytes == 0) return InvalidArgument("PinnedBuffer: zero bytes");
  std::unique_ptr<PinnedBuffer> b(new PinnedBuffer());
  KV_CUDA_RETURN_IF_ERROR(
      cudaHostAlloc(&b->data_, bytes, cudaHostAllocPortable | cudaHostAllocMapped),
      "cudaHostAlloc(" + std::to_string(bytes) + " bytes)");
  b->size_ = bytes;
  return b;
}

PinnedBuffer::~PinnedBuffer() {
  if (data_ != nullptr) (void)cudaFreeHost(data_);
}

Result<std::unique_ptr<DeviceBuffer>> DeviceBuffer::Allocate(int device, size_t bytes) {
  if (bytes == 0) return InvalidArgument("DeviceBuffer: zero bytes");
  DeviceGuard guard(device);
  KV_RETURN_IF_ERROR(guard.status());
  std::unique_ptr<DeviceBuffer> b(new DeviceBuffer());
  KV_CUDA_RETURN_IF_ERROR(cudaMalloc(&b->data_, bytes),
                          "cudaMalloc(" + std::to_string(bytes) + " bytes)");
  b->size_ = bytes;
  b->device_ = device;
  return b;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ == nullptr) return;
  DeviceGuard guard(device_);
  (void)cudaFree(data_);
}

namespace {
// cuMemGetAddressRange from the driver, looked up at run time so that binaries start (and
// GPU tests can skip) on machines without libcuda.so.
using GetAddressRangeFn = int (*)(unsigned long long* base, size_t* size, unsigned long long ptr);

GetAddressRangeFn LoadGetAddressRange() {
  static GetAddressRangeFn fn = [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib == nullptr) return GetAddressRangeFn(nullptr);
    void* sym = dlsym(lib, "cuMemGetAddressRange_v2");
    if (sym == nullptr) sym = dlsym(lib, "cuMemGetAddressRange");
    return reinterpret_cast<GetAddressRangeFn>(sym);
  }();
  return fn;
}
}  // namespace

Result<DevicePointerInfo> QueryDevicePointer(const void* ptr, size_t length) {
  if (ptr == nullptr || length == 0) return InvalidArgument("null pointer or zero length");
  cudaPointerAttributes attr{};
  cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return InvalidArgument(std::string("not CUDA memory: cudaPointerGetAttributes: ") +
                           cudaGetErrorName(err));
  }
  if (attr.type != cudaMemoryTypeDevice) {
    return InvalidArgument("not CUDA device memory (cudaPointerGetAttributes type " +
                           std::to_string(static_cast<int>(attr.type)) + ")");
  }
  DevicePointerInfo info;
  info.device = attr.device;
  GetAddressRangeFn fn = LoadGetAddressRange();
  if (fn == nullptr) return Internal("cuMemGetAddressRange not found in libcuda.so.1");
  // The driver call needs the device's primary context current on this thread: cudaSetDevice
  // makes it so (even when the device is already the current one).
  int previous = -1;
  KV_CUDA_RETURN_IF_ERROR(cudaGetDevice(&previous), "cudaGetDevice");
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(attr.device), "cudaSetDevice");
  struct Restore {
    int d;
    ~Restore() { (void)cudaSetDevice(d); }
  } restore{previous};
  unsigned long long base = 0;
  size_t size = 0;
  int rc = fn(&base, &size, reinterpret_cast<unsigned long long>(ptr));
  if (rc != 0) return InvalidArgument("cuMemGetAddressRange failed (CUresult " + std::to_string(rc) + ")");
  uint64_t p = reinterpret_cast<uint64_t>(ptr);
  if (p + length > base + size || p + length < p) {
    return InvalidArgument("range of " + std::to_string(length) +
                           " bytes runs past the end of its CUDA allocation (" +
                           std::to_string(base + size - p) + " bytes left)");
  }
  info.alloc_base = base;
  info.alloc_size = size;
  return info;
}

Result<std::string> PciBusId(int device) {
  char buf[32] = {};
  KV_CUDA_RETURN_IF_ERROR(cudaDeviceGetPCIBusId(buf, sizeof(buf), device), "cudaDeviceGetPCIBusId");
  return std::string(buf);
}

}  // namespace kvstream::transport::cuda
