// The pinned host tier below a GPU pool (kvcache/cuda/pinned_tier.h), on the GPU (label gpu):
// blocks written down and fetched back byte for byte (whole and partial prefixes, eviction), the
// forward over a suffix with the prefix fetched layer by layer gives the tokens of the whole
// prompt's forward (wherever the top-2 logit margin exceeds the error; the others are named),
// also with the prefix from a disk tier staged through the pinned tier (a damaged entry
// refused), write-back's blocks each under its own key (WriteBlocks), and every pool block,
// event and pinned id slot is returned.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "kvcache/cuda/pinned_tier.h"
#include "kvcache/disk_tier.h"
#include "kvcache/prefix_key.h"
#include "kvcache/tiered_cache.h"
#include "model/backend.h"
#include "model/cuda/cuda_backend.h"

namespace kvstream::kvcache::cuda {
namespace {

#define ASSERT_OK(expr)                                        \
  do {                                                         \
    const ::kvstream::Status st_ = (expr);                     \
    ASSERT_TRUE(st_.ok()) << #expr << ": " << st_.ToString();  \
  } while (0)

std::vector<int32_t> Tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = int32_t(rng() % uint32_t(vocab));
  return t;
}

std::vector<std::byte> BlockBytes(model::KvPool& pool, int layer, int32_t id) {
  std::vector<std::byte> h(pool.layout().block_bytes());
  EXPECT_EQ(cudaMemcpy(h.data(), pool.block_ptr(layer, id), h.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return h;
}

struct Gpu {
  std::unique_ptr<model::ModelBackend> backend;
  std::unique_ptr<model::KvPool> pool;
};

Gpu MakeGpu(int num_blocks, int block_size = 16) {
  model::ModelSpec spec;
  spec.model = "tiny";
  model::BackendOptions o;
  o.kind = "cuda";
  auto b = model::CreateCudaBackend(spec, o);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  if (!b.ok()) return {};
  auto p = (*b)->CreatePool(num_blocks, block_size);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return {std::move(b).value(), p.ok() ? std::move(p).value() : nullptr};
}

void ExpectAllReturned(PinnedHostTier& tier, model::KvPool& pool) {
  tier.Flush();
  const auto s = tier.stats();
  EXPECT_EQ(s.in_flight, 0u);
  EXPECT_EQ(s.ring_used, 0u);
  EXPECT_EQ(s.events_free, s.events_created);  // every event back in the pool
  EXPECT_EQ(pool.allocator().free_count(), pool.num_blocks());
}

TEST(PinnedTierGpu, RefusesAHostPool) {
  auto pool = model::CreateHostPool(model::KvLayout{2, 2, 16, 16, DType::kF16}, 8);
  ASSERT_TRUE(pool.ok());
  PinnedHostTier::Options o;
  o.capacity_bytes = 1 << 20;
  EXPECT_FALSE(PinnedHostTier::Create(pool->get(), o).ok());
}

// Write-back (kvcache/pool_tier.h WriteBlocks): blocks named by their own keys, written alone —
// a middle block and the partial last one first, the copy holding the pool blocks after the
// caller let them go — are fetched from the prefix before them and nothing past a block not
// written; the rest written, the whole prompt comes back byte for byte.
TEST(PinnedTierGpu, WriteBlocksWritesEachBlockUnderItsOwnKey) {
  Gpu g = MakeGpu(32);
  ASSERT_TRUE(g.pool);
  model::KvPool& pool = *g.pool;
  {
    std::vector<uint8_t> noise(pool.memory().size());
    std::mt19937 rng(11);
    for (auto& b : noise) b = uint8_t(rng());
    ASSERT_EQ(cudaMemcpy(pool.base(), noise.data(), noise.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  PinnedHostTier::Options o;
  o.capacity_bytes = 16 * pool.layout().num_layers * pool.layout().block_bytes();
  auto tier = PinnedHostTier::Create(&pool, o);
  ASSERT_TRUE(tier.ok()) << tier.status().ToString();
  const BlockKey root = RootKey(42, pool.layout(), "");
  const std::vector<int32_t> tokens = Tokens(100, 512, 3);  // 6 full blocks and 4 tokens
  const std::vector<BlockKey> keys = ChainKeys(root, tokens, 16);
  auto src = pool.allocator().Allocate(7);
  ASSERT_TRUE(src.ok());
  const int nl = pool.layout().num_layers;
  std::vector<std::vector<std::byte>> want;
  for (int b = 0; b < 7; ++b)
    for (int l = 0; l < nl; ++l) want.push_back(BlockBytes(pool, l, (*src)[b]));
  auto blocks = [&](std::vector<int> which) {
    std::vector<KeyedBlock> out;
    for (int b : which)
      out.push_back({root, keys[size_t(b)], uint32_t(std::min(16, 100 - b * 16)), (*src)[size_t(b)]});
    return out;
  };
  model::BlockLease lease(&pool.allocator(), *src);
  bool written = false;
  (*tier)->WriteBlocks(blocks({2, 6}), [&] { written = true; });
  lease.Reset();  // the copy out holds the blocks
  (*tier)->Flush();
  EXPECT_TRUE(written);
  EXPECT_EQ((*tier)->stats().tier.written_blocks, 2u);
  EXPECT_EQ((*tier)->stats().tier.entries, 2u);
  {
    auto have = pool.allocator().Allocate(2);  // blocks 0-1 "in the pool"
    ASSERT_TRUE(have.ok());
    model::BlockLease got(&pool.allocator(), *have);
    auto p = (*tier)->Fetch(root, tokens, 32, &got, nullptr);
    ASSERT_EQ(p->tokens(), 48);  // block 2, not past block 3 (not written)
    ASSERT_OK(p->WaitAll());
    for (int l = 0; l < nl; ++l) EXPECT_EQ(BlockBytes(pool, l, got.ids()[2]), want[size_t(2) * nl + l]);
  }
  // The source blocks were freed once copied: write the rest from a copy of their bytes.
  auto again = pool.allocator().Allocate(7);
  ASSERT_TRUE(again.ok());
  for (int b = 0; b < 7; ++b)
    for (int l = 0; l < nl; ++l)
      ASSERT_EQ(cudaMemcpy(pool.block_ptr(l, (*again)[b]), want[size_t(b) * nl + l].data(),
                           pool.layout().block_bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  *src = *again;
  {
    model::BlockLease keep(&pool.allocator(), *again);
    (*tier)->WriteBlocks(blocks({0, 1, 3, 4, 5}));
  }
  (*tier)->Flush();
  EXPECT_EQ((*tier)->stats().tier.written_blocks, 7u);
  {
    model::BlockLease got(&pool.allocator(), {});
    auto p = (*tier)->Fetch(root, tokens, 0, &got, nullptr);
    ASSERT_EQ(p->tokens(), 100);
    ASSERT_OK(p->WaitAll());
    for (int b = 0; b < 7; ++b)
      for (int l = 0; l < nl; ++l)
        ASSERT_EQ(BlockBytes(pool, l, got.ids()[b]), want[size_t(b) * nl + l]) << "block " << b;
  }
  ExpectAllReturned(**tier, pool);
}

TEST(PinnedTierGpu, WritesDownAndFetchesBackByteForByte) {
  Gpu g = MakeGpu(64);
  ASSERT_TRUE(g.pool);
  model::KvPool& pool = *g.pool;
  {
    std::vector<uint8_t> noise(pool.memory().size());
    std::mt19937 rng(7);
    for (auto& b : noise) b = uint8_t(rng());
    ASSERT_EQ(cudaMemcpy(pool.base(), noise.data(), noise.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  PinnedHostTier::Options o;
  o.capacity_bytes = 16 * pool.layout().num_layers * pool.layout().block_bytes();  // 16 slots
  auto tier = PinnedHostTier::Create(&pool, o);
  ASSERT_TRUE(tier.ok()) << tier.status().ToString();
  const int events_at_start = (*tier)->stats().events_created;
  const BlockKey root = RootKey(42, pool.layout(), "");
  const std::vector<int32_t> tokens = Tokens(100, 512, 1);  // 6 full blocks and a partial one
  auto src = pool.allocator().Allocate(7);
  ASSERT_TRUE(src.ok());
  {
    model::BlockLease lease(&pool.allocator(), *src);
    (*tier)->WriteDown(root, tokens, lease.ids());
    // The copy-out holds the blocks even once the request lets them go.
  }
  (*tier)->Flush();
  EXPECT_EQ((*tier)->stats().tier.written_blocks, 7u);
  EXPECT_EQ((*tier)->stats().tier.entries, 7u);
  const int nl = pool.layout().num_layers;
  std::vector<std::vector<std::byte>> want;
  for (int b = 0; b < 7; ++b)
    for (int l = 0; l < nl; ++l) want.push_back(BlockBytes(pool, l, (*src)[b]));
  ASSERT_EQ(cudaMemset(pool.base(), 0xff, pool.memory().size()), cudaSuccess);

  for (int rep = 0; rep < 21; ++rep) {  // many requests: no event or id slot made per request
    // Each path in turn (the blocks are one run each side): the copy engines, the gather kernel,
    // the copy engines through the device staging buffer.
    (*tier)->set_engine_max_runs(rep % 3 == 0 ? 4 : 0);
    (*tier)->set_staging(rep % 3 != 1);
    model::BlockLease lease(&pool.allocator(), {});
    auto p = (*tier)->Fetch(root, tokens, 0, &lease, nullptr);
    ASSERT_EQ(p->tokens(), 100);
    ASSERT_OK(p->WaitAll());
    for (int b = 0; b < 7; ++b)
      for (int l = 0; l < nl; ++l)
        ASSERT_EQ(BlockBytes(pool, l, lease.ids()[b]), want[size_t(b) * nl + l]) << "block " << b << " layer " << l;
  }
  EXPECT_GT((*tier)->stats().engine_copies, 0u);
  EXPECT_GT((*tier)->stats().kernel_copies, 0u);
  EXPECT_GT((*tier)->stats().staged_copies, 0u);
  // Scattered destination blocks (every other block free): 7 runs, so staged (the tier's slots
  // are one run), or with staging off the gather kernel.
  (*tier)->set_engine_max_runs(4);
  for (bool staging : {true, false}) {
    (*tier)->set_staging(staging);
    auto ids = pool.allocator().Allocate(14);
    ASSERT_TRUE(ids.ok());
    std::vector<int32_t> odd, even;
    for (int i = 0; i < 14; ++i) (i % 2 ? odd : even).push_back((*ids)[i]);
    model::BlockLease keep(&pool.allocator(), even);
    ASSERT_OK(pool.allocator().Release(odd));
    const uint64_t kernels = (*tier)->stats().kernel_copies;
    const uint64_t staged = (*tier)->stats().staged_copies;
    model::BlockLease lease(&pool.allocator(), {});
    auto p = (*tier)->Fetch(root, tokens, 0, &lease, nullptr);
    ASSERT_EQ(p->tokens(), 100);
    ASSERT_OK(p->WaitAll());
    EXPECT_EQ((*tier)->stats().kernel_copies, kernels + (staging ? 0 : uint64_t(nl)));
    EXPECT_EQ((*tier)->stats().staged_copies, staged + (staging ? uint64_t(nl) : 0));
    for (int b = 0; b < 7; ++b)
      for (int l = 0; l < nl; ++l)
        ASSERT_EQ(BlockBytes(pool, l, lease.ids()[b]), want[size_t(b) * nl + l]) << "block " << b;
    if (staging) {  // and down again from the scattered blocks: pool -> staging -> one slot run
      const BlockKey root2 = RootKey(42, pool.layout(), "scattered");
      const uint64_t before = (*tier)->stats().staged_copies;
      (*tier)->WriteDown(root2, tokens, lease.ids());
      (*tier)->Flush();
      EXPECT_GT((*tier)->stats().staged_copies, before);
      model::BlockLease back(&pool.allocator(), {});
      auto q = (*tier)->Fetch(root2, tokens, 0, &back, nullptr);
      ASSERT_EQ(q->tokens(), 100);
      ASSERT_OK(q->WaitAll());
      for (int b = 0; b < 7; ++b)
        for (int l = 0; l < nl; ++l)
          ASSERT_EQ(BlockBytes(pool, l, back.ids()[b]), want[size_t(b) * nl + l]) << "block " << b;
    }
  }
  // A partial prefix: the first 4 blocks, then other tokens.
  std::vector<int32_t> other = tokens;
  for (int i = 64; i < 100; ++i) other[i] = (other[i] + 1) % 512;
  {
    model::BlockLease lease(&pool.allocator(), {});
    auto p = (*tier)->Fetch(root, other, 0, &lease, nullptr);
    EXPECT_EQ(p->tokens(), 64);
    ASSERT_OK(p->WaitAll());
    for (int l = 0; l < nl; ++l) EXPECT_EQ(BlockBytes(pool, l, lease.ids()[3]), want[size_t(3) * nl + l]);
    // Another root (model, salt) finds nothing.
    model::BlockLease none(&pool.allocator(), {});
    EXPECT_EQ((*tier)->Fetch(RootKey(43, pool.layout(), ""), tokens, 0, &none, nullptr)->tokens(), 0);
  }
  // Eviction under pressure: 30 more blocks into 16 slots.
  {
    auto more = pool.allocator().Allocate(30);
    ASSERT_TRUE(more.ok());
    model::BlockLease lease(&pool.allocator(), *more);
    (*tier)->WriteDown(root, Tokens(30 * 16, 512, 9), lease.ids());
  }
  (*tier)->Flush();
  const auto s = (*tier)->stats();
  EXPECT_LE(s.tier.entries, 16u);
  EXPECT_GT(s.tier.evicted_blocks, 0u);
  EXPECT_EQ(s.events_created, events_at_start);
  ExpectAllReturned(**tier, pool);
  (*tier)->EraseAll();
  EXPECT_EQ((*tier)->stats().tier.entries, 0u);
}

// Greedy steps of `prompt` whole on `base` against its suffix from lc's prefix (fetched by `pf`:
// the first forward waits for it layer by layer) on `g`: logits within the f16 tolerance, tokens
// equal wherever the top-2 margin exceeds it (counted in *compared, the others in *skipped).
void CompareSteps(Gpu& base, Gpu& g, const std::vector<int32_t>& prompt, model::BlockLease& lc,
                  const PoolPrefetch* pf, int p, int* compared, int* skipped) {
  const model::ModelConfig& c = g.backend->config();
  const int bs = g.pool->layout().block_size;
  const int steps = 8;
  const double tol = 1.5e-2;  // f16, of the largest |logit| (tests/model/cuda_backend_test.cc)
  model::ForwardOptions fo;
  fo.want_logits = true;
  model::BlockLease lb(&base.pool->allocator(), {});  // whole prompt, no cache
  ASSERT_OK(lb.GrowToTokens(int(prompt.size()) + steps, bs));
  ASSERT_OK(lc.GrowToTokens(int(prompt.size()) + steps, bs));
  PrefetchHooks hooks(pf, nullptr);
  const int from = pf->tokens();
  std::vector<int32_t> in_b = prompt, in_c(prompt.begin() + from, prompt.end());
  int pos_b = 0, pos_c = from;
  for (int step = 0; step <= steps; ++step) {
    model::SeqInput sb{in_b, pos_b, lb.ids()}, sc{in_c, pos_c, lc.ids()};
    model::ForwardOutput ob, oc;
    ASSERT_OK(base.backend->Forward(*base.pool, std::span(&sb, 1), nullptr, fo, &ob));
    ASSERT_OK(g.backend->Forward(*g.pool, std::span(&sc, 1), step == 0 ? &hooks : nullptr, fo, &oc));
    double max_abs = 0, max_diff = 0;
    for (int j = 0; j < c.vocab_size; ++j) {
      ASSERT_TRUE(std::isfinite(oc.logits[j])) << "prompt " << p << " step " << step;
      max_abs = std::max(max_abs, std::fabs(double(ob.logits[j])));
      max_diff = std::max(max_diff, std::fabs(double(ob.logits[j]) - oc.logits[j]));
    }
    EXPECT_LE(max_diff / std::max(max_abs, 1e-6), tol) << "prompt " << p << " step " << step;
    std::vector<float> top(ob.logits.begin(), ob.logits.end());
    std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<float>());
    const double margin = double(top[0]) - top[1];
    if (margin > tol * max_abs) {
      ++*compared;
      EXPECT_EQ(ob.next_tokens[0], oc.next_tokens[0]) << "prompt " << p << " step " << step
                                                      << ", top-2 margin " << margin;
    } else {
      ++*skipped;
      std::printf("skip prompt %d step %d: top-2 margin %.3g <= tolerance %.3g (tokens %d / %d)\n",
                  p, step, margin, tol * max_abs, ob.next_tokens[0], oc.next_tokens[0]);
    }
    pos_b += int(in_b.size());
    pos_c += int(in_c.size());
    in_b = in_c = {ob.next_tokens[0]};  // both fed the same token
  }
}

// The suffix's forward over a prefix fetched layer by layer against the whole prompt's forward.
TEST(PinnedTierGpu, SuffixOverFetchedPrefixGivesTheTokensOfTheWholePrompt) {
  Gpu base = MakeGpu(128);
  Gpu g = MakeGpu(128);
  ASSERT_TRUE(base.pool && g.pool);
  const model::ModelConfig& c = g.backend->config();
  const int bs = g.pool->layout().block_size;
  PinnedHostTier::Options o;
  o.capacity_bytes = 64 * c.num_layers * g.pool->layout().block_bytes();
  auto tier = PinnedHostTier::Create(g.pool.get(), o);
  ASSERT_TRUE(tier.ok()) << tier.status().ToString();
  const BlockKey root = RootKey(c.hash(), g.pool->layout(), "");
  const std::vector<int32_t> prefix = Tokens(160, c.vocab_size, 3);  // 10 blocks
  model::ForwardOptions fo;
  fo.want_logits = true;
  {  // The prefix computed once and written down.
    model::BlockLease lease(&g.pool->allocator(), {});
    ASSERT_OK(lease.GrowToTokens(int(prefix.size()), bs));
    model::SeqInput seq{prefix, 0, lease.ids()};
    model::ForwardOutput out;
    ASSERT_OK(g.backend->Forward(*g.pool, std::span(&seq, 1), nullptr, fo, &out));
    (*tier)->WriteDown(root, prefix, lease.ids());
  }
  (*tier)->Flush();
  int compared = 0, skipped = 0;
  for (int p = 0; p < 6; ++p) {
    std::vector<int32_t> prompt = prefix;
    const std::vector<int32_t> suffix = Tokens(5 + 13 * p, c.vocab_size, 100 + p);
    prompt.insert(prompt.end(), suffix.begin(), suffix.end());
    // Suffix over the fetched prefix (the pool poisoned with finite garbage first).
    ASSERT_EQ(cudaMemset(g.pool->base(), 0x3c, g.pool->memory().size()), cudaSuccess);
    model::BlockLease lc(&g.pool->allocator(), {});
    (*tier)->set_engine_max_runs(p % 2 ? 0 : 4);  // staged, or the copy engines
    auto pf = (*tier)->Fetch(root, prompt, 0, &lc, nullptr);
    ASSERT_EQ(pf->tokens(), 160);
    CompareSteps(base, g, prompt, lc, pf.get(), p, &compared, &skipped);
  }
  std::printf("tokens compared %d, skipped (margin within tolerance) %d\n", compared, skipped);
  EXPECT_GT(compared, 3 * skipped);
  const auto s = (*tier)->stats();
  EXPECT_EQ(s.tier.hit_blocks, 60u);
  EXPECT_EQ(s.fetched_tokens, 6u * 160);
  ExpectAllReturned(**tier, *g.pool);
}

// A disk tier below the pinned tier (kvcache/tiered_cache.h, staged): the write-down reaches the
// disk from the pinned copy; with the pinned tier emptied the prefix comes up from disk through
// it, layer by layer, and the suffix's tokens are the whole prompt's; a damaged entry ends the
// prefix there (refused, counted) and the tokens are still the whole prompt's.
TEST(PinnedTierGpu, DiskBelowThePinnedTierGivesTheTokensOfTheWholePrompt) {
  Gpu base = MakeGpu(128);
  Gpu g = MakeGpu(128);
  ASSERT_TRUE(base.pool && g.pool);
  const model::ModelConfig& c = g.backend->config();
  const model::KvLayout layout = g.pool->layout();
  PinnedHostTier::Options o;
  o.capacity_bytes = 64 * c.num_layers * layout.block_bytes();
  auto tier = PinnedHostTier::Create(g.pool.get(), o);
  ASSERT_TRUE(tier.ok()) << tier.status().ToString();
  const BlockKey root = RootKey(c.hash(), layout, "");
  const std::string dir = "/tmp/kv_staged_gpu_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  DiskTier::Options d;
  d.dir = dir;
  d.identity = {root, layout};
  d.model_hash = c.hash();
  d.secret = "0123456789abcdef0123456789abcdef";
  d.capacity_bytes = 64 * EncodedBlockBytes(layout);
  auto disk = DiskTier::Open(d);
  ASSERT_TRUE(disk.ok()) << disk.status().ToString();
  DiskTier* dt = disk->get();
  std::vector<std::unique_ptr<KvTier>> tiers;
  tiers.push_back(std::make_unique<BorrowedTier>((*tier)->staging()));
  tiers.push_back(std::move(disk).value());
  FetchPolicy policy;
  policy.threshold_tokens = 0;
  TieredCache tc(g.pool.get(), c.hash(), std::move(tiers), policy, 2, /*staged=*/true);
  const std::vector<int32_t> prefix = Tokens(160, c.vocab_size, 3);  // 10 blocks
  {
    model::BlockLease lease(&g.pool->allocator(), {});
    ASSERT_OK(lease.GrowToTokens(int(prefix.size()), layout.block_size));
    model::SeqInput seq{prefix, 0, lease.ids()};
    model::ForwardOutput out;
    ASSERT_OK(g.backend->Forward(*g.pool, std::span(&seq, 1), nullptr, {}, &out));
    (*tier)->WriteDown(root, prefix, lease.ids(), [&] { tc.WriteStaged(root, prefix); });
  }
  (*tier)->Flush();
  tc.Flush();
  EXPECT_EQ(dt->stats().written_blocks, 10u);
  int compared = 0, skipped = 0;
  for (int p = 0; p < 2; ++p) {
    (*tier)->EraseAll();  // only the disk holds the prefix
    if (p == 1) {  // block 7's payload damaged: blocks 0-6 come up
      std::fstream f(dt->PathOf(ChainKeys(root, prefix, layout.block_size)[7]),
                     std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(kBlockHeaderBytes + 100);
      f.put('\x5a');
    }
    std::vector<int32_t> prompt = prefix;
    const std::vector<int32_t> suffix = Tokens(37, c.vocab_size, 200 + p);
    prompt.insert(prompt.end(), suffix.begin(), suffix.end());
    ASSERT_EQ(cudaMemset(g.pool->base(), 0x3c, g.pool->memory().size()), cudaSuccess);
    model::BlockLease lc(&g.pool->allocator(), {});
    auto pending = tc.Prepare(root, prompt, 0, DeadlineAfterMs(10000));
    auto pf = tc.FillFrom(tier->get(), pending.get(), prompt, 0, &lc, nullptr);
    pending.reset();
    ASSERT_NE(pf, nullptr);
    ASSERT_EQ(pf->tokens(), p == 0 ? 160 : 112);
    CompareSteps(base, g, prompt, lc, pf.get(), p, &compared, &skipped);
  }
  std::printf("tokens compared %d, skipped (margin within tolerance) %d\n", compared, skipped);
  EXPECT_GT(compared, 3 * skipped);
  EXPECT_EQ(dt->stats().read_failures, 1u);
  EXPECT_EQ(dt->stats().hit_blocks, 10u + 9u);  // every read starts at once: 8 and 9 too
  EXPECT_EQ(tc.stats().fetched_tokens, 160u + 112u);
  tc.Stop();
  ExpectAllReturned(**tier, *g.pool);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvstream::kvcache::cuda
