// The paged decode attention's planner on the CPU: what it launches for representative shapes on
// an H200-like device (132 SMs; occupancy answered by a fake). The expected values are the
// choices the launcher made before the planner was split out of paged_attention.cu; a change in
// any of them changes what runs on the GPU.
#include "kernels/paged_attention_plan.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace kvstream::kernels::paged_decode {
namespace {

constexpr int kSms = 132;

// Resident CTAs per SM: 4-warp CTAs 5 / 4 / 2 at head 64 / 128 / 256, one 16-warp CTA. Clusters:
// as many as the device's CTA slots hold, a few fewer at 16 (non-portable size), none when
// `clusters` is false or above `max_cluster`.
class FakeOccupancy : public PlanOccupancy {
 public:
  bool clusters = true;
  int max_cluster = 16;
  mutable std::set<std::tuple<int, int>> ctas_asked;  // (head_dim, warps)
  mutable std::vector<int> clusters_asked;

  int CtasPerSm(DType, int head_dim, int warps) const override {
    ctas_asked.insert({head_dim, warps});
    return PerSm(head_dim, warps);
  }
  int MaxActiveClusters(DType, int head_dim, int warps, int cluster) const override {
    clusters_asked.push_back(cluster);
    if (!clusters || cluster > max_cluster) return 0;
    return kSms * PerSm(head_dim, warps) / cluster - (cluster == 16 ? 3 : 0);
  }

 private:
  static int PerSm(int head_dim, int warps) {
    if (warps == kWideWarps) return 1;
    return head_dim == 64 ? 5 : (head_dim == 128 ? 4 : 2);
  }
};

alignas(16) char fake[64];

// A supported shape: `seqs` sequences of `ctx` tokens, block size 16, a pool of 100000 blocks
// (so that the early prefetch may run).
PagedDecodeParams Shape(int seqs, int heads, int kv_heads, int head_dim, int ctx) {
  PagedDecodeParams p;
  p.out = fake;
  p.q = fake;
  p.kv_layer = fake;
  p.block_tables = reinterpret_cast<const int32_t*>(fake);
  p.context_lens = reinterpret_cast<const int32_t*>(fake);
  p.num_seqs = seqs;
  p.num_heads = heads;
  p.num_kv_heads = kv_heads;
  p.head_dim = head_dim;
  p.block_size = 16;
  p.max_context_len = ctx;
  p.max_blocks_per_seq = (ctx + 15) / 16 + 1;
  p.scale = 0.088f;
  p.num_blocks = 100000;
  return p;
}
PagedDecodeParams Llama3(int seqs, int ctx) { return Shape(seqs, 32, 8, 128, ctx); }   // GQA 4
PagedDecodeParams Qwen25(int seqs, int ctx) { return Shape(seqs, 28, 4, 128, ctx); }   // GQA 7
PagedDecodeParams Mha(int seqs, int ctx) { return Shape(seqs, 32, 32, 128, ctx); }

struct Expect {
  Schedule schedule;   // as described (DescribePlan)
  int splits;
  int cluster;
  int warps;
  int early_units;
  int combine_dims;
  size_t workspace;
};

PagedDecodePlanInfo Describe(const PagedDecodeParams& p, const FakeOccupancy& occ, Plan* plan_out = nullptr) {
  EXPECT_TRUE(PagedDecodeSupported(p));
  const Plan plan = MakePlan(p, kSms, occ);
  if (plan_out != nullptr) *plan_out = plan;
  return DescribePlan(p, plan);
}

void Check(const char* what, const PagedDecodeParams& p, const Expect& e, const FakeOccupancy& occ = {}) {
  SCOPED_TRACE(what);
  const PagedDecodePlanInfo i = Describe(p, occ);
  EXPECT_TRUE(i.supported);
  EXPECT_EQ(i.schedule, e.schedule);
  EXPECT_EQ(i.num_splits, e.splits);
  EXPECT_EQ(i.cluster, e.cluster);
  EXPECT_EQ(i.warps_per_cta, e.warps);
  EXPECT_FALSE(i.in_loop_prefetch);
  EXPECT_EQ(i.early_prefetch_units, e.early_units);
  EXPECT_EQ(i.combine_dims, e.combine_dims);
  EXPECT_EQ(i.workspace_bytes, e.workspace);
}

// Workspace of a split launch through global memory: counters, partial O, partial lse.
size_t Workspace(int seqs, int heads, int head_dim, int splits) {
  auto align = [](size_t v) { return (v + 255) / 256 * 256; };
  const size_t rows = size_t(seqs) * heads * splits;
  return kCounterBytes + align(rows * head_dim * sizeof(float)) + align(rows * sizeof(float));
}

TEST(PagedDecodePlan, AutoPicksTheTableEntryPerShape) {
  // Batch-1 GQA: the 16-warp CTA with the early prefetch from 4k, the 4-warp kernel with it below.
  Check("llama-3-8b B1 16k", Llama3(1, 16384),
        {Schedule::kWideKernel, 16, 1, 16, 1, 32, Workspace(1, 32, 128, 16)});
  Check("llama-3-8b B1 1k", Llama3(1, 1024),
        {Schedule::kKernel, 16, 1, 4, 1, 32, Workspace(1, 32, 128, 16)});
  // GQA batch 2-8: the wide cluster merge where one cluster holds all splits (no workspace).
  Check("qwen2.5-7b B8 4k", Qwen25(8, 4096), {Schedule::kWideCluster, 4, 4, 16, 1, 0, 0});
  Check("llama-3-8b B8 4k", Llama3(8, 4096), {Schedule::kWideCluster, 2, 2, 16, 1, 0, 0});
  Check("llama-3-8b B8 1k (no early prefetch below 4k)", Llama3(8, 1024),
        {Schedule::kWideCluster, 2, 2, 16, 0, 0, 0});
  // MHA at large batch and short context: v2, one split.
  Check("MHA B64 2k", Mha(64, 2048), {Schedule::kV2, 1, 1, 4, 0, 0, 0});
  // No clusters on the device: the wide kernel with a combine of <= 8 splits (one thread per
  // float4).
  FakeOccupancy no_clusters;
  no_clusters.clusters = false;
  Check("qwen2.5-7b B8 4k, no clusters", Qwen25(8, 4096),
        {Schedule::kWideKernel, 4, 1, 16, 1, 4, Workspace(8, 28, 128, 4)}, no_clusters);
  // The early prefetch needs the pool size.
  PagedDecodeParams p = Llama3(8, 4096);
  p.num_blocks = 0;
  Check("llama-3-8b B8 4k, pool size unknown", p, {Schedule::kWideCluster, 2, 2, 16, 0, 0, 0});
}

TEST(PagedDecodePlan, AutoTableClassBoundaries) {
  struct Case {
    bool gqa;
    int seqs, ctx;
    Schedule schedule;
    bool early;
  };
  const Case cases[] = {
      {false, 1, 4095, Schedule::kWideKernel, false},  {false, 1, 4096, Schedule::kWideKernel, true},
      {false, 2, 8191, Schedule::kV2, false},          {false, 8, 8192, Schedule::kWideKernel, false},
      {false, 9, 8192, Schedule::kWideKernel, false},  {false, 32, 4096, Schedule::kV2, false},
      {false, 33, 16383, Schedule::kV2, false},        {false, 33, 16384, Schedule::kWideKernel, false},
      {true, 1, 4095, Schedule::kKernel, true},        {true, 1, 4096, Schedule::kWideKernel, true},
      {true, 2, 1024, Schedule::kWideCluster, false},  {true, 8, 100000, Schedule::kWideCluster, true},
      {true, 9, 1024, Schedule::kWideKernel, false},   {true, 32, 4096, Schedule::kWideKernel, true},
      {true, 32, 8192, Schedule::kWideKernel, false},  {true, 33, 8191, Schedule::kV2, false},
      {true, 33, 8192, Schedule::kWideKernel, false},
  };
  for (const Case& c : cases) {
    const PagedDecodeParams p = c.gqa ? Llama3(c.seqs, c.ctx) : Mha(c.seqs, c.ctx);
    const AutoChoice a = AutoFor(p);
    EXPECT_EQ(a.schedule, c.schedule) << c.gqa << " B" << c.seqs << " ctx " << c.ctx;
    EXPECT_EQ(a.early, c.early) << c.gqa << " B" << c.seqs << " ctx " << c.ctx;
  }
}

TEST(PagedDecodePlan, SplitPlans) {
  // llama-3-8b B1 16k on 4-warp CTAs (8 CTAs per split, 528 slots, 1024 units): v2 fills waves
  // (60 splits asked, 57 of 18 units launched), the PDL schedules take whole rounds per warp.
  EXPECT_EQ(WaveFillSplits(8, 1024, 528), 60);
  EXPECT_EQ(OneWaveSplits(8, 1024, 528, 4), 64);
  EXPECT_EQ(OneWaveSplits(8, 1024, 132, 16), 16);
  EXPECT_EQ(WaveFillSplits(2048, 128, 528), 1);
  PagedDecodeParams p = Llama3(1, 16384);
  p.schedule = Schedule::kV2;
  Plan plan;
  Describe(p, {}, &plan);
  EXPECT_EQ(plan.num_splits, 57);
  EXPECT_EQ(plan.units_per_split, 18);
  EXPECT_FALSE(plan.pdl);
  p.schedule = Schedule::kKernel;
  Describe(p, {}, &plan);
  EXPECT_EQ(plan.num_splits, 64);
  EXPECT_EQ(plan.units_per_split, 16);
  EXPECT_TRUE(plan.pdl);
  EXPECT_FALSE(plan.early);  // an explicit schedule leaves the early prefetch off unless asked
  // More than 8 splits: the 32-dim combine, or 128 dims when asked (head >= 128 only).
  p = Mha(1, 32768);
  p.schedule = Schedule::kV2;
  Check("MHA B1 32k v2", p, {Schedule::kV2, 15, 1, 4, 0, 32, Workspace(1, 32, 128, 15)});
  p.combine_dims = 128;
  Check("MHA B1 32k v2, 128-dim combine", p, {Schedule::kV2, 15, 1, 4, 0, 128, Workspace(1, 32, 128, 15)});
  p = Shape(1, 32, 32, 64, 32768);
  p.schedule = Schedule::kV2;
  p.combine_dims = 128;
  Check("head 64 keeps the 32-dim combine", p, {Schedule::kV2, 19, 1, 4, 0, 32, Workspace(1, 32, 64, 19)});
  // An explicit split count is capped by the units and by kMaxSplits.
  p = Llama3(1, 8192);
  p.num_splits = 500;
  EXPECT_EQ(Describe(p, {}).num_splits, kMaxSplits);
  p = Llama3(1, 100);
  p.num_splits = 500;
  EXPECT_EQ(Describe(p, {}).num_splits, 7);
}

TEST(PagedDecodePlan, UnevenBatchSplitsForTheLongSequence) {
  // 16 x 1000 tokens + one 8000 (MHA): the uneven planner on v2 takes 16 splits; the same batch
  // planned from max_context_len alone takes 7.
  std::vector<int32_t> lens(17, 1000);
  lens[16] = 8000;
  PagedDecodeParams p = Mha(17, 8000);
  Check("even plan", p, {Schedule::kV2, 7, 1, 4, 0, 4, Workspace(17, 32, 128, 7)});
  p.host_context_lens = lens.data();
  EXPECT_TRUE(UnevenBatch(p));
  Check("uneven plan", p, {Schedule::kV2, 16, 1, 4, 0, 32, Workspace(17, 32, 128, 16)});
  // A wide schedule asked for an uneven batch runs its 4-warp counterpart.
  p = Llama3(17, 8000);
  p.host_context_lens = lens.data();
  p.schedule = Schedule::kWideKernel;
  Check("uneven, wide asked", p, {Schedule::kKernel, 18, 1, 4, 0, 32, Workspace(17, 32, 128, 18)});
  // An even batch with host lengths keeps the even plan.
  std::vector<int32_t> even(17, 8000);
  p = Mha(17, 8000);
  p.host_context_lens = even.data();
  EXPECT_FALSE(UnevenBatch(p));
  EXPECT_EQ(Describe(p, {}).num_splits, 7);
}

TEST(PagedDecodePlan, FallbacksToTheKernelCombine) {
  // Head 256 has no 16-warp CTA.
  PagedDecodeParams p = Shape(1, 32, 8, 256, 16384);
  p.schedule = Schedule::kWideKernel;
  Check("head 256, wide kernel", p, {Schedule::kKernel, 32, 1, 4, 0, 32, Workspace(1, 32, 256, 32)});
  p.schedule = Schedule::kWideCluster;
  Check("head 256, wide cluster (32 splits: no cluster)", p,
        {Schedule::kKernel, 32, 1, 4, 0, 32, Workspace(1, 32, 256, 32)});
  // Fused with more (sequence, KV head) pairs than counters: the kernel combine.
  p = Llama3(600, 2048);
  p.schedule = Schedule::kFused;
  p.num_splits = 4;
  Plan plan;
  const PagedDecodePlanInfo i = Describe(p, {}, &plan);
  EXPECT_EQ(plan.schedule, Schedule::kFused);
  EXPECT_FALSE(plan.fused);
  EXPECT_EQ(i.schedule, Schedule::kKernel);
  EXPECT_EQ(i.combine_dims, 4);
  EXPECT_EQ(i.workspace_bytes, Workspace(600, 32, 128, 4));
  // Fused where the counters suffice: no combine kernel, the workspace holds the partials.
  p = Llama3(1, 8192);
  p.schedule = Schedule::kFused;
  Check("fused", p, {Schedule::kFused, 64, 1, 4, 0, 0, Workspace(1, 32, 128, 64)});
  p.schedule = Schedule::kWideFused;
  Check("wide fused", p, {Schedule::kWideFused, 16, 1, 16, 0, 0, Workspace(1, 32, 128, 16)});
  // Clusters: more than 16 splits, or clusters the device cannot hold all at once, or one split.
  p = Llama3(1, 16384);
  p.schedule = Schedule::kCluster;
  Check("cluster, 64 splits", p, {Schedule::kKernel, 64, 1, 4, 0, 32, Workspace(1, 32, 128, 64)});
  p = Llama3(4, 16384);
  p.schedule = Schedule::kCluster;
  Check("cluster of 16, 32 of 30 clusters resident", p,
        {Schedule::kKernel, 16, 1, 4, 0, 32, Workspace(4, 32, 128, 16)});
  p = Llama3(2, 2048);
  p.schedule = Schedule::kWideCluster;
  Check("wide cluster of 8", p, {Schedule::kWideCluster, 8, 8, 16, 0, 0, 0});
  p = Llama3(1, 16);
  p.schedule = Schedule::kWideCluster;
  Check("wide cluster, one split", p, {Schedule::kWideKernel, 1, 1, 16, 0, 0, 0});
}

TEST(PagedDecodePlan, EarlyPrefetchSettings) {
  PagedDecodeParams p = Llama3(2, 8192);
  p.schedule = Schedule::kKernel;
  EXPECT_EQ(Describe(p, {}).early_prefetch_units, 0);
  p.early_prefetch = Prefetch::kOn;
  EXPECT_EQ(Describe(p, {}).early_prefetch_units, kDefaultEarlyUnits);
  p.early_prefetch_units = 3;
  EXPECT_EQ(Describe(p, {}).early_prefetch_units, 3);
  p.schedule = Schedule::kV2;  // no PDL: nothing runs before the previous kernel ends
  EXPECT_EQ(Describe(p, {}).early_prefetch_units, 0);
  p = Llama3(1, 16384);
  p.early_prefetch = Prefetch::kOff;
  EXPECT_EQ(Describe(p, {}).early_prefetch_units, 0);
  // The in-loop prefetch only when asked (kAuto's table is all off).
  p = Llama3(1, 16384);
  EXPECT_FALSE(PagedDecodeAutoPrefetch(p));
  EXPECT_FALSE(Describe(p, {}).in_loop_prefetch);
  p.prefetch = Prefetch::kOn;
  EXPECT_TRUE(Describe(p, {}).in_loop_prefetch);
  EXPECT_TRUE(InLoopPrefetch(p));
}

TEST(PagedDecodePlan, AsksTheDeviceOnlyWhatThePlanUses) {
  FakeOccupancy occ;
  Describe(Llama3(1, 16384), occ);  // kAuto: the wide kernel
  EXPECT_EQ(occ.ctas_asked, (std::set<std::tuple<int, int>>{{128, kWideWarps}}));
  EXPECT_TRUE(occ.clusters_asked.empty());
  FakeOccupancy occ2;
  Describe(Qwen25(8, 4096), occ2);  // kAuto: the wide cluster merge, 4 splits
  EXPECT_EQ(occ2.clusters_asked, std::vector<int>{4});
}

// Without the Hopper paths (an Ampere or Ada GPU, CodePaths::kFallback, KVSTREAM_KERNEL_FALLBACK):
// the same schedules and split plans, no PDL, no early prefetch, no cluster (a cluster schedule
// merges through its kernel-combine counterpart), and the device is never asked about clusters.
TEST(PagedDecodePlan, FallbackPathsKeepTheSplitPlan) {
  struct C {
    const char* what;
    PagedDecodeParams p;
  };
  std::vector<C> cases = {{"llama-3-8b B1 16k", Llama3(1, 16384)}, {"qwen2.5-7b B8 4k", Qwen25(8, 4096)},
                          {"llama-3-8b B8 1k", Llama3(8, 1024)},   {"mha B64 1k", Mha(64, 1024)},
                          {"llama-3-8b B4 8k", Llama3(4, 8192)}};
  for (Schedule sc : {Schedule::kV2, Schedule::kKernel, Schedule::kFused, Schedule::kWideKernel,
                      Schedule::kWideFused, Schedule::kCluster, Schedule::kWideCluster}) {
    C c{"llama-3-8b B2 4k explicit", Llama3(2, 4096)};
    c.p.schedule = sc;
    c.p.early_prefetch = Prefetch::kOn;
    cases.push_back(c);
  }
  for (const C& c : cases) {
    SCOPED_TRACE(std::string(c.what) + " schedule " + std::to_string(int(c.p.schedule)));
    FakeOccupancy occ;
    const Plan hopper = MakePlan(c.p, kSms, occ, true);
    FakeOccupancy occ2;
    const Plan fb = MakePlan(c.p, kSms, occ2, false);
    EXPECT_TRUE(hopper.hopper_paths);
    EXPECT_FALSE(fb.hopper_paths);
    EXPECT_FALSE(fb.pdl);
    EXPECT_FALSE(fb.early);
    EXPECT_EQ(fb.cluster, 1);
    EXPECT_TRUE(occ2.clusters_asked.empty());
    EXPECT_EQ(fb.num_splits, hopper.num_splits);
    EXPECT_EQ(fb.units_per_split, hopper.units_per_split);
    EXPECT_EQ(fb.warps, hopper.warps);
    EXPECT_EQ(fb.fused, hopper.fused);
    EXPECT_EQ(EarlyUnits(c.p, fb), 0);
    const bool cluster_schedule = hopper.schedule == Schedule::kCluster || hopper.schedule == Schedule::kWideCluster;
    if (cluster_schedule) {
      EXPECT_EQ(fb.schedule, hopper.schedule == Schedule::kCluster ? Schedule::kKernel : Schedule::kWideKernel);
    } else {
      EXPECT_EQ(fb.schedule, hopper.schedule);
    }
    const PagedDecodePlanInfo info = DescribePlan(c.p, fb);
    EXPECT_FALSE(info.hopper_paths);
    EXPECT_EQ(info.workspace_bytes, LayoutFor(c.p, fb).total);
  }
  // The field is validated.
  PagedDecodeParams bad = Llama3(1, 1024);
  bad.code_paths = static_cast<CodePaths>(7);
  EXPECT_FALSE(PagedDecodeSupported(bad));
  bad.code_paths = CodePaths::kFallback;
  EXPECT_TRUE(PagedDecodeSupported(bad));
}

TEST(PagedDecodePlan, WorkspaceLayout) {
  PagedDecodeParams p = Llama3(3, 16384);
  Plan plan;
  plan.num_splits = 5;
  const WorkspaceLayout w = LayoutFor(p, plan);
  EXPECT_EQ(w.o_offset, kCounterBytes);
  EXPECT_EQ(w.lse_offset, kCounterBytes + size_t(3) * 32 * 5 * 128 * 4);
  EXPECT_EQ(w.total, w.lse_offset + 2048);  // 480 floats, rounded up to 256 bytes
  plan.cluster = 8;  // merged in shared memory
  EXPECT_EQ(LayoutFor(p, plan).total, 0u);
  plan.cluster = 1;
  plan.num_splits = 1;
  EXPECT_EQ(LayoutFor(p, plan).total, 0u);
}

}  // namespace
}  // namespace kvstream::kernels::paged_decode
