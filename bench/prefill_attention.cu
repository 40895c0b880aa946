// prefill_attention: kvstream's causal prefill attention (kernels/prefill_attention.h) on one
// prompt per shape, read from a paged pool through a random block table. Prints one JSON line
// per shape (TFLOP/s of causal attention, 4 * heads * head_dim * T * (T + 1) / 2 FLOPs) and a
// table; bench/prefill_sdpa.py measures PyTorch SDPA (causal) on the same shapes and prints the
// ratio next to these lines.
//
//   prefill_attention [--json FILE] [--prompts 2048,4096,16384,32768] [--iters 5]
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.cuh"
#include "kernels/prefill_attention.h"

namespace {
using kvstream::bench::FillRandomHalf;

std::vector<int> ParseList(const char* s) {
  std::vector<int> v;
  for (const char* p = s; *p;) {
    v.push_back(std::atoi(p));
    const char* c = std::strchr(p, ',');
    if (!c) break;
    p = c + 1;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kvstream;
  std::vector<int> prompts = {2048, 4096, 16384, 32768};
  int iters = 5;
  const char* json = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) {
      json = argv[++i];
    } else if (!std::strcmp(argv[i], "--prompts") && i + 1 < argc) {
      prompts = ParseList(argv[++i]);
    } else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) {
      iters = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--json FILE] [--prompts a,b,..] [--iters N]\n", argv[0]);
      return 2;
    }
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 77;
  }
  FILE* jf = json ? std::fopen(json, "a") : nullptr;
  struct Model {
    const char* name;
    int nh, nkv;
  };
  const Model models[] = {{"llama-3-8b", 32, 8}, {"llama-2-7b", 32, 32}};
  const int hd = 128, bs = 16;
  std::printf("%-12s %7s | %9s %9s\n", "model", "prompt", "ms/layer", "TFLOP/s");
  for (const Model& m : models) {
    for (int T : prompts) {
      const int blocks = (T + bs - 1) / bs;
      std::vector<int32_t> table(blocks);
      std::iota(table.begin(), table.end(), 0);
      std::shuffle(table.begin(), table.end(), std::mt19937(T));
      const size_t pool_elems = size_t(blocks) * 2 * m.nkv * bs * hd;
      const size_t q_elems = size_t(T) * m.nh * hd;
      uint16_t *pool, *q, *out;
      int32_t *d_table, *d_qs, *d_start;
      CK(cudaMalloc(&pool, pool_elems * 2));
      CK(cudaMalloc(&q, q_elems * 2));
      CK(cudaMalloc(&out, q_elems * 2));
      CK(cudaMalloc(&d_table, blocks * 4));
      CK(cudaMalloc(&d_qs, 8));
      CK(cudaMalloc(&d_start, 4));
      FillRandomHalf<<<1024, 256>>>(reinterpret_cast<__half*>(pool), pool_elems, 1);
      FillRandomHalf<<<1024, 256>>>(reinterpret_cast<__half*>(q), q_elems, 2);
      const int32_t qs[2] = {0, T}, st = 0;
      CK(cudaMemcpy(d_table, table.data(), blocks * 4, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(d_qs, qs, 8, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(d_start, &st, 4, cudaMemcpyHostToDevice));
      kernels::PrefillAttentionParams p;
      p.out = out;
      p.q = q;
      p.kv_layer = pool;
      p.block_tables = d_table;
      p.q_start = d_qs;
      p.start_pos = d_start;
      p.num_seqs = 1;
      p.num_heads = m.nh;
      p.num_kv_heads = m.nkv;
      p.head_dim = hd;
      p.block_size = bs;
      p.max_blocks_per_seq = blocks;
      p.max_q_len = T;
      p.scale = 1.f / std::sqrt(float(hd));
      p.dtype = DType::kF16;
      CK(kernels::PrefillAttention(p, nullptr));  // warm-up
      CK(cudaDeviceSynchronize());
      cudaEvent_t e0, e1;
      CK(cudaEventCreate(&e0));
      CK(cudaEventCreate(&e1));
      std::vector<float> ms(iters);
      for (int i = 0; i < iters; ++i) {
        CK(cudaEventRecord(e0));
        CK(kernels::PrefillAttention(p, nullptr));
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms[i], e0, e1));
      }
      std::sort(ms.begin(), ms.end());
      const double med = ms[iters / 2];
      const double flops = 4.0 * m.nh * hd * (double(T) * (T + 1) / 2);
      const double tf = flops / (med * 1e-3) / 1e12;
      std::printf("%-12s %7d | %9.3f %9.1f\n", m.name, T, med, tf);
      if (jf) {
        std::fprintf(jf,
                     "{\"impl\":\"kvstream\",\"model\":\"%s\",\"heads\":%d,\"kv_heads\":%d,"
                     "\"head_dim\":%d,\"prompt\":%d,\"ms\":%.4f,\"tflops\":%.2f}\n",
                     m.name, m.nh, m.nkv, hd, T, med, tf);
      }
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
      cudaFree(pool);
      cudaFree(q);
      cudaFree(out);
      cudaFree(d_table);
      cudaFree(d_qs);
      cudaFree(d_start);
    }
  }
  if (jf) std::fclose(jf);
  return 0;
}
