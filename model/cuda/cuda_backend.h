// The CUDA backend of the model: the same decoder as the CPU reference (model/cpu_backend.h),
// on one GPU.
//
// What it does:
//  - Weights live in device memory in the config's weight_dtype. Dummy weights are generated
//    on the GPU from common/dummy_init.h (bit-identical to the CPU backend's, no host copy);
//    checkpoint tensors are read through model/weights.h (converted to weight_dtype exactly as
//    the CPU backend reads them) and uploaded once.
//  - The residual stream and every GEMM output are fp32; GEMM inputs are weight_dtype (cuBLAS,
//    fp32 accumulation); the KV pool holds kv_dtype.
//  - Forward() follows model/backend.h, with the CPU backend's hook order. Per layer: RMSNorm,
//    fused QKV GEMM, QKV bias and rotary (model/rope.h's factors), hooks->BeforeAttention(l,
//    stream) (before the new K/V are written, so blocks landing from a peer cannot overwrite
//    them), the new tokens' K/V are written into the pool, hooks->AfterLayer(l, stream) (this
//    layer's KV of every sequence is complete once the stream reaches this point), attention
//    reads the pool (kernels::PagedDecodeAttention when every sequence has one new token,
//    kernels::PrefillAttention otherwise), o_proj (+ residual), RMSNorm, fused gate/up GEMM,
//    SwiGLU, down_proj (+ residual).
//    `stream` is the backend's cudaStream_t (one high-priority compute stream per backend);
//    work enqueued before a hook call is ordered before anything the hook enqueues on it.
//  - Forward() returns once the outputs are on the host (it synchronises its stream); on an
//    error it also waits for the work it enqueued before returning.
//  - Buffers are kept between calls and grown when a batch needs more (never per token).
//  - Forward() may be called from several threads; the calls run one at a time (they share
//    the work buffers and the stream), so a hook must not wait for another Forward() of the
//    same backend.
#pragma once

#include <memory>

#include "common/status.h"
#include "model/backend.h"
#include "model/kv_cache.h"

namespace kvstream::model {

// kUnavailable when no usable GPU is present (or options.device is out of range);
// kResourceExhausted when the weights do not fit; errors of OpenWeights(spec) as they are.
Result<std::unique_ptr<ModelBackend>> CreateCudaBackend(const ModelSpec& spec,
                                                        const BackendOptions& options);

// `bytes` of zero-filled device memory on `device`, freed by the destructor: shareable as a
// descriptor (common/cuda_vmm.h) where the driver allows, else cudaMalloc'd (logged).
Result<std::unique_ptr<PoolMemory>> AllocateDevicePoolMemory(size_t bytes, int device);

}  // namespace kvstream::model
