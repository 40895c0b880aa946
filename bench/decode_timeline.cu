// Where a decode-attention call's time goes, CTA by CTA: the paged kernel built with
// per-CTA timestamps (kernels/paged_attention_timeline.h, target
// kvstream_kernels_attention_timeline) on the shapes of bench/decode_attention, launched the
// same way (a CUDA graph of back-to-back launches cycling through KV sets rotated over
// >= 320 MiB), and the last launch of each replay read back.
//
//   decode_timeline [--json FILE] [--models qwen2.5-7b] [--batches 1] [--contexts 16384]
//                   [--schedules auto,wide_kernel] [--replays 5]
//
// Per replay: the call time (events, replay / launches, with the timestamps on and off) and,
// for the last launch, relative to its first CTA's start (us): the spread of the CTAs' starts,
// their first KV data, the end of their units, their writes, the combine kernel's start, wait
// and end; per-CTA phase lengths (first data after the wait, the units, the CTA merge); the
// spread of the warps' ends inside a CTA; and the number of CTAs working (between their wait
// and their write) per 0.5 us - the ramp and the drain. %globaltimer's resolution is printed
// (the smallest step seen): phases shorter than it are not resolved, but the clock64 cycles
// (per SM) of each CTA's own phases are.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.cuh"
#include "bench/paged_kv_sets.cuh"
#include "kernels/paged_attention.h"
#include "kernels/paged_attention_timeline.h"

using namespace kvstream::kernels;
using namespace kvstream::bench;
namespace tl = kvstream::kernels::timeline;

namespace {

// min / p10 / p50 / p90 / max of `v` as a JSON object.
std::string Spread(std::vector<double> v) {
  std::ostringstream o;
  if (v.empty()) return "null";
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[size_t(std::lround(q * double(v.size() - 1)))]; };
  o.precision(4);
  o << "{\"min\":" << v.front() << ",\"p10\":" << at(0.1) << ",\"p50\":" << at(0.5) << ",\"p90\":" << at(0.9)
    << ",\"max\":" << v.back() << "}";
  return o.str();
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  int replays = 5;
  std::vector<Model> models = {{"llama-2-7b", 32, 32}, {"llama-3-8b", 32, 8}, {"qwen2.5-7b", 28, 4}};
  std::string model_names = "qwen2.5-7b";
  std::vector<int> batches = {1};
  std::vector<int> contexts = {16384};
  std::vector<Schedule> schedules = {Schedule::kAuto};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return FlagValue(argc, argv, &i); };
    if (a == "--json") json_path = next();
    else if (a == "--replays") replays = std::max(1, std::atoi(next().c_str()));
    else if (a == "--models") model_names = next();
    else if (a == "--batches") batches = ParseInts(next());
    else if (a == "--contexts") contexts = ParseInts(next());
    else if (a == "--schedules") {
      schedules.clear();
      std::stringstream ss(next());
      std::string t;
      while (std::getline(ss, t, ',')) {
        Schedule x;
        if (!ParseSchedule(t, &x)) {
          std::fprintf(stderr, "unknown schedule %s\n", t.c_str());
          return 2;
        }
        schedules.push_back(x);
      }
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  models = ModelsNamedIn(models, model_names);
  JsonLines json(json_path);

  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  unsigned long long* buf = nullptr;
  CK(cudaMalloc(&buf, tl::kBufferWords * 8));
  const cudaError_t set = tl::SetBuffer(buf);
  if (set != cudaSuccess) {
    std::fprintf(stderr, "timeline::SetBuffer: %s (not the instrumented build?)\n", cudaGetErrorString(set));
    return 1;
  }
  std::vector<unsigned long long> host(tl::kBufferWords);
  const int D = 128, bs = 16;
  const double min_rotated = 320.0 * (1 << 20);

  for (const Model& m : models)
    for (int B : batches)
      for (int ctx : contexts)
        for (Schedule sc : schedules) {
          const KvSetShape shape = MakeKvSetShape(m, B, ctx, D, bs);
          const int n_sets = std::max(2, int(std::ceil(min_rotated / double(shape.set_bytes))));
          KvSets sets(shape, n_sets, st, prop.multiProcessorCount);
          PagedDecodeParams p = sets.Params();
          p.num_blocks = int(shape.set_blocks);
          p.schedule = sc;
          const PagedDecodePlanInfo plan = PagedDecodeDescribe(p);
          sets.SetWorkspace(&p, plan.workspace_bytes);
          CK(cudaStreamSynchronize(st));
          const int min_launches = int(std::clamp(double(size_t(4) << 30) / double(shape.set_bytes), 4.0, 24.0));
          const int launches = n_sets * std::max(1, (min_launches + n_sets - 1) / n_sets);
          cudaGraphExec_t exec = nullptr;
          CK(CaptureGraph(st, launches, [&](int l) { return PagedDecodeAttention(sets.ForSet(p, l % n_sets), st); },
                          &exec));
          CK(cudaGraphLaunch(exec, st));  // warm-up
          CK(cudaStreamSynchronize(st));
          EventPair ev;
          for (int r = 0; r < replays; ++r) {
            // The same replay with the timestamps off (the kernels then skip them after one
            // branch): the instrumentation's cost.
            CK(tl::SetBuffer(nullptr));
            const double us_off = TimeOnStream(st, ev, [&] { CK(cudaGraphLaunch(exec, st)); }) * 1e3 / launches;
            CK(tl::SetBuffer(buf));
            CK(cudaMemsetAsync(buf, 0, tl::kBufferWords * 8, st));
            const double us_on = TimeOnStream(st, ev, [&] { CK(cudaGraphLaunch(exec, st)); }) * 1e3 / launches;
            CK(cudaMemcpy(host.data(), buf, tl::kBufferWords * 8, cudaMemcpyDeviceToHost));

            auto row = [&](long base, long c) { return host.data() + (base + c) * tl::kMainSlots; };
            std::vector<long> mains, combs;
            for (long c = 0; c < tl::kMaxMainCtas; ++c)
              if (row(0, c)[tl::kEntry] != 0) mains.push_back(c);
            for (long c = 0; c < tl::kMaxCombineCtas; ++c)
              if (row(tl::kMaxMainCtas, c)[tl::kEntry] != 0) combs.push_back(c);
            if (mains.empty()) {
              std::fprintf(stderr, "no timestamps recorded\n");
              return 1;
            }
            unsigned long long t0 = ~0ull, t_end = 0;
            std::vector<unsigned long long> all;
            for (long c : mains) {
              t0 = std::min(t0, row(0, c)[tl::kEntry]);
              t_end = std::max(t_end, row(0, c)[tl::kWritten]);
              for (int e = tl::kEntry; e <= tl::kWritten; ++e) all.push_back(row(0, c)[e]);
            }
            for (long c : combs) t_end = std::max(t_end, row(tl::kMaxMainCtas, c)[tl::kWritten]);
            std::sort(all.begin(), all.end());
            unsigned long long step = ~0ull;
            for (size_t i = 1; i < all.size(); ++i)
              if (all[i] > all[i - 1]) step = std::min(step, all[i] - all[i - 1]);
            auto rel = [&](unsigned long long t) { return double(t - t0) * 1e-3; };
            std::vector<double> entry, waited, first, done, written, first_lat, units_phase, merge, weights,
                warp_spread, ghz;
            for (long c : mains) {
              const unsigned long long* x = row(0, c);
              entry.push_back(rel(x[tl::kEntry]));
              waited.push_back(rel(x[tl::kWaited]));
              if (x[tl::kFirstData]) {
                first.push_back(rel(x[tl::kFirstData]));
                first_lat.push_back(double(x[tl::kFirstData] - x[tl::kWaited]) * 1e-3);
                units_phase.push_back(double(x[tl::kAllDone] - x[tl::kFirstData]) * 1e-3);
              }
              done.push_back(rel(x[tl::kAllDone]));
              written.push_back(rel(x[tl::kWritten]));
              merge.push_back(double(x[tl::kWritten] - x[tl::kAllDone]) * 1e-3);
              if (x[tl::kWeighted]) weights.push_back(double(x[tl::kWeighted] - x[tl::kAllDone]) * 1e-3);
              unsigned long long wmin = ~0ull, wmax = 0;
              for (int w = 0; w < plan.warps_per_cta && w < 16; ++w) {
                const unsigned long long t = x[tl::kWarpDone + w];
                if (t == 0) continue;
                wmin = std::min(wmin, t);
                wmax = std::max(wmax, t);
              }
              if (wmax >= wmin && wmax) warp_spread.push_back(double(wmax - wmin) * 1e-3);
              const double ns = double(x[tl::kWritten] - x[tl::kEntry]);
              if (ns > 2000) ghz.push_back(double(x[tl::kClock + tl::kWritten] - x[tl::kClock + tl::kEntry]) / ns);
            }
            std::vector<double> merged;  // fused / cluster merges
            // (Only a fused merge's last CTA writes kMerged: a row may hold an earlier launch's.)
            for (long c : mains)
              if (row(0, c)[tl::kMerged] >= t0) {
                merged.push_back(rel(row(0, c)[tl::kMerged]));
                t_end = std::max(t_end, row(0, c)[tl::kMerged]);
              }
            std::vector<double> c_entry, c_waited, c_written;
            for (long c : combs) {
              const unsigned long long* x = row(tl::kMaxMainCtas, c);
              c_entry.push_back(rel(x[tl::kEntry]));
              c_waited.push_back(rel(x[tl::kWaited]));
              c_written.push_back(rel(x[tl::kWritten]));
            }
            // CTAs working (between their wait and their write) per 0.5 us.
            const double span = rel(t_end);
            std::vector<int> active(size_t(span / 0.5) + 1, 0);
            for (long c : mains) {
              const double a = rel(row(0, c)[tl::kWaited]), b = rel(row(0, c)[tl::kWritten]);
              for (size_t k = 0; k < active.size(); ++k) {
                const double lo = 0.5 * double(k), hi = lo + 0.5;
                if (a < hi && b > lo) ++active[k];
              }
            }
            std::ostringstream o;
            o.precision(5);
            o << "{\"bench\":\"decode_timeline\",\"model\":\"" << m.name << "\",\"heads\":" << m.heads
              << ",\"kv_heads\":" << m.kv_heads << ",\"batch\":" << B << ",\"ctx\":" << ctx
              << ",\"schedule\":\"" << ScheduleName(plan.schedule) << "\",\"requested\":\"" << ScheduleName(sc)
              << "\",\"splits\":" << plan.num_splits << ",\"warps\":" << plan.warps_per_cta
              << ",\"cluster\":" << plan.cluster << ",\"early_units\":" << plan.early_prefetch_units
              << ",\"replay\":" << r << ",\"launches\":" << launches << ",\"kv_bytes\":" << shape.set_bytes
              << ",\"us_call_timeline_off\":" << us_off << ",\"us_call_timeline_on\":" << us_on
              << ",\"main_ctas\":" << mains.size() << ",\"combine_ctas\":" << combs.size()
              << ",\"globaltimer_step_ns\":" << step << ",\"last_call_span_us\":" << span
              << ",\"entry\":" << Spread(entry) << ",\"waited\":" << Spread(waited)
              << ",\"first_data\":" << Spread(first) << ",\"all_done\":" << Spread(done)
              << ",\"written\":" << Spread(written) << ",\"merged\":" << Spread(merged)
              << ",\"combine_entry\":" << Spread(c_entry)
              << ",\"combine_waited\":" << Spread(c_waited) << ",\"combine_written\":" << Spread(c_written)
              << ",\"cta_first_data_after_wait\":" << Spread(first_lat)
              << ",\"cta_units_phase\":" << Spread(units_phase) << ",\"cta_merge\":" << Spread(merge)
              << ",\"cta_merge_weights\":" << Spread(weights)
              << ",\"cta_warp_end_spread\":" << Spread(warp_spread) << ",\"sm_ghz\":" << Spread(ghz)
              << ",\"active_ctas_per_500ns\":[";
            for (size_t k = 0; k < active.size(); ++k) o << (k ? "," : "") << active[k];
            o << "]}";
            json.Emit(o.str());
          }
          CK(cudaGraphExecDestroy(exec));
        }
  CK(tl::SetBuffer(nullptr));
  CK(cudaFree(buf));
  CK(cudaStreamDestroy(st));
  return 0;
}
