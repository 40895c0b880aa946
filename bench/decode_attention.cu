// Decode-attention benchmark: the paged kernel (prefetch off / on at several lookahead
// distances / the kAuto choice) on the paper's shapes, against a plain streaming-read kernel
// measured in the same run. JSON lines (stdout and --json FILE) plus a table at the end.
//
//   decode_attention [--json FILE] [--mem-cap-gib N] [--models a,b] [--batches 1,8]
//                    [--contexts 1024,4096] [--replays N] [--quick]
//
// Method: random fp16 data; per shape several KV sets (each its own pool with a random
// permutation of its blocks as the block tables) rotated so that >= 320 MiB are touched between
// two reads of one set (the H200's L2 is 60 MB); every variant is captured in a CUDA graph of
// launches cycling through the sets, replayed several times interleaved with the other variants;
// time = median replay time (CUDA events) / launches. KV bytes = batch * ctx * kv_heads *
// head_dim * 2 (K, V) * 2 bytes.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.cuh"
#include "kernels/paged_attention.h"

using kvstream::DType;
using namespace kvstream::kernels;
using namespace kvstream::bench;

namespace {

struct Model {
  const char* name;
  int heads;
  int kv_heads;
};

std::vector<int> ParseInts(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string t;
  while (std::getline(ss, t, ',')) v.push_back(std::atoi(t.c_str()));
  return v;
}


struct Variant {
  std::string name;
  Prefetch prefetch;
  int distance;
  double split_factor = 0;  // 0: the launcher's plan; else that many times the planned splits
};

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  double mem_cap_gib = 72;
  int replays = 5;
  std::vector<Model> models = {{"llama-2-7b", 32, 32}, {"llama-3-8b", 32, 8}, {"qwen2.5-7b", 28, 4}};
  std::vector<int> batches = {1, 8, 32, 64, 128};
  std::vector<int> contexts = {1024, 4096, 8192, 16384, 32768};
  std::vector<int> distances = {1, 2, 4};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--json") json_path = next();
    else if (a == "--mem-cap-gib") mem_cap_gib = std::atof(next().c_str());
    else if (a == "--replays") replays = std::max(1, std::atoi(next().c_str()));
    else if (a == "--batches") batches = ParseInts(next());
    else if (a == "--contexts") contexts = ParseInts(next());
    else if (a == "--distances") distances = ParseInts(next());
    else if (a == "--models") {
      const std::string m = next();
      std::vector<Model> keep;
      for (const Model& x : models)
        if (m.find(x.name) != std::string::npos) keep.push_back(x);
      models = keep;
    } else if (a == "--quick") {
      batches = {1, 32};
      contexts = {4096, 16384};
      replays = 3;
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  FILE* json = json_path.empty() ? nullptr : std::fopen(json_path.c_str(), "w");
  auto emit = [&](const std::string& line) {
    std::printf("%s\n", line.c_str());
    if (json) std::fprintf(json, "%s\n", line.c_str());
    std::fflush(stdout);
  };

  int dev = 0;
  CK(cudaSetDevice(dev));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  {
    std::ostringstream o;
    o << "{\"bench\":\"decode_attention\",\"impl\":\"device\",\"gpu\":\"" << prop.name
      << "\",\"sms\":" << prop.multiProcessorCount << ",\"l2_bytes\":" << prop.l2CacheSize
      << ",\"cc\":\"" << prop.major << prop.minor << "\"}";
    emit(o.str());
  }

  // Streaming-read ceiling (2 GiB), measured at the start and the end; the larger is used.
  const size_t stream_bytes = size_t(2) << 30;
  uint4* sbuf = nullptr;
  uint32_t* sink = nullptr;
  CK(cudaMalloc(&sbuf, stream_bytes));
  CK(cudaMalloc(&sink, 4));
  FillRandomHalf<<<prop.multiProcessorCount * 8, 512, 0, st>>>(reinterpret_cast<__half*>(sbuf),
                                                               stream_bytes / 2, 1);
  CK(cudaGetLastError());
  double stream_us = 0;
  double stream_gbps = StreamReadGbps(st, sbuf, stream_bytes / 16, sink, prop.multiProcessorCount, &stream_us);
  {
    std::ostringstream o;
    o << "{\"bench\":\"decode_attention\",\"impl\":\"stream_read\",\"when\":\"start\",\"bytes\":"
      << stream_bytes << ",\"us\":" << stream_us << ",\"gbps\":" << stream_gbps << "}";
    emit(o.str());
  }
  CK(cudaFree(sbuf));
  sbuf = nullptr;

  std::vector<Variant> variants = {{"off", Prefetch::kOff, 1}};
  for (int d : distances) variants.push_back({"on_d" + std::to_string(d), Prefetch::kOn, d});
  // Split-plan probes (prefetch off): half and twice the planned split count.
  variants.push_back({"off_splits_x0.5", Prefetch::kOff, 1, 0.5});
  variants.push_back({"off_splits_x2", Prefetch::kOff, 1, 2.0});

  struct Row {
    std::string model;
    int batch, ctx, splits, auto_on;
    double gbps_off, gbps_on1, gbps_best_on, frac_auto;
    int best_d;
    bool identical;
  };
  std::vector<Row> rows;
  std::vector<std::string> summary_lines;
  const int D = 128, bs = 16;
  const double min_rotated = 320.0 * (1 << 20);

  for (const Model& m : models) {
    for (int B : batches) {
      for (int ctx : contexts) {
        const size_t blocks_per_seq = size_t(ctx) / bs;
        const size_t set_blocks = size_t(B) * blocks_per_seq;
        const size_t block_bytes = size_t(2) * m.kv_heads * bs * D * 2;
        const size_t set_bytes = set_blocks * block_bytes;
        const double cap = mem_cap_gib * double(1 << 30);
        int n_sets = std::max(2, int(std::ceil(min_rotated / double(set_bytes))));
        if (double(set_bytes) * n_sets > cap && set_bytes >= min_rotated) n_sets = 1;
        if (double(set_bytes) * n_sets > cap) {
          std::ostringstream o;
          o << "{\"bench\":\"decode_attention\",\"impl\":\"skip\",\"model\":\"" << m.name
            << "\",\"batch\":" << B << ",\"ctx\":" << ctx << ",\"set_bytes\":" << set_bytes
            << ",\"reason\":\"over --mem-cap-gib " << mem_cap_gib << "\"}";
          emit(o.str());
          continue;
        }
        // Pools, tables, q, out.
        __half* pool = nullptr;
        CK(cudaMalloc(&pool, set_bytes * n_sets));
        FillRandomHalf<<<prop.multiProcessorCount * 8, 512, 0, st>>>(pool, set_bytes * n_sets / 2,
                                                                     uint64_t(B) * 131 + ctx);
        CK(cudaGetLastError());
        std::mt19937 rng(uint32_t(B * 7919 + ctx + m.kv_heads));
        std::vector<int32_t> tables(size_t(n_sets) * set_blocks);
        for (int s = 0; s < n_sets; ++s) {
          std::vector<int32_t> perm(set_blocks);
          std::iota(perm.begin(), perm.end(), 0);
          std::shuffle(perm.begin(), perm.end(), rng);
          std::copy(perm.begin(), perm.end(), tables.begin() + size_t(s) * set_blocks);
        }
        int32_t* d_tables = nullptr;
        int32_t* d_lens = nullptr;
        CK(cudaMalloc(&d_tables, tables.size() * 4));
        CK(cudaMemcpy(d_tables, tables.data(), tables.size() * 4, cudaMemcpyHostToDevice));
        std::vector<int32_t> lens(B, ctx);
        CK(cudaMalloc(&d_lens, B * 4));
        CK(cudaMemcpy(d_lens, lens.data(), B * 4, cudaMemcpyHostToDevice));
        __half* d_q = nullptr;
        __half* d_out = nullptr;
        const size_t qn = size_t(B) * m.heads * D;
        CK(cudaMalloc(&d_q, qn * 2));
        CK(cudaMalloc(&d_out, qn * 2));
        FillRandomHalf<<<64, 256, 0, st>>>(d_q, qn, 99);
        CK(cudaGetLastError());

        PagedDecodeParams p;
        p.out = d_out;
        p.q = d_q;
        p.num_seqs = B;
        p.num_heads = m.heads;
        p.num_kv_heads = m.kv_heads;
        p.head_dim = D;
        p.block_size = bs;
        p.max_blocks_per_seq = int(blocks_per_seq);
        p.max_context_len = ctx;
        p.scale = 1.f / std::sqrt(float(D));
        p.dtype = DType::kF16;
        p.context_lens = d_lens;
        p.kv_layer = pool;
        p.block_tables = d_tables;
        const int splits = PagedDecodeNumSplits(p);
        auto splits_for = [&](const Variant& v) {
          return v.split_factor > 0 ? std::max(1, int(std::lround(splits * v.split_factor))) : 0;
        };
        size_t ws_bytes = 0;
        for (const Variant& v : variants) {
          PagedDecodeParams q = p;
          q.num_splits = splits_for(v);
          ws_bytes = std::max(ws_bytes, PagedDecodeWorkspaceBytes(q));
        }
        const bool auto_on = PagedDecodeAutoPrefetch(p);
        void* ws = nullptr;
        if (ws_bytes) CK(cudaMalloc(&ws, ws_bytes));
        p.workspace = ws;
        p.workspace_bytes = ws_bytes;
        auto set_params = [&](int s, const Variant& v) {
          PagedDecodeParams q = p;
          q.kv_layer = reinterpret_cast<const char*>(pool) + size_t(s) * set_bytes;
          q.block_tables = d_tables + size_t(s) * set_blocks;
          q.prefetch = v.prefetch;
          q.prefetch_distance = v.distance;
          q.num_splits = splits_for(v);
          return q;
        };

        // Outputs of the variants on set 0 must be bit-identical.
        bool identical = true;
        std::vector<uint16_t> ref(qn), got(qn);
        for (size_t vi = 0; vi < variants.size(); ++vi) {
          if (variants[vi].split_factor > 0) continue;  // other split plans round differently
          CK(cudaMemsetAsync(d_out, 0xff, qn * 2, st));
          CK(PagedDecodeAttention(set_params(0, variants[vi]), st));
          CK(cudaStreamSynchronize(st));
          CK(cudaMemcpy(vi == 0 ? ref.data() : got.data(), d_out, qn * 2, cudaMemcpyDeviceToHost));
          if (vi > 0 && std::memcmp(ref.data(), got.data(), qn * 2) != 0) identical = false;
        }
        bool finite = true;
        for (uint16_t h : ref)
          if ((h & 0x7c00) == 0x7c00) finite = false;

        // One graph per variant: `launches` launches cycling through the sets.
        const int min_launches = int(std::clamp(double(size_t(4) << 30) / double(set_bytes), 4.0, 24.0));
        const int launches = n_sets * std::max(1, (min_launches + n_sets - 1) / n_sets);
        // Graph capture (falls back to timing plain launch loops if capture is refused).
        std::vector<cudaGraphExec_t> execs(variants.size(), nullptr);
        bool use_graph = true;
        for (size_t vi = 0; vi < variants.size() && use_graph; ++vi) {
          cudaGraph_t g = nullptr;
          if (cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
            use_graph = false;
            break;
          }
          bool ok = true;
          for (int l = 0; l < launches; ++l)
            ok = ok && PagedDecodeAttention(set_params(l % n_sets, variants[vi]), st) == cudaSuccess;
          ok = cudaStreamEndCapture(st, &g) == cudaSuccess && ok;
          ok = ok && cudaGraphInstantiate(&execs[vi], g, 0) == cudaSuccess;
          if (g) cudaGraphDestroy(g);
          if (!ok) use_graph = false;
        }
        if (!use_graph) {
          (void)cudaGetLastError();
          std::fprintf(stderr, "graph capture refused; timing launch loops instead\n");
          for (auto& e : execs)
            if (e) cudaGraphExecDestroy(e);
          std::fill(execs.begin(), execs.end(), nullptr);
        }
        auto run_variant = [&](size_t vi) {
          if (use_graph) {
            CK(cudaGraphLaunch(execs[vi], st));
          } else {
            for (int l = 0; l < launches; ++l)
              CK(PagedDecodeAttention(set_params(l % n_sets, variants[vi]), st));
          }
        };
        for (size_t vi = 0; vi < variants.size(); ++vi) run_variant(vi);  // warm-up
        CK(cudaStreamSynchronize(st));
        std::vector<std::vector<double>> us(variants.size());
        EventPair t;
        for (int r = 0; r < replays; ++r) {
          for (size_t vi = 0; vi < variants.size(); ++vi) {
            CK(cudaEventRecord(t.a, st));
            run_variant(vi);
            CK(cudaEventRecord(t.b, st));
            CK(cudaEventSynchronize(t.b));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, t.a, t.b));
            us[vi].push_back(ms * 1e3 / launches);
          }
        }
        for (auto& e : execs)
          if (e) CK(cudaGraphExecDestroy(e));

        const double kv_bytes = double(B) * ctx * m.kv_heads * D * 2 * 2;
        std::vector<double> med(variants.size());
        for (size_t vi = 0; vi < variants.size(); ++vi) {
          med[vi] = Median(us[vi]);
          const double gbps = kv_bytes / (med[vi] * 1e-6) / 1e9;
          std::ostringstream o;
          o << "{\"bench\":\"decode_attention\",\"impl\":\"paged\",\"model\":\"" << m.name
            << "\",\"heads\":" << m.heads << ",\"kv_heads\":" << m.kv_heads << ",\"head_dim\":" << D
            << ",\"block\":" << bs << ",\"dtype\":\"f16\",\"batch\":" << B << ",\"ctx\":" << ctx
            << ",\"variant\":\"" << variants[vi].name << "\",\"prefetch\":"
            << (variants[vi].prefetch == Prefetch::kOn ? "true" : "false")
            << ",\"prefetch_distance\":" << variants[vi].distance
            << ",\"splits\":" << PagedDecodeNumSplits(set_params(0, variants[vi]))
            << ",\"us\":" << med[vi] << ",\"us_min\":" << *std::min_element(us[vi].begin(), us[vi].end())
            << ",\"us_max\":" << *std::max_element(us[vi].begin(), us[vi].end())
            << ",\"kv_bytes\":" << kv_bytes << ",\"gbps\":" << gbps
            << ",\"frac_stream\":" << gbps / stream_gbps << ",\"n_sets\":" << n_sets
            << ",\"rotated_mib\":" << double(set_bytes) * n_sets / (1 << 20)
            << ",\"launches_per_graph\":" << launches << ",\"graph\":" << (use_graph ? "true" : "false") << "}";
          emit(o.str());
        }
        // Summary: off vs on (distance 1, the paper's), best distance, the kAuto choice.
        size_t best_on = 1;
        for (size_t vi = 1; vi < variants.size(); ++vi)
          if (variants[vi].prefetch == Prefetch::kOn && med[vi] < med[best_on]) best_on = vi;
        const double us_off = med[0], us_on1 = med.size() > 1 ? med[1] : med[0];
        const double us_auto = auto_on ? us_on1 : us_off;
        const double us_other = auto_on ? us_off : us_on1;
        const double gbps_auto = kv_bytes / (us_auto * 1e-6) / 1e9;
        {
          std::ostringstream o;
          o << "{\"bench\":\"decode_attention\",\"impl\":\"paged_summary\",\"model\":\"" << m.name
            << "\",\"heads\":" << m.heads << ",\"kv_heads\":" << m.kv_heads << ",\"batch\":" << B
            << ",\"ctx\":" << ctx << ",\"splits\":" << splits << ",\"us_off\":" << us_off
            << ",\"us_on\":" << us_on1 << ",\"prefetch_gain\":" << us_off / us_on1
            << ",\"best_on_variant\":\"" << variants[best_on].name << "\",\"us_best_on\":" << med[best_on]
            << ",\"auto\":\"" << (auto_on ? "on" : "off") << "\",\"us_auto\":" << us_auto
            << ",\"auto_slower_than_other\":" << us_auto / us_other - 1.0
            << ",\"gbps_auto\":" << gbps_auto << ",\"frac_stream_auto\":" << gbps_auto / stream_gbps
            << ",\"identical_outputs\":" << (identical ? "true" : "false")
            << ",\"finite_outputs\":" << (finite ? "true" : "false") << "}";
          emit(o.str());
        }
        rows.push_back({m.name, B, ctx, splits, auto_on, kv_bytes / (us_off * 1e-6) / 1e9,
                        kv_bytes / (us_on1 * 1e-6) / 1e9, kv_bytes / (med[best_on] * 1e-6) / 1e9,
                        gbps_auto / stream_gbps, variants[best_on].distance, identical && finite});

        if (ws) CK(cudaFree(ws));
        CK(cudaFree(pool));
        CK(cudaFree(d_tables));
        CK(cudaFree(d_lens));
        CK(cudaFree(d_q));
        CK(cudaFree(d_out));
      }
    }
  }

  CK(cudaMalloc(&sbuf, stream_bytes));
  FillRandomHalf<<<prop.multiProcessorCount * 8, 512, 0, st>>>(reinterpret_cast<__half*>(sbuf),
                                                               stream_bytes / 2, 2);
  double stream_us2 = 0;
  const double stream_gbps2 = StreamReadGbps(st, sbuf, stream_bytes / 16, sink, prop.multiProcessorCount, &stream_us2);
  {
    std::ostringstream o;
    o << "{\"bench\":\"decode_attention\",\"impl\":\"stream_read\",\"when\":\"end\",\"bytes\":"
      << stream_bytes << ",\"us\":" << stream_us2 << ",\"gbps\":" << stream_gbps2 << "}";
    emit(o.str());
  }
  CK(cudaFree(sbuf));
  CK(cudaFree(sink));

  std::printf("\nstreaming read: %.0f GB/s (start), %.0f GB/s (end); fractions below use the start value\n",
              stream_gbps, stream_gbps2);
  std::printf("%-11s %5s %6s %6s | %8s %8s %7s | %8s %4s | %5s %10s %4s\n", "model", "batch", "ctx",
              "splits", "off GB/s", "on GB/s", "on/off", "best on", "dist", "auto", "frac(auto)", "ok");
  for (const Row& r : rows) {
    std::printf("%-11s %5d %6d %6d | %8.0f %8.0f %7.3f | %8.0f %4d | %5s %10.3f %4s\n", r.model.c_str(),
                r.batch, r.ctx, r.splits, r.gbps_off, r.gbps_on1, r.gbps_on1 / r.gbps_off,
                r.gbps_best_on, r.best_d, r.auto_on ? "on" : "off", r.frac_auto,
                r.identical ? "yes" : "NO");
  }
  if (json) std::fclose(json);
  CK(cudaStreamDestroy(st));
  return 0;
}
