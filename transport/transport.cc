#include "transport/transport.h"

#include "transport/pacing.h"
#include "transport/testing/fake_transport.h"
#ifdef KVSTREAM_TRANSPORT_HAVE_UCX
#include "transport/ucx/ucx_transport.h"
#endif
#ifdef KVSTREAM_TRANSPORT_HAVE_CUDA_IPC
#include "transport/cuda_ipc/cuda_ipc_transport.h"
#endif
#ifdef KVSTREAM_TRANSPORT_HAVE_UCX_STAGED
#include "transport/staged/staged_transport.h"
#endif
#ifdef KVSTREAM_TRANSPORT_HAVE_NCCL
#include "transport/nccl/nccl_transport.h"
#endif

namespace kvstream::transport {
namespace {

using Factory = Result<std::unique_ptr<Transport>> (*)(const TransportOptions&);
struct Backend {
  const char* name;
  Factory create;
};

// One line per backend built into this library.
constexpr Backend kBackends[] = {
#ifdef KVSTREAM_TRANSPORT_HAVE_UCX
    {"ucx", &ucx::CreateUcxTransport},
#endif
#ifdef KVSTREAM_TRANSPORT_HAVE_CUDA_IPC
    {"cuda_ipc", &cuda_ipc::CreateCudaIpcTransport},
#endif
#ifdef KVSTREAM_TRANSPORT_HAVE_UCX_STAGED
    {"ucx_staged", &staged::CreateStagedTransport},
#endif
#ifdef KVSTREAM_TRANSPORT_HAVE_NCCL
    {"nccl", &nccl::CreateNcclTransport},
#endif
    {"fake", &testing::CreateFakeTransport},
};

}  // namespace

Result<std::unique_ptr<Transport>> CreateTransport(const TransportOptions& options) {
  auto pacing = ResolvePacing(options);
  if (!pacing.ok()) return pacing.status().WithContext("transport pacing options");
  for (const Backend& b : kBackends) {
    if (options.backend == b.name) {
      auto t = b.create(options);
      if (!t.ok()) return t.status().WithContext("creating the " + options.backend + " transport");
      return PaceTransport(std::move(t).value(), *pacing);
    }
  }
  std::string known;
  for (const Backend& b : kBackends) known += (known.empty() ? "" : ", ") + std::string(b.name);
  return NotSupported("transport backend '" + options.backend + "' is not built in (built: " +
                      known + ")");
}

Result<std::string> ResolveBackend(const TransportOptions& options, MemoryKind memory) {
  if (memory != MemoryKind::kCuda || options.backend != "ucx") return options.backend;
  TransportOptions probe;
  probe.backend = "ucx";
  probe.ucx = options.ucx;
  probe.device = options.device;
  auto ucx = CreateTransport(probe);
  if (!ucx.ok()) return ucx.status();
  if ((*ucx)->capabilities().cuda_memory) return std::string("ucx");
  for (const Backend& b : kBackends) {
    if (std::string(b.name) == "ucx_staged") return std::string("ucx_staged");
  }
  return NotSupported("transport ucx with CUDA memory needs UCX with CUDA support or the "
                      "ucx_staged backend; neither is built in");
}

std::vector<std::string> AvailableBackends() {
  std::vector<std::string> out;
  for (const Backend& b : kBackends) out.emplace_back(b.name);
  return out;
}

}  // namespace kvstream::transport
