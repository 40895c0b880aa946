// What the step benchmarks (decode_step, sampling_step) share: the CUDA backend for a model and
// one KV pool whose block ids are handed out in a shuffled order, as a serving pool's are after a
// while. Setup prints its own error; the exit code is 77 where no GPU is usable, else 1.
#pragma once

#include <algorithm>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "model/backend.h"
#include "model/kv_cache.h"

namespace kvstream::bench {

struct StepSetup {
  std::unique_ptr<model::ModelBackend> backend;
  std::unique_ptr<model::KvPool> pool;
  std::vector<int32_t> order;  // every block id of the pool, shuffled

  // 0 on success, else the exit code.
  int Init(const model::ModelSpec& spec, int device, long pool_blocks, int block_size) {
    model::BackendOptions bo;
    bo.kind = "cuda";
    bo.device = device;
    auto be = model::CreateBackend(spec, bo);
    if (!be.ok()) {
      std::fprintf(stderr, "backend: %s\n", be.status().ToString().c_str());
      return be.status().code() == StatusCode::kUnavailable ? 77 : 1;
    }
    backend = std::move(be.value());
    auto p = backend->CreatePool(int(pool_blocks), block_size);
    if (!p.ok()) {
      std::fprintf(stderr, "pool of %ld blocks: %s\n", pool_blocks, p.status().ToString().c_str());
      return 1;
    }
    pool = std::move(p.value());
    order.resize(pool->num_blocks());
    std::iota(order.begin(), order.end(), 0);
    std::mt19937 rng(7);
    std::shuffle(order.begin(), order.end(), rng);
    return 0;
  }
};

}  // namespace kvstream::bench
