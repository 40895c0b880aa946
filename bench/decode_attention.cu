// Decode-attention benchmark: the paged kernel's schedules (Schedule::kV2 = the v2 kernel, the
// v3 ones, kAuto) with prefetch off, and the kAuto schedule with prefetch on at several
// lookahead distances, on the paper's shapes, against a plain streaming-read kernel measured
// in the same run. JSON lines (stdout and --json FILE) plus a table at the end.
//
//   decode_attention [--json FILE] [--mem-cap-gib N] [--models a,b] [--batches 1,8]
//                    [--contexts 1024,4096] [--replays N] [--quick]
//                    [--schedules v2,kernel,fused,wide_kernel,wide_fused,cluster,wide_cluster,auto]
//                    [--early fused,wide_fused] [--early-units 1,2,4]
//                    [--combine128 wide_kernel,...]  (those schedules, and their early
//                    variants, again with 128-dim combine CTAs)
//                    [--distances 1,2] [--split-probes 0.5,2] [--no-graph]
//                    [--tables random|sequential]  (the block tables: a random permutation of
//                    each set's blocks, or the identity)
//
// A decode step runs the attention as back-to-back launches on one stream; the graph (one per
// variant, launches cycling through the KV sets) is that sequence without the host's launch
// cost in the way (--no-graph times the same launches issued one by one).
//
// Method: random fp16 data; per shape several KV sets (each its own pool with a random
// permutation of its blocks as the block tables) rotated so that >= 320 MiB are touched between
// two reads of one set (the H200's L2 is 60 MB); every variant is captured in a CUDA graph of
// launches cycling through the sets, replayed several times interleaved with the other variants;
// time = median replay time (CUDA events) / launches. KV bytes = batch * ctx * kv_heads *
// head_dim * 2 (K, V) * 2 bytes.
//
// Two ceilings per shape: the streaming-read kernel over a 2 GiB buffer at the start and end
// of the run (the device's read bandwidth; `frac_stream`), and the same kernel reading exactly
// one call's bytes - each KV set's pool as one contiguous range, the same back-to-back launches
// cycling through the sets in a graph, replayed interleaved with the variants (`frac_same_size`:
// what a call of that size could reach if it did nothing but read its bytes once). And the
// paged-read ceiling (`frac_gather`): GatherTilesRead (bench/paged_kv_sets.cuh) reading exactly
// the call's K and V tiles through the same block tables with one wave of 512-thread CTAs, 2 or
// 3 tiles in flight per warp (the faster counts), and the same kernel over the pool in order
// (`contig`): what a paged read of these bytes, with nothing else to do, reaches.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.cuh"
#include "bench/paged_kv_sets.cuh"
#include "kernels/paged_attention.h"

using namespace kvstream::kernels;
using namespace kvstream::bench;

namespace {

std::vector<double> ParseDoubles(const std::string& s) {
  std::vector<double> v;
  std::stringstream ss(s);
  std::string t;
  while (std::getline(ss, t, ',')) v.push_back(std::atof(t.c_str()));
  return v;
}

struct Variant {
  std::string name;
  Prefetch prefetch;
  int distance;
  double split_factor = 0;  // 0: the launcher's plan; else that many times the planned splits
  Schedule schedule = Schedule::kAuto;
  std::string sched_name = "auto";
  Prefetch early = Prefetch::kOff;  // early L2 prefetch before the wait for the previous kernel
  int early_units = 0;              // its depth (0 = the launcher's default)
  int combine_dims = 0;             // dims per split-combine CTA (0 = the launcher's 32)
};

// A comma-separated list of explicit schedules (not auto, not v2; empty = none) for `flag`.
bool ParseExplicitSchedules(const std::string& flag, const std::string& list, std::vector<Schedule>* out) {
  out->clear();
  std::stringstream ss(list);
  std::string t;
  while (std::getline(ss, t, ',')) {
    Schedule sc;
    if (t.empty()) continue;
    if (!ParseSchedule(t, &sc) || sc == Schedule::kAuto || sc == Schedule::kV2) {
      std::fprintf(stderr, "%s: bad schedule %s\n", flag.c_str(), t.c_str());
      return false;
    }
    out->push_back(sc);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  double mem_cap_gib = 72;
  int replays = 5;
  std::vector<Model> models = {{"llama-2-7b", 32, 32}, {"llama-3-8b", 32, 8}, {"qwen2.5-7b", 28, 4}};
  std::vector<int> batches = {1, 8, 32, 64, 128};
  std::vector<int> contexts = {1024, 4096, 8192, 16384, 32768};
  std::vector<int> distances = {1};
  std::vector<double> split_probes;
  std::vector<Schedule> schedules = {Schedule::kV2, Schedule::kKernel, Schedule::kFused,
                                     Schedule::kWideKernel, Schedule::kWideFused, Schedule::kAuto};
  bool force_loop = false;
  std::vector<Schedule> early_schedules = {Schedule::kFused, Schedule::kWideFused};
  std::vector<int> early_units = {0};
  std::vector<Schedule> combine128;
  bool sequential_tables = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return FlagValue(argc, argv, &i); };
    if (a == "--json") json_path = next();
    else if (a == "--mem-cap-gib") mem_cap_gib = std::atof(next().c_str());
    else if (a == "--replays") replays = std::max(1, std::atoi(next().c_str()));
    else if (a == "--batches") batches = ParseInts(next());
    else if (a == "--contexts") contexts = ParseInts(next());
    else if (a == "--distances") distances = ParseInts(next());
    else if (a == "--split-probes") split_probes = ParseDoubles(next());
    else if (a == "--no-graph") force_loop = true;
    else if (a == "--tables") {
      const std::string t = next();
      if (t != "random" && t != "sequential") {
        std::fprintf(stderr, "--tables: random or sequential, not %s\n", t.c_str());
        return 2;
      }
      sequential_tables = t == "sequential";
    }
    else if (a == "--early-units") early_units = ParseInts(next());
    else if (a == "--early") {
      if (!ParseExplicitSchedules(a, next(), &early_schedules)) return 2;
    }
    else if (a == "--combine128") {
      if (!ParseExplicitSchedules(a, next(), &combine128)) return 2;
    }
    else if (a == "--schedules") {
      schedules.clear();
      std::stringstream ss(next());
      std::string t;
      while (std::getline(ss, t, ',')) {
        Schedule sc;
        if (!ParseSchedule(t, &sc)) {
          std::fprintf(stderr, "unknown schedule %s\n", t.c_str());
          return 2;
        }
        schedules.push_back(sc);
      }
      if (std::find(schedules.begin(), schedules.end(), Schedule::kAuto) == schedules.end())
        schedules.push_back(Schedule::kAuto);  // the summary compares v2 with what kAuto runs
      if (std::find(schedules.begin(), schedules.end(), Schedule::kV2) == schedules.end())
        schedules.insert(schedules.begin(), Schedule::kV2);
    }
    else if (a == "--models") {
      models = ModelsNamedIn(models, next());
    } else if (a == "--quick") {
      batches = {1, 32};
      contexts = {4096, 16384};
      replays = 3;
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  JsonLines json(json_path);
  auto emit = [&](const std::string& line) { json.Emit(line); };

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

  // Every schedule with prefetch off (variant 0 = v2, the old path; the kAuto one is named
  // "auto"), then prefetch on / split probes of the kAuto schedule.
  std::vector<Variant> variants;
  for (Schedule sc : schedules) {
    const std::string n = ScheduleName(sc);
    if (sc == Schedule::kAuto)
      variants.push_back({"auto", Prefetch::kAuto, 1, 0, sc, n, Prefetch::kAuto});  // what a caller gets
    else
      variants.push_back({n + "_off", Prefetch::kOff, 1, 0, sc, n});
  }
  for (Schedule sc : early_schedules)
    for (int eu : early_units) {
      const std::string n = std::string(ScheduleName(sc)) + "+early" + (eu > 0 ? std::to_string(eu) : "");
      variants.push_back({n + "_off", Prefetch::kOff, 1, 0, sc, n, Prefetch::kOn, eu});
    }
  for (Schedule sc : combine128) {
    const std::string n = std::string(ScheduleName(sc)) + "+c128";
    variants.push_back({n + "_off", Prefetch::kOff, 1, 0, sc, n, Prefetch::kOff, 0, 128});
    if (std::find(early_schedules.begin(), early_schedules.end(), sc) != early_schedules.end()) {
      const std::string ne = std::string(ScheduleName(sc)) + "+early+c128";
      variants.push_back({ne + "_off", Prefetch::kOff, 1, 0, sc, ne, Prefetch::kOn, 0, 128});
    }
  }
  std::stable_sort(variants.begin(), variants.end(),
                   [](const Variant& x, const Variant& y) { return x.schedule == Schedule::kV2 && y.schedule != Schedule::kV2; });
  for (int d : distances)
    variants.push_back({"auto_on_d" + std::to_string(d), Prefetch::kOn, d, 0, Schedule::kAuto, "auto",
                        Prefetch::kAuto});
  for (double f : split_probes) {
    std::ostringstream n;
    n << "auto_off_splits_x" << f;
    variants.push_back({n.str(), Prefetch::kOff, 1, f, Schedule::kAuto, "auto", Prefetch::kAuto});
  }
  size_t auto_vi = 0;
  for (size_t vi = 0; vi < variants.size(); ++vi)
    if (variants[vi].schedule == Schedule::kAuto && variants[vi].prefetch == Prefetch::kAuto)
      auto_vi = vi;

  struct Row {
    std::string model;
    int batch, ctx, splits_v2, splits_auto;
    std::string auto_sched;
    double gbps_v2, gbps_auto;
    std::vector<double> gbps_sched;  // per schedule variant (prefetch off)
    double pf_gain;
    bool identical;
    double same_gbps;  // the streaming read of one call's bytes
    double gather_gbps;  // the paged read of one call's tiles (best depth)
  };
  std::vector<Row> rows;
  std::vector<std::string> summary_lines;
  const int D = 128, bs = 16;
  const double min_rotated = 320.0 * (1 << 20);

  for (const Model& m : models) {
    for (int B : batches) {
      for (int ctx : contexts) {
        const KvSetShape shape = MakeKvSetShape(m, B, ctx, D, bs);
        const size_t set_bytes = shape.set_bytes;
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
        // Pools, tables, q, out (freed at the end of this shape).
        KvSets sets(shape, n_sets, st, prop.multiProcessorCount, sequential_tables);
        const size_t qn = shape.qn;
        __half* const d_out = sets.out();
        PagedDecodeParams p = sets.Params();
        p.num_blocks = int(shape.set_blocks);  // each set's pool (bounds the early prefetch)
        const int splits = PagedDecodeNumSplits(p);  // kAuto's plan
        auto splits_for = [&](const Variant& v) {
          return v.split_factor > 0 ? std::max(1, int(std::lround(splits * v.split_factor))) : 0;
        };
        size_t ws_bytes = 0;
        for (const Variant& v : variants) {
          PagedDecodeParams q = p;
          q.num_splits = splits_for(v);
          q.schedule = v.schedule;
          ws_bytes = std::max(ws_bytes, PagedDecodeWorkspaceBytes(q));
        }
        const bool auto_on = PagedDecodeAutoPrefetch(p);
        sets.SetWorkspace(&p, ws_bytes);  // zeroed: the workspace contract (fused-combine counters)
        auto set_params = [&](int s, const Variant& v) {
          PagedDecodeParams q = sets.ForSet(p, s);
          q.prefetch = v.prefetch;
          q.prefetch_distance = v.distance;
          q.num_splits = splits_for(v);
          q.schedule = v.schedule;
          q.early_prefetch = v.early;
          q.early_prefetch_units = v.early_units;
          q.combine_dims = v.combine_dims;
          return q;
        };

        // Prefetch variants of one schedule must give bit-identical outputs (on set 0); every
        // variant's output must be finite and agree with v2's to fp16 rounding (different
        // schedules split and merge differently).
        bool identical = true, finite = true;
        double max_diff_v2 = 0;
        std::vector<uint16_t> v2_out(qn), got(qn);
        std::vector<std::vector<uint16_t>> sched_out(variants.size());
        for (size_t vi = 0; vi < variants.size(); ++vi) {
          if (variants[vi].split_factor > 0) continue;  // other split plans round differently
          CK(cudaMemsetAsync(d_out, 0xff, qn * 2, st));
          CK(PagedDecodeAttention(set_params(0, variants[vi]), st));
          CK(cudaStreamSynchronize(st));
          CK(cudaMemcpy(got.data(), d_out, qn * 2, cudaMemcpyDeviceToHost));
          for (uint16_t h : got)
            if ((h & 0x7c00) == 0x7c00) finite = false;
          if (vi == 0) v2_out = got;
          for (size_t i = 0; i < qn; ++i)
            max_diff_v2 = std::max(max_diff_v2, double(std::fabs(__half2float(__ushort_as_half(got[i])) -
                                                                 __half2float(__ushort_as_half(v2_out[i])))));
          // The first variant of each schedule is the reference of its other variants.
          size_t first = vi;
          for (size_t k = 0; k < vi; ++k)
            if (variants[k].schedule == variants[vi].schedule && variants[k].split_factor == 0 &&
                variants[k].combine_dims == variants[vi].combine_dims) {
              first = k;
              break;
            }
          if (first == vi) {
            sched_out[vi] = got;
          } else if (std::memcmp(sched_out[first].data(), got.data(), qn * 2) != 0) {
            identical = false;
          }
        }

        // One graph per variant: `launches` launches cycling through the sets.
        const int min_launches = int(std::clamp(double(size_t(4) << 30) / double(set_bytes), 4.0, 24.0));
        const int launches = n_sets * std::max(1, (min_launches + n_sets - 1) / n_sets);
        // Graph capture (falls back to timing plain launch loops if capture is refused).
        std::vector<cudaGraphExec_t> execs(variants.size(), nullptr);
        bool use_graph = !force_loop;
        // The same-size streaming read: its own graph of `launches` reads of one set each.
        cudaGraphExec_t same_exec = nullptr;
        auto set_pool = [&](int s) {
          return reinterpret_cast<const uint4*>(reinterpret_cast<const char*>(sets.pool()) + size_t(s) * set_bytes);
        };
        auto same_size_read = [&](int s) {
          StreamRead<<<prop.multiProcessorCount * 8, 512, 0, st>>>(set_pool(s), set_bytes / 16, sink);
        };
        // The paged-read ceilings: 2 / 3 tiles in flight per warp, over the sets' own tables /
        // the identity; kernel and grid (one wave) chosen once.
        using GatherKernel = void (*)(const uint4*, const int32_t*, int, int, long, uint32_t*);
        struct Reader {
          bool identity;
          int depth;
          GatherKernel kernel = nullptr;
          int grid = 0;
          cudaGraphExec_t exec = nullptr;
          std::vector<double> us;
        };
        std::vector<Reader> readers = {{false, 2}, {false, 3}, {true, 2}, {true, 3}};
        for (Reader& r : readers) {
          r.kernel = r.depth == 2 ? GatherTilesRead<2> : GatherTilesRead<3>;
          int per_sm = 0;
          CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, r.kernel, 512, 0));
          r.grid = prop.multiProcessorCount * per_sm;
        }
        int32_t* identity = nullptr;
        {
          std::vector<int32_t> id(shape.set_blocks);
          std::iota(id.begin(), id.end(), 0);
          CK(cudaMalloc(&identity, id.size() * 4));
          CK(cudaMemcpy(identity, id.data(), id.size() * 4, cudaMemcpyHostToDevice));
        }
        const long tiles = long(shape.set_blocks) * m.kv_heads * 2;
        auto gather_read = [&](const Reader& r, int s) {
          r.kernel<<<r.grid, 512, 0, st>>>(set_pool(s), r.identity ? identity : sets.tables(s),
                                           int(shape.blocks_per_seq), m.kv_heads, tiles, sink);
        };
        if (!force_loop) {
          CK(CaptureGraph(st, launches, [&](int l) {
            same_size_read(l % n_sets);
            return cudaSuccess;  // a launch error fails the capture
          }, &same_exec));
          for (Reader& r : readers)
            CK(CaptureGraph(st, launches, [&](int l) {
              gather_read(r, l % n_sets);
              return cudaSuccess;
            }, &r.exec));
        }
        for (size_t vi = 0; vi < variants.size() && use_graph; ++vi) {  // (skipped with --no-graph)
          const cudaError_t e = CaptureGraph(st, launches, [&](int l) {
            return PagedDecodeAttention(set_params(l % n_sets, variants[vi]), st);
          }, &execs[vi]);
          if (e != cudaSuccess) use_graph = false;
        }
        if (!use_graph && !force_loop) {
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
        auto run_same_size = [&]() {
          if (same_exec) {
            CK(cudaGraphLaunch(same_exec, st));
          } else {
            for (int l = 0; l < launches; ++l) same_size_read(l % n_sets);
          }
          CK(cudaGetLastError());
        };
        auto run_reader = [&](const Reader& r) {
          if (r.exec) {
            CK(cudaGraphLaunch(r.exec, st));
          } else {
            for (int l = 0; l < launches; ++l) gather_read(r, l % n_sets);
          }
          CK(cudaGetLastError());
        };
        for (size_t vi = 0; vi < variants.size(); ++vi) run_variant(vi);  // warm-up
        run_same_size();
        for (const Reader& r : readers) run_reader(r);
        CK(cudaStreamSynchronize(st));
        std::vector<std::vector<double>> us(variants.size());
        std::vector<double> same_us;
        EventPair t;
        for (int r = 0; r < replays; ++r) {
          for (size_t vi = 0; vi <= variants.size(); ++vi) {
            const double ms = TimeOnStream(st, t, [&] {
              if (vi < variants.size()) {
                run_variant(vi);
              } else {
                run_same_size();
              }
            });
            (vi < variants.size() ? us[vi] : same_us).push_back(ms * 1e3 / launches);
          }
          for (Reader& rd : readers)
            rd.us.push_back(TimeOnStream(st, t, [&] { run_reader(rd); }) * 1e3 / launches);
        }
        for (auto& e : execs)
          if (e) CK(cudaGraphExecDestroy(e));
        if (same_exec) CK(cudaGraphExecDestroy(same_exec));
        CK(cudaFree(identity));
        double gather_gbps = 0;  // the best depth over the sets' own tables
        for (Reader& rd : readers) {
          if (rd.exec) CK(cudaGraphExecDestroy(rd.exec));
          const double g = double(set_bytes) / (Median(rd.us) * 1e-6) / 1e9;
          if (!rd.identity) gather_gbps = std::max(gather_gbps, g);
          std::ostringstream o;
          o << "{\"bench\":\"decode_attention\",\"impl\":\"gather_read\",\"model\":\"" << m.name
            << "\",\"batch\":" << B << ",\"ctx\":" << ctx << ",\"tables\":\""
            << (rd.identity ? "identity" : (sequential_tables ? "sequential" : "random"))
            << "\",\"depth\":" << rd.depth << ",\"bytes\":" << set_bytes << ",\"us\":" << Median(rd.us)
            << ",\"gbps\":" << g << ",\"frac_stream\":" << g / stream_gbps << "}";
          emit(o.str());
        }
        const double same_size_us = Median(same_us);
        const double same_size_gbps = double(set_bytes) / (same_size_us * 1e-6) / 1e9;
        {
          std::ostringstream o;
          o << "{\"bench\":\"decode_attention\",\"impl\":\"stream_read_same_size\",\"model\":\""
            << m.name << "\",\"batch\":" << B << ",\"ctx\":" << ctx << ",\"bytes\":" << set_bytes
            << ",\"us\":" << same_size_us << ",\"gbps\":" << same_size_gbps
            << ",\"frac_stream\":" << same_size_gbps / stream_gbps << "}";
          emit(o.str());
        }

        const double kv_bytes = double(B) * ctx * m.kv_heads * D * 2 * 2;
        std::vector<double> med(variants.size());
        for (size_t vi = 0; vi < variants.size(); ++vi) {
          med[vi] = Median(us[vi]);
          const double gbps = kv_bytes / (med[vi] * 1e-6) / 1e9;
          const PagedDecodePlanInfo plan = PagedDecodeDescribe(set_params(0, variants[vi]));
          std::ostringstream o;
          o << "{\"bench\":\"decode_attention\",\"impl\":\"paged\",\"model\":\"" << m.name
            << "\",\"heads\":" << m.heads << ",\"kv_heads\":" << m.kv_heads << ",\"head_dim\":" << D
            << ",\"block\":" << bs << ",\"dtype\":\"f16\",\"batch\":" << B << ",\"ctx\":" << ctx
            << ",\"variant\":\"" << variants[vi].name << "\",\"schedule\":\""
            << ScheduleName(plan.schedule)
            << "\",\"early_prefetch\":" << (plan.early_prefetch_units > 0 ? "true" : "false")
            << ",\"prefetch\":"
            << (variants[vi].prefetch == Prefetch::kOn ? "true" : "false")
            << ",\"prefetch_distance\":" << variants[vi].distance
            << ",\"splits\":" << plan.num_splits << ",\"cluster\":" << plan.cluster
            << ",\"combine_dims\":" << plan.combine_dims
            << ",\"us\":" << med[vi] << ",\"us_min\":" << *std::min_element(us[vi].begin(), us[vi].end())
            << ",\"us_max\":" << *std::max_element(us[vi].begin(), us[vi].end())
            << ",\"kv_bytes\":" << kv_bytes << ",\"gbps\":" << gbps
            << ",\"frac_stream\":" << gbps / stream_gbps
            << ",\"frac_same_size\":" << gbps / same_size_gbps << ",\"frac_gather\":" << gbps / gather_gbps
            << ",\"tables\":\"" << (sequential_tables ? "sequential" : "random") << "\",\"n_sets\":" << n_sets
            << ",\"rotated_mib\":" << double(set_bytes) * n_sets / (1 << 20)
            << ",\"launches_per_graph\":" << launches << ",\"graph\":" << (use_graph ? "true" : "false") << "}";
          emit(o.str());
        }
        // Summary: v2 (the old path) vs what kAuto runs, each schedule, the prefetch gain of the
        // kAuto schedule (distance 1, the paper's).
        size_t on1 = variants.size();
        for (size_t vi = 0; vi < variants.size(); ++vi)
          if (variants[vi].prefetch == Prefetch::kOn && variants[vi].distance == 1) on1 = vi;
        size_t best_sched = 0;
        for (size_t vi = 0; vi < variants.size(); ++vi)
          if (variants[vi].prefetch != Prefetch::kOn && variants[vi].split_factor == 0 &&
              med[vi] < med[best_sched])
            best_sched = vi;
        const double us_v2 = med[0], us_auto = med[auto_vi];
        const double pf_gain = on1 < variants.size() ? us_auto / med[on1] : 0;
        PagedDecodeParams pa = set_params(0, variants[auto_vi]);
        const std::string auto_sched = ScheduleName(PagedDecodeResolvedSchedule(pa));
        const int splits_v2 = PagedDecodeNumSplits(set_params(0, variants[0]));
        {
          std::ostringstream o;
          o << "{\"bench\":\"decode_attention\",\"impl\":\"paged_summary\",\"model\":\"" << m.name
            << "\",\"heads\":" << m.heads << ",\"kv_heads\":" << m.kv_heads << ",\"batch\":" << B
            << ",\"ctx\":" << ctx << ",\"splits\":" << splits << ",\"splits_v2\":" << splits_v2
            << ",\"auto_schedule\":\"" << auto_sched << "\",\"us_v2\":" << us_v2
            << ",\"us_auto\":" << us_auto << ",\"speedup_auto_vs_v2\":" << us_v2 / us_auto
            << ",\"gbps_v2\":" << kv_bytes / (us_v2 * 1e-6) / 1e9
            << ",\"frac_stream_v2\":" << kv_bytes / (us_v2 * 1e-6) / 1e9 / stream_gbps
            << ",\"gbps_auto\":" << kv_bytes / (us_auto * 1e-6) / 1e9
            << ",\"frac_stream_auto\":" << kv_bytes / (us_auto * 1e-6) / 1e9 / stream_gbps
            << ",\"same_size_gbps\":" << same_size_gbps
            << ",\"frac_same_size_auto\":" << kv_bytes / (us_auto * 1e-6) / 1e9 / same_size_gbps
            << ",\"gather_gbps\":" << gather_gbps
            << ",\"frac_gather_auto\":" << kv_bytes / (us_auto * 1e-6) / 1e9 / gather_gbps
            << ",\"fastest_variant\":\"" << variants[best_sched].name << "\",\"us_fastest\":" << med[best_sched]
            << ",\"auto_slower_than_fastest\":" << us_auto / med[best_sched] - 1.0
            << ",\"us_off\":" << us_auto << ",\"us_on\":" << (on1 < variants.size() ? med[on1] : 0)
            << ",\"prefetch_gain\":" << pf_gain << ",\"auto\":\"" << (auto_on ? "on" : "off") << "\""
            << ",\"auto_slower_than_other\":"
            << (on1 < variants.size() ? (auto_on ? med[on1] / us_auto : us_auto / med[on1]) - 1.0 : 0.0)
            << ",\"max_abs_diff_vs_v2\":" << max_diff_v2
            << ",\"identical_outputs\":" << (identical ? "true" : "false")
            << ",\"finite_outputs\":" << (finite ? "true" : "false") << ",\"graph\":"
            << (use_graph ? "true" : "false") << "}";
          emit(o.str());
        }
        Row row{m.name, B, ctx, splits_v2, splits, auto_sched, kv_bytes / (us_v2 * 1e-6) / 1e9,
                kv_bytes / (us_auto * 1e-6) / 1e9, {}, pf_gain, identical && finite && max_diff_v2 < 2e-2,
                same_size_gbps, gather_gbps};
        for (size_t vi = 0; vi < variants.size(); ++vi)
          if (variants[vi].prefetch == Prefetch::kOff && variants[vi].split_factor == 0)
            row.gbps_sched.push_back(kv_bytes / (med[vi] * 1e-6) / 1e9);
        rows.push_back(row);
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

  std::printf("\nstreaming read: %.0f GB/s (start), %.0f GB/s (end); fractions below use the start value;\n"
              "'same': the streaming read of exactly one call's bytes, back to back like the calls;\n"
              "'gather': the paged read of exactly one call's tiles (GatherTilesRead), likewise\n",
              stream_gbps, stream_gbps2);
  std::printf("%-11s %4s %6s %7s | %7s %5s |", "model", "B", "ctx", "splits", "v2 GB/s", "frac");
  for (const Variant& v : variants)
    if (v.prefetch == Prefetch::kOff && v.split_factor == 0 && v.schedule != Schedule::kV2)
      std::printf(" %11s", v.sched_name.c_str());
  std::printf(" | %11s %7s %5s %7s %6s | %9s %5s | %11s %5s | %3s\n", "auto =", "GB/s", "frac", "speedup",
              "pf", "same GB/s", "frac", "gather GB/s", "frac", "ok");
  for (const Row& r : rows) {
    std::printf("%-11s %4d %6d %3d/%-3d | %7.0f %5.3f |", r.model.c_str(), r.batch, r.ctx, r.splits_v2,
                r.splits_auto, r.gbps_v2, r.gbps_v2 / stream_gbps);
    for (size_t k = 1; k < r.gbps_sched.size(); ++k) std::printf(" %11.0f", r.gbps_sched[k]);
    std::printf(" | %11s %7.0f %5.3f %7.3f %6.3f | %9.0f %5.3f | %11.0f %5.3f | %3s\n", r.auto_sched.c_str(),
                r.gbps_auto, r.gbps_auto / stream_gbps, r.gbps_auto / r.gbps_v2, r.pf_gain, r.same_gbps,
                r.gbps_auto / r.same_gbps, r.gather_gbps, r.gbps_auto / r.gather_gbps, r.identical ? "yes" : "NO");
  }
  CK(cudaStreamDestroy(st));
  return 0;
}
