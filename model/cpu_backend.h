// The CPU reference backend: the oracle every other backend is tested against.
//
// Numerics (exact and simple):
//  - Weights are held in config.weight_dtype (the values WeightSource::Read gives) and widened
//    to fp32 row by row; every activation and accumulation is fp32.
//  - Each output element is one dot product with a fixed summation order (8 interleaved
//    partial sums, then a fixed tree, then the tail), so results do not depend on the thread
//    count or on which other sequences share the batch.
//  - K and V are rounded to config.kv_dtype when written to the pool, and attention reads
//    every position (the new ones included) back from the pool. Computing a prompt in one
//    Forward or in several (e.g. n-1 tokens, then 1) gives bit-identical KV and logits.
//  - RoPE from model/rope.h; attention scale 1/sqrt(head_dim); softmax with max subtraction
//    and a sequential sum; argmax takes the lowest index on ties.
//
// Hooks (per layer l, in this order): Q/K/V projections and RoPE run; BeforeAttention(l) is
// called BEFORE the new K/V are written, so blocks landing from a peer (which may cover the
// slots of the new tokens) cannot overwrite them; the new K/V are written; AfterLayer(l) is
// called (this layer's KV of every sequence is complete in the pool); attention, o_proj and
// the MLP run. stream is nullptr.
//
// Thread-safety: Forward may be called concurrently (e.g. by two daemons' request threads);
// calls share the worker threads, weights are read-only. Pools must be host pools.
#pragma once

#include <memory>

#include "model/backend.h"
#include "model/weights.h"

namespace kvstream::model {

// Loads every tensor from `weights` (converted to config.weight_dtype).
Result<std::unique_ptr<ModelBackend>> CreateCpuBackend(const WeightSource& weights,
                                                       int num_threads);
// OpenWeights(spec) then the above.
Result<std::unique_ptr<ModelBackend>> CreateCpuBackend(const ModelSpec& spec,
                                                       const BackendOptions& options);

// The dot product the backend uses for every output element (exposed for tests).
float ReferenceDot(const float* a, const float* b, int n);
// out[r] = ReferenceDot(a, b[r], n) for r < 4, bit for bit (computed interleaved).
void ReferenceDot4(const float* a, const float* const b[4], int n, float out[4]);

}  // namespace kvstream::model
