// Integration: the prefill daemon's prefix cache (config prompt_cache_blocks) with real
// kvstream-prefill and kvstream-decode processes (tiny preset, CPU backend, UCX on loopback).
#include <thread>

#include "tests/daemons/disagg_fixture.h"

namespace kvstream::testing {
namespace {

namespace v1 = kvstream::v1;

const std::vector<std::string> kTiny = {"--model=tiny"};

// The prefill's Stats once nothing is in flight and every block not held by the prompt cache
// is free (blocks released by cancelled or failed writes come back asynchronously).
Result<v1::StatsResponse> WaitForPrefillIdle(const std::string& address, Deadline deadline) {
  auto stub = PrefillStub(address);
  std::string last = "no answer";
  while (Clock::now() < deadline) {
    auto st = CallStats(*stub);
    if (st.ok()) {
      const auto& p = st->pool();
      if (st->requests_in_flight() == 0 &&
          p.free_blocks() + p.prompt_cache_blocks() == p.num_blocks())
        return st;
      last = std::to_string(p.free_blocks()) + " free + " + std::to_string(p.prompt_cache_blocks()) +
             " cached of " + std::to_string(p.num_blocks()) + ", " +
             std::to_string(st->requests_in_flight()) + " in flight";
    } else {
      last = st.status().ToString();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  return Timeout("prefill pool: " + last);
}

// The prefill's own figures for the request (they ride on a token's LoadInfo once its call ended).
const v1::LoadInfo* PrefillFigures(const GenerateResult& r) {
  for (const auto& m : r.messages)
    if (m.has_load() && m.load().transfer_us() > 0) return &m.load();
  return nullptr;
}

TEST_F(DisaggTest, RepeatedPromptIsWrittenFromTheCacheWithTheSameTokens) {
  DaemonPair pair;
  pair.common = kTiny;
  pair.common.push_back("--pool_blocks=64");
  pair.prefill = {"--prompt_cache_blocks=32"};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  auto pstub = PrefillStub(prefill_address());
  const auto prompt = MakePrompt(40, 512, 11);  // 39 tokens loaded: 3 blocks of 16
  const auto expected = Colocated(kTiny, prompt, 8);
  ASSERT_EQ(expected.size(), 8u);

  auto first = CallGenerate(*stub_, prompt, 8, v1::LOAD_MODE_PIPELINED, 30000);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(first.tokens, expected);
  const v1::LoadInfo* f = PrefillFigures(first);
  ASSERT_NE(f, nullptr);
  EXPECT_GT(f->prefill_compute_us(), 0);
  auto st = WaitForPrefillIdle(prefill_address(), DeadlineAfterMs(5000));
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->counters().prompt_cache_misses(), 1u);
  EXPECT_EQ(st->counters().prompt_cache_hits(), 0u);
  EXPECT_EQ(st->pool().prompt_cache_blocks(), 3);
  EXPECT_EQ(st->pool().free_blocks(), 64 - 3);

  // Repeats, in both load modes: no forward, every layer written from the kept blocks.
  int hits = 0;
  for (auto mode : {v1::LOAD_MODE_PIPELINED, v1::LOAD_MODE_NON_PIPELINED, v1::LOAD_MODE_PIPELINED}) {
    auto again = CallGenerate(*stub_, prompt, 8, mode, 30000);
    ASSERT_TRUE(again.status.ok()) << again.status.error_message();
    EXPECT_EQ(again.tokens, expected) << "mode " << mode;
    EXPECT_EQ(again.tokens, first.tokens);
    ASSERT_FALSE(again.messages.empty());
    EXPECT_TRUE(again.messages.front().load().loaded_remotely());
    const v1::LoadInfo* a = PrefillFigures(again);
    ASSERT_NE(a, nullptr) << "mode " << mode;
    EXPECT_EQ(a->prefill_compute_us(), 0) << "a cache hit runs no forward";
    EXPECT_EQ(a->kv_bytes(), f->kv_bytes());
    ++hits;
    st = WaitForPrefillIdle(prefill_address(), DeadlineAfterMs(5000));
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    EXPECT_EQ(st->counters().prompt_cache_hits(), uint64_t(hits));
    EXPECT_EQ(st->counters().prompt_cache_misses(), 1u);
    EXPECT_EQ(st->pool().prompt_cache_blocks(), 3);
  }
  // Concurrent repeats share the cached blocks (each write holds its own reference).
  std::vector<GenerateResult> results(6);
  std::vector<std::thread> threads;
  for (int i = 0; i < 6; ++i)
    threads.emplace_back([&, i] {
      auto stub = DecodeStub(decode_address());
      results[i] = CallGenerate(*stub, prompt, 4, v1::LOAD_MODE_PIPELINED, 30000);
    });
  for (auto& t : threads) t.join();
  for (auto& r : results) {
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens, std::vector<int32_t>(expected.begin(), expected.begin() + 4));
  }
  st = WaitForPrefillIdle(prefill_address(), DeadlineAfterMs(5000));
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->counters().prompt_cache_hits(), uint64_t(hits + 6));
  EXPECT_EQ(st->pool().free_blocks(), 64 - 3);
  // A different prompt is a miss and is cached beside the first.
  auto other = MakePrompt(20, 512, 12);
  auto o = CallGenerate(*stub_, other, 4, v1::LOAD_MODE_PIPELINED, 30000);
  ASSERT_TRUE(o.status.ok()) << o.status.error_message();
  EXPECT_EQ(o.tokens, Colocated(kTiny, other, 4));
  st = WaitForPrefillIdle(prefill_address(), DeadlineAfterMs(5000));
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->counters().prompt_cache_misses(), 2u);
  EXPECT_EQ(st->pool().prompt_cache_blocks(), 3 + 2);
  EXPECT_TRUE(WaitForAllBlocksFree(decode_address(), true, DeadlineAfterMs(5000)).ok());

  // Shutdown releases every cached block.
  prefill_->Signal(SIGTERM);
  EXPECT_EQ(prefill_->Wait(DeadlineAfterMs(15000)), 0);
  EXPECT_NE(prefill_->Log().find("64/64 blocks free"), std::string::npos) << prefill_->Log();
}

// A shared system prompt: the second conversation's prefill computes only what follows the
// cached blocks, and the decode still receives (and generates from) the whole prompt's KV.
TEST_F(DisaggTest, SharedPrefixIsTakenFromTheCacheAndOnlyTheRestIsComputed) {
  DaemonPair pair;
  pair.common = kTiny;
  pair.common.push_back("--pool_blocks=64");
  pair.prefill = {"--prompt_cache_blocks=32"};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  const auto system = MakePrompt(32, 512, 51);  // two blocks of 16 at the prefill
  auto with = [&](int n, uint64_t seed) {
    auto p = system;
    auto user = MakePrompt(n, 512, seed);
    p.insert(p.end(), user.begin(), user.end());
    return p;
  };
  auto first = with(9, 52);  // 40 tokens loaded: blocks [0,16) [16,32) and 8 more
  auto r = CallGenerate(*stub_, first, 6, v1::LOAD_MODE_PIPELINED, 30000);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, Colocated(kTiny, first, 6));
  auto st = WaitForPrefillIdle(prefill_address(), DeadlineAfterMs(5000));
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->pool().prompt_cache_blocks(), 3);
  EXPECT_EQ(st->counters().prompt_cache_misses(), 1u);

  int n = 0;
  for (auto mode : {v1::LOAD_MODE_PIPELINED, v1::LOAD_MODE_NON_PIPELINED}) {
    auto next = with(20 + n, 60 + n);
    ++n;
    auto g = CallGenerate(*stub_, next, 6, mode, 30000);
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    EXPECT_EQ(g.tokens, Colocated(kTiny, next, 6)) << "mode " << mode;
    const v1::LoadInfo* f = PrefillFigures(g);
    ASSERT_NE(f, nullptr);
    EXPECT_EQ(f->prefix_cached_tokens(), 32) << "mode " << mode;
    EXPECT_GT(f->prefill_compute_us(), 0) << "the rest of the prompt is computed";
    st = WaitForPrefillIdle(prefill_address(), DeadlineAfterMs(5000));
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    EXPECT_EQ(st->counters().prompt_cache_hits(), uint64_t(n));
    EXPECT_EQ(st->counters().prompt_cache_hit_tokens(), uint64_t(32 * n));
  }
  EXPECT_TRUE(WaitForAllBlocksFree(decode_address(), true, DeadlineAfterMs(5000)).ok());
  prefill_->Signal(SIGTERM);
  EXPECT_EQ(prefill_->Wait(DeadlineAfterMs(15000)), 0);
  EXPECT_NE(prefill_->Log().find("64/64 blocks free"), std::string::npos) << prefill_->Log();
}

// cache_salt (issue 16 item 1: a per-tenant salt folded into the prefix keys' root): a prompt
// reuses only KV cached under the same salt, so one tenant cannot learn by timing whether another
// tenant's prompt is cached; the same salt hits as before. The colocated tokens throughout.
TEST_F(DisaggTest, ACacheSaltSeesOnlyTheKvCachedUnderIt) {
  DaemonPair pair;
  pair.common = kTiny;
  pair.common.push_back("--pool_blocks=64");
  pair.prefill = {"--prompt_cache_blocks=32"};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  const auto prompt = MakePrompt(40, 512, 71);  // 39 tokens at the prefill: 2 blocks and 7
  const auto want = Colocated(kTiny, prompt, 4);
  auto cached = [&](const std::string& salt) {
    v1::GenerateRequest req;
    *req.mutable_prompt_tokens() = {prompt.begin(), prompt.end()};
    req.set_max_tokens(4);
    req.set_load_mode(v1::LOAD_MODE_PIPELINED);
    req.set_cache_salt(salt);
    auto r = CallGenerate(*stub_, req, 30000);
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens, want) << "salt '" << salt << "'";
    const v1::LoadInfo* f = PrefillFigures(r);
    EXPECT_NE(f, nullptr);
    return f != nullptr ? f->prefix_cached_tokens() : -1;
  };
  EXPECT_EQ(cached("tenant-a"), 0);
  EXPECT_EQ(cached("tenant-a"), 39);  // the whole prompt, as without a salt
  EXPECT_EQ(cached("tenant-b"), 0);   // another tenant: nothing of tenant-a's
  EXPECT_EQ(cached(""), 0);           // nor the unsalted
  EXPECT_EQ(cached(""), 39);
  EXPECT_EQ(cached("tenant-b"), 39);
  v1::GenerateRequest too_long;
  too_long.add_prompt_tokens(1);
  too_long.set_max_tokens(1);
  too_long.set_cache_salt(std::string(257, 'x'));
  auto r = CallGenerate(*stub_, too_long, 30000);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// Dynamic NTK (rope_parameters type dynamic, max_position_embeddings 32): a prompt past 32
// tokens is rotated as a whole by its length, so it must not take a prefix cached from a shorter
// prompt (rotated with the default base). Before the fix it did, and its tokens differed from
// the colocated ones.
TEST_F(DisaggTest, DynamicNtkPromptsPastTheLimitDoNotShareCachedKv) {
  const std::string model =
      std::string("--model=") + KVSTREAM_MODEL_GOLDENS + "/llama_dynamic_prompt_past_f16";
  DaemonPair pair;
  pair.common = {model, "--pool_blocks=64"};
  pair.prefill = {"--prompt_cache_blocks=32"};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  const auto shorter = MakePrompt(30, 256, 71);  // within the limit: cached
  auto r = CallGenerate(*stub_, shorter, 4, v1::LOAD_MODE_PIPELINED, 30000);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, Colocated({model}, shorter, 4));
  auto longer = shorter;  // shares its first 29 tokens (a whole block of 16) with `shorter`
  longer.resize(29);
  auto more = MakePrompt(20, 256, 72);
  longer.insert(longer.end(), more.begin(), more.end());
  auto g = CallGenerate(*stub_, longer, 4, v1::LOAD_MODE_PIPELINED, 30000);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.tokens, Colocated({model}, longer, 4));
  const v1::LoadInfo* f = PrefillFigures(g);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->prefix_cached_tokens(), 0);
}

TEST_F(DisaggTest, PromptCacheEvictsLeastRecentlyUsedWithinItsBudgetAndForRoom) {
  DaemonPair pair;
  pair.common = kTiny;
  pair.prefill = {"--pool_blocks=16", "--prompt_cache_blocks=4"};
  pair.decode = {"--pool_blocks=64"};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  const auto a = MakePrompt(40, 512, 21);  // 3 blocks each at the prefill
  const auto b = MakePrompt(41, 512, 22);
  auto run = [&](const std::vector<int32_t>& p, int32_t* cached = nullptr) {
    auto r = CallGenerate(*stub_, p, 4, v1::LOAD_MODE_PIPELINED, 30000);
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens, Colocated(kTiny, p, 4));
    if (cached != nullptr) {
      const v1::LoadInfo* f = PrefillFigures(r);
      EXPECT_NE(f, nullptr);
      *cached = f != nullptr ? f->prefix_cached_tokens() : -1;
    }
    auto st = WaitForPrefillIdle(prefill_address(), DeadlineAfterMs(5000));
    EXPECT_TRUE(st.ok()) << st.status().ToString();
    return st.ok() ? *st : v1::StatsResponse();
  };
  auto st = run(a);
  EXPECT_EQ(st.pool().prompt_cache_blocks(), 3);
  st = run(b);  // 3 + 3 > 4: a's least recently used blocks go, from its end
  EXPECT_LE(st.pool().prompt_cache_blocks(), 4);
  EXPECT_GE(st.counters().prompt_cache_evictions(), 2u);
  int32_t cached = 0;
  st = run(b, &cached);  // b, the most recent, is whole
  EXPECT_EQ(cached, 40);
  EXPECT_EQ(st.counters().prompt_cache_hits(), 1u);
  st = run(a, &cached);  // a lost its end: computed again from what is left of it
  EXPECT_LT(cached, 40);
  EXPECT_LE(st.pool().prompt_cache_blocks(), 4);
  EXPECT_EQ(st.pool().free_blocks(), 16 - st.pool().prompt_cache_blocks());
  // A prompt that needs 14 of the 16 blocks: cached blocks nobody reads give way to it, and the
  // cache then keeps at most its budget of the new prompt's first blocks.
  const auto big = MakePrompt(14 * 16 + 1, 512, 23);
  st = run(big);
  EXPECT_LE(st.pool().prompt_cache_blocks(), 4);
  EXPECT_EQ(st.pool().free_blocks(), 16 - st.pool().prompt_cache_blocks());
  st = run(big, &cached);
  EXPECT_EQ(cached, 16 * st.pool().prompt_cache_blocks());
  EXPECT_EQ(st.counters().requests_failed(), 0u);
}

TEST_F(DisaggTest, CancelledAndKilledCacheHitsReleaseTheirBlocks) {
  DaemonPair pair;
  pair.common = kTiny;
  pair.common.push_back("--pool_blocks=32");
  // Slow writes from the cache too: 300 ms after each of the 2 layers.
  pair.prefill = {"--prompt_cache_blocks=8", "--fault_layer_delay_ms=300"};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  const auto prompt = MakePrompt(40, 512, 31);
  auto warm = CallGenerate(*stub_, prompt, 2, v1::LOAD_MODE_PIPELINED, 30000);
  ASSERT_TRUE(warm.status.ok()) << warm.status.error_message();
  auto st = WaitForPrefillIdle(prefill_address(), DeadlineAfterMs(5000));
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ASSERT_EQ(st->pool().prompt_cache_blocks(), 3);

  // The client's deadline passes while the hit is being written: decode cancels the load.
  auto cut = CallGenerate(*stub_, prompt, 2, v1::LOAD_MODE_PIPELINED, 350);
  EXPECT_FALSE(cut.status.ok());
  st = WaitForPrefillIdle(prefill_address(), DeadlineAfterMs(8000));
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->counters().prompt_cache_hits(), 1u);
  EXPECT_EQ(st->pool().free_blocks(), 32 - 3);
  Status d = WaitForAllBlocksFree(decode_address(), true, DeadlineAfterMs(8000));
  EXPECT_TRUE(d.ok()) << d.ToString();

  // The decode daemon dies while a hit is being written: the prefill's writes fail, its lease
  // goes, the cached blocks stay cached.
  std::thread caller([&] {
    auto stub = DecodeStub(decode_address());
    CallGenerate(*stub, prompt, 2, v1::LOAD_MODE_PIPELINED, 10000);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  decode_->Signal(SIGKILL);
  caller.join();
  st = WaitForPrefillIdle(prefill_address(), DeadlineAfterMs(10000));
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->counters().prompt_cache_hits(), 2u);
  EXPECT_EQ(st->pool().free_blocks(), 32 - 3);
  EXPECT_EQ(st->pool().prompt_cache_blocks(), 3);
  prefill_->Signal(SIGTERM);
  EXPECT_EQ(prefill_->Wait(DeadlineAfterMs(15000)), 0);
  EXPECT_NE(prefill_->Log().find("32/32 blocks free"), std::string::npos) << prefill_->Log();
}

}  // namespace
}  // namespace kvstream::testing
