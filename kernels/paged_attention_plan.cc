// The paged decode attention's planner (see paged_attention_plan.h). docs/kernels.md records the
// measurements behind each rule and table entry.
#include "kernels/paged_attention_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace kvstream::kernels {
namespace paged_decode {
namespace {

int UnitsFor(int tokens) { return std::max(1, (tokens + kUnitTokens - 1) / kUnitTokens); }

bool ScheduleWide(Schedule s) {
  return s == Schedule::kWideKernel || s == Schedule::kWideFused || s == Schedule::kWideCluster;
}
bool ScheduleFused(Schedule s) { return s == Schedule::kFused || s == Schedule::kWideFused; }
bool ScheduleCluster(Schedule s) { return s == Schedule::kCluster || s == Schedule::kWideCluster; }
// The 4-warp / 16-warp counterpart a schedule falls back to.
Schedule KernelCombineOf(Schedule s) { return ScheduleWide(s) ? Schedule::kWideKernel : Schedule::kKernel; }

// The cluster schedules' cluster size: the smallest power of two >= the split count (at most
// 16) if the device holds every cluster of the launch at once where the plan fits one wave (else
// at least one cluster); 1 = no cluster (the schedule falls back to its kernel-combine
// counterpart). A head's splits never span several clusters (no cross-cluster merge).
int ClusterSizeFor(const PagedDecodeParams& p, const Plan& plan, long base, long slots,
                   const PlanOccupancy& occupancy) {
  int cs = 2;
  while (cs < plan.num_splits) cs *= 2;
  if (cs > 16) return 1;
  const long ctas = base * cs;
  const int active = occupancy.MaxActiveClusters(p.dtype, p.head_dim, plan.warps, cs);
  if (active <= 0 || (ctas <= slots && long(active) * cs < ctas)) return 1;
  return cs;
}

// kAuto's choice by (MHA | GQA) x batch class x context class: the schedule and early-prefetch
// setting that measured fastest on an H200 against v2 and the other variants in the same process
// (filled by bench/auto_table.py; docs/kernels.md, "kAuto's table", has the ratios). Uneven
// batches keep v2.
// Classes: batch 1 | 2-8 | 9-32 | > 32; context < 4096 | < 8192 | < 16384 | longer.
constexpr AutoChoice kV2Choice{Schedule::kV2, false};
constexpr AutoChoice kWide{Schedule::kWideKernel, false};
constexpr AutoChoice kWideEarly{Schedule::kWideKernel, true};
constexpr AutoChoice kKernelEarly{Schedule::kKernel, true};
constexpr AutoChoice kWideCl{Schedule::kWideCluster, false};
constexpr AutoChoice kWideClEarly{Schedule::kWideCluster, true};
constexpr AutoChoice kAutoTable[2][4][4] = {
    // MHA
    {{kWide, kWideEarly, kWideEarly, kWideEarly},
     {kV2Choice, kV2Choice, kWide, kWide},
     {kV2Choice, kV2Choice, kWide, kWide},
     {kV2Choice, kV2Choice, kV2Choice, kWide}},
    // GQA (batch 2-8: the wide cluster merge, which falls back to the wide kernel where a cluster
    // cannot hold all splits)
    {{kKernelEarly, kWideEarly, kWideEarly, kWideEarly},
     {kWideCl, kWideClEarly, kWideClEarly, kWideClEarly},
     {kWide, kWideEarly, kWide, kWide},
     {kV2Choice, kV2Choice, kWide, kWide}},
};

bool AutoEarlyPrefetch(const PagedDecodeParams& p) {
  return p.schedule == Schedule::kAuto && !UnevenBatch(p) && AutoFor(p).early;
}

size_t AlignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

}  // namespace

bool UnevenBatch(const PagedDecodeParams& p) {
  if (p.host_context_lens == nullptr || p.num_seqs <= 1 || p.num_seqs > 1024) return false;
  long sum = 0;
  int mx = 0;
  for (int i = 0; i < p.num_seqs; ++i) {
    const int l = std::clamp(p.host_context_lens[i], 0, p.max_context_len);
    sum += l;
    mx = std::max(mx, l);
  }
  return sum > 0 && 2 * long(mx) * p.num_seqs > 3 * sum;
}

// A batch whose longest context is far above the mean: the wave-filling plan, made for
// max_context_len as if every sequence were that long, gives the long sequences a few CTAs that
// each run many times longer than everyone else's. Choose instead the split count that
// minimises an estimate of the kernel's time: waves of real CTAs x (units per CTA + a CTA's
// fixed cost), plus the CTAs that find their sequence already covered and exit at once. Costs
// are in units (the time a CTA spends on one unit).
int UnevenBatchSplits(const PagedDecodeParams& p, int units, long ctas_per_seq_split, long slots,
                      int even_plan) {
  constexpr double kCtaCost = 5.0, kEmptyCtaCost = 1.0;
  auto units_of = [&](int i) {
    return (std::clamp(p.host_context_lens[i], 0, p.max_context_len) + kUnitTokens - 1) / kUnitTokens;
  };
  long sum_units = 0;
  int max_units = 0;
  for (int i = 0; i < p.num_seqs; ++i) {
    const int u = units_of(i);
    sum_units += u;
    max_units = std::max(max_units, u);
  }
  if (sum_units == 0 || 2 * long(max_units) * p.num_seqs <= 3 * sum_units) return even_plan;
  const int max_splits = std::clamp(units / kMinUnitsPerSplit, 1, kMaxSplits);
  int best = even_plan;
  double best_cost = 1e300;
  // Candidates grow geometrically (35 of them up to 128 splits): this runs on the host at
  // every launch, O(candidates x num_seqs).
  for (int s = 1; s <= max_splits; s = std::max(s + 1, s * 9 / 8)) {
    const int ups = (units + s - 1) / s;
    long real = 0;
    for (int i = 0; i < p.num_seqs; ++i) real += std::max(1, (units_of(i) + ups - 1) / ups);
    const int launched_splits = (units + ups - 1) / ups;
    const long empty = (long(launched_splits) * p.num_seqs - real) * ctas_per_seq_split;
    real *= ctas_per_seq_split;
    const long waves = (real + slots - 1) / slots;
    const double cost = double(waves) * (ups + kCtaCost) + kEmptyCtaCost * double(empty) / slots;
    if (cost < best_cost - 1e-9) {
      best_cost = cost;
      best = s;
    }
  }
  return best;
}

// kV2's plan: fill whole waves of resident CTAs - the smallest split count whose last wave is
// >= 90% full, with at least kMinUnitsPerSplit units (one per warp) per split.
int WaveFillSplits(long base, int units, long slots) {
  const int max_splits = std::clamp(units / kMinUnitsPerSplit, 1, kMaxSplits);
  int splits = 1;
  double best_eff = -1.0;
  for (int s = 1; s <= max_splits; ++s) {
    const long ctas = base * s;
    const long waves = (ctas + slots - 1) / slots;
    const double eff = double(ctas) / double(waves * slots);
    if (eff >= 0.9) return s;
    if (eff > best_eff + 1e-9) {
      best_eff = eff;
      splits = s;
    }
  }
  return splits;
}

// The PDL schedules' plan where one wave of CTAs holds every split (base < slots): the fewest
// loads-then-compute rounds per warp (units per split rounded up to whole rounds of `warps`
// units) among the split counts whose CTAs fit one wave, then the fewest splits (so that no
// warp's last round is half empty; docs/kernels.md has an example).
int OneWaveSplits(long base, int units, long slots, int warps) {
  const int max_splits = std::clamp(units / warps, 1, kMaxSplits);
  int best = 1;
  long best_rounds = (units + warps - 1) / warps;
  for (int s = 2; s <= max_splits; ++s) {
    const int ups = ((units + s - 1) / s + warps - 1) / warps * warps;
    const int ns = (units + ups - 1) / ups;
    if (base * ns > slots) break;
    const long rounds = ups / warps;
    if (rounds < best_rounds) {
      best_rounds = rounds;
      best = ns;
    }
  }
  return best;
}

AutoChoice AutoFor(const PagedDecodeParams& p) {
  const bool gqa = p.num_kv_heads > 0 && p.num_heads != p.num_kv_heads;
  const int bcls = p.num_seqs <= 1 ? 0 : (p.num_seqs <= 8 ? 1 : (p.num_seqs <= 32 ? 2 : 3));
  const int ccls = p.max_context_len < 4096   ? 0
                   : p.max_context_len < 8192  ? 1
                   : p.max_context_len < 16384 ? 2
                                               : 3;
  return kAutoTable[gqa ? 1 : 0][bcls][ccls];
}

Plan MakePlan(const PagedDecodeParams& p, int sm_count, const PlanOccupancy& occupancy,
              bool hopper_paths) {
  Plan plan;
  plan.hopper_paths = hopper_paths;
  Schedule sched = p.schedule != Schedule::kAuto ? p.schedule
                   : UnevenBatch(p)                ? Schedule::kV2
                                                   : AutoFor(p).schedule;
  // Uneven batches keep the 4-warp kernel (their planner's costs are made for it); the 16-warp
  // CTA needs head <= 128 (registers).
  if (ScheduleWide(sched) && (p.head_dim > 128 || UnevenBatch(p)))
    sched = sched == Schedule::kWideFused     ? Schedule::kFused
            : sched == Schedule::kWideCluster ? Schedule::kCluster
                                              : Schedule::kKernel;
  plan.schedule = sched;
  plan.warps = ScheduleWide(sched) ? kWideWarps : kWarps;
  plan.pdl = hopper_paths && sched != Schedule::kV2;
  const int ctas_per_sm = occupancy.CtasPerSm(p.dtype, p.head_dim, plan.warps);
  const int group = p.num_heads / p.num_kv_heads;
  plan.head_chunks = (group + kHeadsPerCta - 1) / kHeadsPerCta;
  const int units = UnitsFor(p.max_context_len);
  const long base = long(p.num_seqs) * p.num_kv_heads * plan.head_chunks;
  const long slots = long(std::max(sm_count, 1)) * ctas_per_sm;
  int splits = 1;
  if (p.num_splits > 0) {
    splits = std::min({p.num_splits, units, kMaxSplits});
  } else if (sched != Schedule::kV2 && base < slots) {
    splits = OneWaveSplits(base, units, slots, plan.warps);
  } else {
    splits = WaveFillSplits(base, units, slots);
  }
  if (p.num_splits <= 0 && !ScheduleWide(sched) && UnevenBatch(p)) {
    splits = UnevenBatchSplits(p, units, base / p.num_seqs, slots, splits);
  }
  plan.units_per_split = (units + splits - 1) / splits;
  plan.num_splits = (units + plan.units_per_split - 1) / plan.units_per_split;
  plan.fused = plan.num_splits > 1 && ScheduleFused(sched) &&
               long(p.num_seqs) * p.num_kv_heads * plan.head_chunks <= kMaxFusedCounters;
  if (ScheduleCluster(sched)) {
    plan.cluster = plan.num_splits > 1 && hopper_paths ? ClusterSizeFor(p, plan, base, slots, occupancy) : 1;
    if (plan.cluster == 1) plan.schedule = KernelCombineOf(sched);
  }
  plan.combine_dims = p.combine_dims == 128 && p.head_dim >= 128 ? 128 : 32;
  plan.early = plan.pdl && p.num_blocks > 0 &&
               (p.early_prefetch == Prefetch::kOn ||
                (p.early_prefetch == Prefetch::kAuto && AutoEarlyPrefetch(p)));
  return plan;
}

int EarlyUnits(const PagedDecodeParams& p, const Plan& plan) {
  return plan.early ? (p.early_prefetch_units > 0 ? p.early_prefetch_units : kDefaultEarlyUnits) : 0;
}

WorkspaceLayout LayoutFor(const PagedDecodeParams& p, const Plan& plan) {
  WorkspaceLayout w;
  if (plan.num_splits <= 1 || plan.cluster > 1) return w;  // (clusters merge in shared memory)
  const size_t rows = size_t(p.num_seqs) * p.num_heads * plan.num_splits;
  w.o_offset = kCounterBytes;
  w.lse_offset = w.o_offset + AlignUp(rows * p.head_dim * sizeof(float), 256);
  w.total = w.lse_offset + AlignUp(rows * sizeof(float), 256);
  return w;
}

bool InLoopPrefetch(const PagedDecodeParams& p) {
  return p.prefetch == Prefetch::kOn || (p.prefetch == Prefetch::kAuto && PagedDecodeAutoPrefetch(p));
}

PagedDecodePlanInfo DescribePlan(const PagedDecodeParams& p, const Plan& plan) {
  PagedDecodePlanInfo info;
  info.supported = true;
  info.schedule = plan.num_splits > 1 && ScheduleFused(plan.schedule) && !plan.fused
                      ? (plan.schedule == Schedule::kWideFused ? Schedule::kWideKernel : Schedule::kKernel)
                      : plan.schedule;
  info.num_splits = plan.num_splits;
  info.cluster = plan.cluster;
  info.warps_per_cta = plan.warps;
  info.in_loop_prefetch = InLoopPrefetch(p);
  info.early_prefetch_units = EarlyUnits(p, plan);
  info.workspace_bytes = LayoutFor(p, plan).total;
  info.hopper_paths = plan.hopper_paths;
  if (plan.num_splits > 1 && !plan.fused && plan.cluster <= 1)
    info.combine_dims = plan.num_splits <= kFewSplits ? 4 : plan.combine_dims;
  return info;
}

}  // namespace paged_decode

bool PagedDecodeSupported(const PagedDecodeParams& p) {
  using paged_decode::kHeadsPerCta;
  if (p.dtype != DType::kF16 && p.dtype != DType::kBF16) return false;
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256) return false;
  if (p.block_size != 16 && p.block_size != 32) return false;
  if (p.num_seqs < 0 || p.num_seqs > 65535) return false;
  if (p.num_heads <= 0 || p.num_kv_heads <= 0 || p.num_heads % p.num_kv_heads != 0) return false;
  const int group = p.num_heads / p.num_kv_heads;
  if (long(p.num_kv_heads) * ((group + kHeadsPerCta - 1) / kHeadsPerCta) > 65535) return false;
  if (p.max_blocks_per_seq <= 0) return false;
  if (p.max_context_len < 0 || long(p.max_context_len) > long(p.max_blocks_per_seq) * p.block_size)
    return false;
  if (!std::isfinite(p.scale)) return false;
  if (p.num_splits < 0 || p.prefetch_distance < 0 || p.prefetch_distance > 16) return false;
  if (p.prefetch != Prefetch::kAuto && p.prefetch != Prefetch::kOff && p.prefetch != Prefetch::kOn)
    return false;
  if (int(p.schedule) < int(Schedule::kAuto) || int(p.schedule) > int(Schedule::kWideCluster))
    return false;
  if (p.early_prefetch != Prefetch::kAuto && p.early_prefetch != Prefetch::kOff &&
      p.early_prefetch != Prefetch::kOn)
    return false;
  if (p.num_blocks < 0 || p.early_prefetch_units < 0 || p.early_prefetch_units > 4) return false;
  if (p.combine_dims != 0 && p.combine_dims != 32 && p.combine_dims != 128) return false;
  if (p.code_paths != CodePaths::kAuto && p.code_paths != CodePaths::kFallback) return false;
  if (p.num_seqs > 0 && (!p.out || !p.q || !p.kv_layer || !p.block_tables || !p.context_lens))
    return false;
  // 16-byte vector access to q, out and KV tiles.
  auto aligned = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; };
  if (!aligned(p.q) || !aligned(p.kv_layer) || !aligned(p.out)) return false;
  return true;
}

bool PagedDecodeAutoPrefetch(const PagedDecodeParams& p) {
  // Every entry is "off": the in-loop prefetch was slower at every measured shape (docs/kernels.md,
  // "What was measured in v2"). Columns: batch 1 | 2-8 | 9-32 | > 32; rows: context < 4096 |
  // < 16384 | longer.
  static constexpr bool kTable[2][3][4] = {
      {{false, false, false, false}, {false, false, false, false}, {false, false, false, false}},  // MHA
      {{false, false, false, false}, {false, false, false, false}, {false, false, false, false}},  // GQA
  };
  const bool gqa = p.num_kv_heads > 0 && p.num_heads != p.num_kv_heads;
  const int bcls = p.num_seqs <= 1 ? 0 : (p.num_seqs <= 8 ? 1 : (p.num_seqs <= 32 ? 2 : 3));
  const int ccls = p.max_context_len < 4096 ? 0 : (p.max_context_len < 16384 ? 1 : 2);
  return kTable[gqa ? 1 : 0][ccls][bcls];
}

}  // namespace kvstream::kernels
