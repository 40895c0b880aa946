// tier_prefetch --interference: what the pinned host tier's prefetches (kvcache/cuda/
// pinned_tier.h) cost the forwards that run on the same GPU meanwhile. Issue 16's targets:
// prefill throughput while prefetches run >= 0.95 of without; on a decode GPU, p99 step
// latency (inter-token latency) while the tier prefetches <= 1.1x idle.
//
// One process, one pool, one tier, dummy weights (timing only). Each case runs
//   prefill: --prompts distinct prompts of --prompt tokens, one Forward each (first token
//            included, as a prefill returns it), back to back: tokens/s;
//   decode:  a batch of --streams sequences at context --ctx (shuffled blocks, as a serving
//            pool's), --steps Forward calls of one token each (host clock; Forward returns once
//            the tokens are on the host): every step's time;
// either with the tier idle ("idle") or while a background thread keeps it fetching: --bg-prefixes
// distinct prefixes of --prefix tokens held in the tier, each fetched again and again by the
// tier's own Fetch (its lowest-priority copy stream, layer by layer, one event per layer, as a
// request's prefetch) into pool blocks of its own, --bg-depth fetches in flight at all times.
// One loaded case per copy path in --ctas (0: the copy engines, the path of a prefix in one run;
// "staged": through the tier's device staging buffer, the path of scattered pool blocks;
// N: the gather kernel on N thread blocks, the path of scattered blocks). The background
// fetches' achieved rate is measured over each phase (completed fetches x prefix bytes / time).
//
// The cases are interleaved rep by rep, their order rotated each rep (idle first in even reps),
// after one warm-up rep; tokens/s: median of the reps; step times: p50/p99 over every rep's steps.
// Ratios against idle: prefill tokens/s (target >= 0.95), decode p99 (target <= 1.1). Checks: the
// forwards' tokens are the same with and without the fetches (they write other blocks), and at
// the end every pool block and tier event is back (exit 1 otherwise).
//
//   tier_prefetch --interference [--model llama-3-8b] [--layers 0] [--prefix 8192]
//                 [--bg-prefixes 2] [--bg-depth 2] [--ctas 0,16,32,64] [--prompt 2048]
//                 [--prompts 16] [--streams 32] [--ctx 4096] [--steps 200] [--reps 5] [--json FILE]
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kvcache/cuda/pinned_tier.h"
#include "kvcache/prefix_key.h"
#include "model/backend.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "step_setup.h"
#include "tier_bench.h"

namespace kvstream::bench::tier {
namespace {

using kvcache::cuda::PinnedHostTier;

// Keeps the tier fetching prefixes[k] (held in the tier) into leases[k] (pool blocks of its own),
// k round robin, `depth` fetches in flight, from Start until Stop.
class BackgroundFetches {
 public:
  BackgroundFetches(PinnedHostTier* tier, const kvcache::BlockKey& root,
                    const std::vector<std::vector<int32_t>>* prefixes,
                    std::vector<model::BlockLease>* leases, int depth)
      : tier_(tier), root_(root), prefixes_(prefixes), leases_(leases), depth_(depth) {}
  ~BackgroundFetches() { Stop(); }

  // Returns once the first fetch has completed: the copies are flowing.
  void Start() {
    const uint64_t d0 = done_.load();
    stop_ = false;
    thread_ = std::thread([this] { Loop(); });
    while (done_.load() == d0 && !failed_.load())
      std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  // Issues no more, waits for the fetches in flight. False if a fetch ever failed or covered less
  // than its prefix.
  bool Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return !failed_.load();
  }
  uint64_t completed() const { return done_.load(); }

 private:
  void Loop() {
    std::deque<std::unique_ptr<kvcache::PoolPrefetch>> q;
    while (!stop_.load() && !failed_.load()) {
      if (int(q.size()) < depth_) {
        // prefixes >= depth: the previous fetch into this lease has completed and left q.
        const size_t k = next_++ % prefixes_->size();
        auto p = tier_->Fetch(root_, (*prefixes_)[k], 0, &(*leases_)[k], nullptr);
        if (p->tokens() != int((*prefixes_)[k].size())) {
          std::fprintf(stderr, "background fetch covered %d tokens, not %zu\n", p->tokens(),
                       (*prefixes_)[k].size());
          failed_ = true;
        } else {
          q.push_back(std::move(p));
        }
        continue;
      }
      Wait(q);
    }
    while (!q.empty()) Wait(q);
  }
  void Wait(std::deque<std::unique_ptr<kvcache::PoolPrefetch>>& q) {
    const Status s = q.front()->WaitAll();
    if (!s.ok()) {
      std::fprintf(stderr, "background fetch: %s\n", s.ToString().c_str());
      failed_ = true;
    } else {
      done_.fetch_add(1);
    }
    q.pop_front();
  }

  PinnedHostTier* tier_;
  const kvcache::BlockKey root_;
  const std::vector<std::vector<int32_t>>* prefixes_;
  std::vector<model::BlockLease>* leases_;
  const int depth_;
  size_t next_ = 0;
  std::atomic<bool> stop_{false}, failed_{false};
  std::atomic<uint64_t> done_{0};
  std::thread thread_;
};

struct CaseResult {
  std::string name;                                                    // "idle" or the copy path
  int ctas = -1;                                                       // -1: idle
  std::vector<double> prefill_tok_s, prefill_bg_gbps, decode_bg_gbps;  // one per rep
  std::vector<double> step_ms;                                         // every step of every rep
};

std::vector<int32_t> RandomTokens(std::mt19937& rng, int n, int vocab) {
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = int32_t(rng() % uint32_t(vocab));
  return t;
}

// "v0,v1,...": a JSON array's insides.
std::string ByRep(const std::vector<double>& v, int decimals) {
  std::string out;
  char buf[32];
  for (double x : v) {
    std::snprintf(buf, sizeof buf, "%s%.*f", out.empty() ? "" : ",", decimals, x);
    out += buf;
  }
  return out;
}

model::BlockLease Lease(model::KvPool& pool, int blocks) {
  auto ids = pool.allocator().Allocate(blocks);
  CHECK_OK(ids.status());
  return model::BlockLease(&pool.allocator(), std::move(ids.value()));
}

}  // namespace

int RunInterference(const Args& a) {
  const int bs = 16;
  model::ModelSpec spec;
  spec.model = a.model;
  spec.num_layers_override = a.layers;
  spec.max_position_override = std::max({a.prefix, a.prompt, a.ctx + 1}) + 16;
  const int bg_blocks = a.prefix / bs;
  const int prompt_blocks = model::BlocksForTokens(a.prompt, bs);
  const int stream_blocks = model::BlocksForTokens(a.ctx + 1, bs);
  const long pool_blocks = long(a.bg_prefixes) * bg_blocks + long(a.prompts) * prompt_blocks +
                           long(a.streams) * stream_blocks + 8;
  StepSetup setup;
  if (const int rc = setup.Init(spec, 0, pool_blocks, bs)) return rc;
  model::ModelBackend& be = *setup.backend;
  model::KvPool& pool = *setup.pool;
  const model::KvLayout& lay = pool.layout();
  const int vocab = be.config().vocab_size;
  const size_t prefix_bytes = size_t(bg_blocks) * lay.num_layers * lay.block_bytes();
  const double prefix_gb = double(prefix_bytes) / 1e9;

  // The background's blocks first, from the fresh allocator: each prefix's one ascending run.
  std::vector<model::BlockLease> bg_leases;
  bool one_run = true;
  for (int k = 0; k < a.bg_prefixes; ++k) {
    bg_leases.push_back(Lease(pool, bg_blocks));
    const auto& ids = bg_leases.back().ids();
    for (size_t i = 1; i < ids.size(); ++i) one_run = one_run && ids[i] == ids[i - 1] + 1;
  }
  std::vector<model::BlockLease> prompt_leases;
  for (int i = 0; i < a.prompts; ++i) prompt_leases.push_back(Lease(pool, prompt_blocks));
  model::BlockLease decode_lease = Lease(pool, a.streams * stream_blocks);
  std::vector<int32_t> decode_ids = decode_lease.ids();
  std::shuffle(decode_ids.begin(), decode_ids.end(), std::mt19937(7));

  PinnedHostTier::Options to;
  to.capacity_bytes = size_t(a.bg_prefixes) * prefix_bytes + prefix_bytes / 8;
  auto tier_r = PinnedHostTier::Create(&pool, to);
  CHECK_OK(tier_r.status());
  PinnedHostTier& tier = **tier_r;
  std::mt19937 rng(1);
  const kvcache::BlockKey root = kvcache::RootKey(be.config().hash(), lay, "");
  std::vector<std::vector<int32_t>> prefixes;
  for (int k = 0; k < a.bg_prefixes; ++k) {
    // Timing only: the bytes written down are whatever the blocks hold.
    prefixes.push_back(RandomTokens(rng, a.prefix, vocab));
    tier.WriteDown(root, prefixes.back(), bg_leases[k].ids());
    tier.Flush();
  }
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < a.prompts; ++i) prompts.push_back(RandomTokens(rng, a.prompt, vocab));
  std::vector<int32_t> step_tokens(a.streams, 1);
  std::vector<model::SeqInput> batch;
  for (int s = 0; s < a.streams; ++s)
    batch.push_back(model::SeqInput{
        std::span<const int32_t>(&step_tokens[s], 1), a.ctx,
        std::span<const int32_t>(decode_ids).subspan(size_t(s) * stream_blocks, stream_blocks)});

  std::vector<CaseResult> cases(1);
  cases[0].name = "idle";
  for (int c : a.ctas) {
    cases.emplace_back();
    cases.back().name = CopyName(c);
    cases.back().ctas = c;
  }
  BackgroundFetches bg(&tier, root, &prefixes, &bg_leases, a.bg_depth);
  model::ForwardOptions fo;  // the first token / the next token: LM head and argmax included
  model::ForwardOutput out;
  std::vector<int32_t> prefill_ref, decode_ref;  // the first run's tokens
  bool tokens_equal = true, bg_ok = true;

  auto run_case = [&](CaseResult& r, bool record) {
    if (r.ctas >= 0) {
      UseCopyPath(tier, r.ctas);
      const auto b0 = Clock::now();
      bg.Start();
      std::fprintf(stderr, "  %-8s background started in %.1f ms\n", r.name.c_str(),
                   Ms(b0, Clock::now()));
    }
    uint64_t d0 = bg.completed();
    auto t0 = Clock::now();
    std::vector<int32_t> firsts;
    for (int i = 0; i < a.prompts; ++i) {
      model::SeqInput seq{prompts[i], 0, prompt_leases[i].ids()};
      CHECK_OK(be.Forward(pool, std::span(&seq, 1), nullptr, fo, &out));
      firsts.push_back(out.next_tokens[0]);
    }
    double sec = Ms(t0, Clock::now()) / 1e3;
    std::fprintf(stderr, "  %-8s prefill %.2f s", r.name.c_str(), sec);  // progress (stderr)
    if (record) {
      r.prefill_tok_s.push_back(double(a.prompts) * a.prompt / sec);
      r.prefill_bg_gbps.push_back(double(bg.completed() - d0) * prefix_gb / sec);
    }
    if (prefill_ref.empty()) prefill_ref = firsts;
    tokens_equal = tokens_equal && firsts == prefill_ref;

    d0 = bg.completed();
    const auto s0 = Clock::now();
    for (int s = 0; s < a.steps; ++s) {
      t0 = Clock::now();
      CHECK_OK(be.Forward(pool, batch, nullptr, fo, &out));
      if (record) r.step_ms.push_back(Ms(t0, Clock::now()));
    }
    sec = Ms(s0, Clock::now()) / 1e3;
    std::fprintf(stderr, ", decode %.2f s, %llu background fetches done\n", sec,
                 (unsigned long long)bg.completed());
    if (record) r.decode_bg_gbps.push_back(double(bg.completed() - d0) * prefix_gb / sec);
    if (decode_ref.empty()) decode_ref = out.next_tokens;
    tokens_equal = tokens_equal && out.next_tokens == decode_ref;
    if (r.ctas >= 0) bg_ok = bg.Stop() && bg_ok;
  };
  const int n = int(cases.size());
  std::fprintf(stderr, "tier_prefetch --interference: setup done (%d pool blocks)\n",
               pool.num_blocks());
  for (int rep = -1; rep < a.reps && bg_ok; ++rep) {  // rep -1: warm-up, not recorded
    std::fprintf(stderr, "rep %d%s\n", rep, rep < 0 ? " (warm-up)" : "");
    for (int i = 0; i < n && bg_ok; ++i) run_case(cases[(i + std::max(rep, 0)) % n], rep >= 0);
  }
  if (!bg_ok) {
    std::fprintf(stderr, "tier_prefetch --interference: the background fetches failed\n");
    return 1;
  }

  const CaseResult& idle = cases[0];
  const double idle_tok_s = Median(idle.prefill_tok_s), idle_p99 = Percentile(idle.step_ms, 0.99);
  std::printf(
      "tier_prefetch --interference: %s (%d layers), %d reps after a warm-up, cases interleaved "
      "(order rotated each rep)\n",
      a.model.c_str(), lay.num_layers, a.reps);
  std::printf(
      "background: %d prefixes of %d tokens (%.3f GB each) in the pinned tier, %d fetches in "
      "flight, into pool blocks of their own (%s)\n",
      a.bg_prefixes, a.prefix, prefix_gb, a.bg_depth,
      one_run ? "one run each" : "NOT one run each: the engine path may not apply");
  std::printf(
      "prefill: %d prompts of %d tokens back to back (tokens/s: median of reps); decode: %d "
      "streams at context %d, %d steps per rep (p50/p99 over %zu steps)\n",
      a.prompts, a.prompt, a.streams, a.ctx, a.steps, idle.step_ms.size());
  std::printf("%-10s | %11s %11s %8s | %9s %9s %9s %9s %8s | %s\n", "case", "prefill", "bg GB/s",
              "vs idle", "decode", "p99 ms", "max ms", "bg GB/s", "p99/idle", "targets");
  std::printf("%-10s | %11s %11s %8s | %9s %9s %9s %9s %8s | %s\n", "", "tok/s", "", "", "p50 ms",
              "", "", "", "", "(>=0.95, <=1.1)");
  FILE* j = a.json.empty() ? nullptr : std::fopen(a.json.c_str(), "w");
  for (const CaseResult& r : cases) {
    const double tok_s = Median(r.prefill_tok_s), pg = Median(r.prefill_bg_gbps);
    const double p50 = Percentile(r.step_ms, 0.5), p99 = Percentile(r.step_ms, 0.99);
    const double mx = Percentile(r.step_ms, 1.0), dg = Median(r.decode_bg_gbps);
    const double pr = tok_s / idle_tok_s, dr = p99 / idle_p99;
    std::vector<double> rep_p99;  // each rep's steps alone
    for (size_t k = 0; k + a.steps <= r.step_ms.size(); k += a.steps)
      rep_p99.push_back(Percentile(
          std::vector<double>(r.step_ms.begin() + k, r.step_ms.begin() + k + a.steps), 0.99));
    std::string met = "-";
    if (r.ctas >= 0)
      met = std::string(pr >= 0.95 ? "prefill met" : "prefill NOT met") + ", " +
            (dr <= 1.1 ? "decode met" : "decode NOT met");
    std::printf("%-10s | %11.0f %11.1f %8.3f | %9.3f %9.3f %9.3f %9.1f %8.3f | %s\n",
                r.name.c_str(), tok_s, pg, pr, p50, p99, mx, dg, dr, met.c_str());
    if (j)
      std::fprintf(
          j,
          "{\"bench\":\"tier_prefetch\",\"mode\":\"interference\",\"model\":\"%s\",\"layers\":%d,"
          "\"case\":\"%s\",\"bg_prefix\":%d,\"bg_prefixes\":%d,\"bg_depth\":%d,\"prefix_gb\":%.4f,"
          "\"prompt\":%d,\"prompts\":%d,\"prefill_tok_s\":%.1f,\"prefill_vs_idle\":%.4f,"
          "\"prefill_bg_gbps\":%.2f,\"streams\":%d,\"ctx\":%d,\"steps\":%d,\"decode_p50_ms\":%.4f,"
          "\"decode_p99_ms\":%.4f,\"decode_max_ms\":%.4f,\"decode_p99_vs_idle\":%.4f,"
          "\"decode_bg_gbps\":%.2f,\"reps\":%d,\"prefill_tok_s_by_rep\":[%s],"
          "\"decode_p99_ms_by_rep\":[%s]}\n",
          a.model.c_str(), lay.num_layers, r.name.c_str(), a.prefix, a.bg_prefixes, a.bg_depth,
          prefix_gb, a.prompt, a.prompts, tok_s, pr, pg, a.streams, a.ctx, a.steps, p50, p99, mx,
          dr, dg, a.reps, ByRep(r.prefill_tok_s, 1).c_str(), ByRep(rep_p99, 4).c_str());
  }
  if (j) std::fclose(j);

  bg_leases.clear();
  prompt_leases.clear();
  decode_lease.Reset();
  tier.Flush();
  const auto st = tier.stats();
  const bool all_back =
      pool.allocator().free_count() == pool.num_blocks() && st.events_free == st.events_created;
  std::printf(
      "tokens equal with and without the fetches: %s; every block and event back: %s (events "
      "made %d, %d free; blocks free %d of %d); layer copies by engine %llu, by kernel %llu, staged %llu\n",
      tokens_equal ? "yes" : "NO", all_back ? "yes" : "NO", st.events_created, st.events_free,
      pool.allocator().free_count(), pool.num_blocks(), (unsigned long long)st.engine_copies,
      (unsigned long long)st.kernel_copies, (unsigned long long)st.staged_copies);
  return all_back ? 0 : 1;
}

}  // namespace kvstream::bench::tier
