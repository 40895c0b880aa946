// CreateBackend: the one place that knows every backend (one line each).
#include "model/backend.h"
#include "model/cpu_backend.h"

#if defined(KVSTREAM_HAVE_CUDA_BACKEND)
#include "model/cuda/cuda_backend.h"
#endif

namespace kvstream::model {

Result<std::unique_ptr<ModelBackend>> CreateBackend(const ModelSpec& spec,
                                                    const BackendOptions& options) {
  if (options.kind == "cpu") return CreateCpuBackend(spec, options);
  if (options.kind == "cuda") {
#if defined(KVSTREAM_HAVE_CUDA_BACKEND)
    return CreateCudaBackend(spec, options);
#else
    return NotSupported("backend 'cuda' is not available: built without CUDA");
#endif
  }
  return InvalidArgument("unknown backend '" + options.kind + "' (cpu, cuda)");
}

}  // namespace kvstream::model
