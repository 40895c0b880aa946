// Integration: the shared KV tier (L4, docs/kv_store.md) in real daemons: prefills sharing one
// real redis-server (unix socket, requirepass) through --kv_store_*. A prefill that starts with
// nothing local gets the prefix another prefill computed, with the colocated model's tokens; a
// redis-server killed mid-run turns reads into misses (computed, same tokens, by the deadline)
// and a restarted one serves again. The decode's write-down of a finished conversation, written
// once, and its counters on /metrics.
#include <chrono>

#include "tests/daemons/kv_tiers_fixture.h"
#include "tests/daemons/metrics_probe.h"
#include "tests/kvcache/redis_server.h"

namespace kvstream::testing {
namespace {

using kvcache::testing::RedisServer;

class KvStoreTest : public KvTiersTest {
 protected:
  DaemonPair Pair(const RedisServer& redis) {
    DaemonPair pair;
    pair.common = kTiny;
    pair.common.push_back("--pool_blocks=32");
    pair.prefill = {"--kv_tier_secret_file=" + SecretFile("kv.secret", std::string(32, 's')),
                    "--kv_store_redis=unix:" + redis.socket(),
                    "--kv_store_auth_file=" + redis.AuthFile(redis.password()),
                    "--kv_store_timeout_ms=200", "--kv_prefetch_threshold_tokens=0"};
    return pair;
  }
  // Waits until the prefill's store tier has written `blocks` blocks.
  void WaitForStoreWrites(uint64_t blocks) {
    const Deadline deadline = DeadlineAfterMs(10000);
    uint64_t written = 0;
    while (Clock::now() < deadline) {
      auto st = WaitForPrefillIdle(prefill_address(), DeadlineAfterMs(5000));
      ASSERT_TRUE(st.ok()) << st.status().ToString();
      const v1::KvTierStats* store = Tier(*st, "store");
      ASSERT_NE(store, nullptr);
      written = store->written_blocks();
      if (written >= blocks) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
    }
    FAIL() << "store tier: " << written << " of " << blocks << " blocks written";
  }
};

TEST_F(KvStoreTest, ASecondPrefillGetsThePrefixTheFirstComputed) {
  RedisServer redis;
  const DaemonPair pair = Pair(redis);
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  const auto prompt = MakePrompt(40, 512, 91);  // 39 tokens at the prefill: 2 blocks and 7
  int32_t cached = -1;
  bool computed = false;
  ASSERT_NO_FATAL_FAILURE(Run(kTiny, prompt, &cached, &computed));
  EXPECT_EQ(cached, 0);
  EXPECT_TRUE(computed);
  ASSERT_NO_FATAL_FAILURE(WaitForStoreWrites(3));
  EXPECT_EQ(redis.Cli({"DBSIZE"}), "3");

  // Another prefill process with nothing of its own: every block from the store, no forward.
  ASSERT_NO_FATAL_FAILURE(Restart(pair));
  ASSERT_NO_FATAL_FAILURE(Run(kTiny, prompt, &cached, &computed));
  EXPECT_EQ(cached, 39);
  EXPECT_FALSE(computed);
  // A longer conversation on the same prefix: the two full blocks from the store.
  auto longer = prompt;
  const auto more = MakePrompt(12, 512, 92);
  longer.insert(longer.end(), more.begin(), more.end());
  ASSERT_NO_FATAL_FAILURE(Run(kTiny, longer, &cached, &computed));
  EXPECT_EQ(cached, 32);
  EXPECT_TRUE(computed);
  auto st = WaitForPrefillIdle(prefill_address(), DeadlineAfterMs(5000));
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  const v1::KvTierStats* store = Tier(*st, "store");
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->hit_blocks(), 5u);
  EXPECT_EQ(store->read_failures(), 0u);
  EXPECT_EQ(st->kv_tier_fetched_tokens(), 39u + 32u);
}

TEST_F(KvStoreTest, RedisKilledMidRunMeansMissesNotWrongTokensNorHangs) {
  RedisServer redis;
  const DaemonPair pair = Pair(redis);
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  const auto prompt = MakePrompt(40, 512, 93);
  int32_t cached = -1;
  bool computed = false;
  ASSERT_NO_FATAL_FAILURE(Run(kTiny, prompt, &cached, &computed));
  ASSERT_NO_FATAL_FAILURE(WaitForStoreWrites(3));
  redis.Kill();
  // The store is the only tier: the prompt is computed again, by the deadline, same tokens.
  for (uint64_t seed : {93, 94}) {
    const auto p = seed == 93 ? prompt : MakePrompt(40, 512, seed);
    const auto t0 = Clock::now();
    ASSERT_NO_FATAL_FAILURE(Run(kTiny, p, &cached, &computed));
    EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
    EXPECT_EQ(cached, 0);
    EXPECT_TRUE(computed);
  }
  // Back (empty: no persistence), the store takes writes and serves them again.
  redis.Restart();
  const auto after = MakePrompt(40, 512, 95);
  const Deadline deadline = DeadlineAfterMs(15000);
  uint64_t hits = 0;
  while (Clock::now() < deadline && hits == 0) {
    ASSERT_NO_FATAL_FAILURE(Run(kTiny, after, &cached, &computed));
    auto st = WaitForPrefillIdle(prefill_address(), DeadlineAfterMs(5000));
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    hits = Tier(*st, "store")->hit_blocks();
    if (hits == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  EXPECT_GT(hits, 0u);
}

// The decode writes a finished conversation's blocks (prompt and answer) down to the store, so
// the next turn's prefix, the previous answer included, is found there by a prefill with
// nothing local; with the colocated tokens (the recompute's). A decode holding another secret
// plants nothing the prefill uses (bad HMAC: a miss, counted).
class KvStoreDecodeTest : public KvStoreTest {
 protected:
  // The prefill's flags on both daemons, the decode's secret in `decode_secret`.
  DaemonPair PairWithDecodeStore(const RedisServer& redis, const std::string& decode_secret) {
    DaemonPair pair = Pair(redis);
    pair.decode = {"--kv_tier_secret_file=" + SecretFile("decode.secret", decode_secret),
                   "--kv_store_redis=unix:" + redis.socket(),
                   "--kv_store_auth_file=" + redis.AuthFile(redis.password()),
                   "--kv_store_timeout_ms=200"};
    return pair;
  }
  // Turn 1 (40 tokens, a 30-token answer: the decode holds the KV of 69 tokens, 4 full blocks,
  // the 3rd and 4th with answer tokens), then turn 2 (+ the answer + 10 tokens) on a restarted
  // prefill; returns turn 2's cached tokens and the prefill's store figures.
  void TwoTurns(const DaemonPair& pair, int32_t* cached, v1::KvTierStats* store) {
    ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
    auto prompt = MakePrompt(40, 512, 97);
    auto r = CallGenerate(*stub_, prompt, 30, v1::LOAD_MODE_PIPELINED, 30000);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    ASSERT_EQ(r.tokens, Colocated(kTiny, prompt, 30));
    // The decode's write-down, asynchronous: at least the 2 blocks the prefill did not write
    // (it wrote the first 2 and its partial 3rd).
    const Deadline deadline = DeadlineAfterMs(10000);
    uint64_t written = 0;
    auto dstub = DecodeStub(decode_address());
    while (Clock::now() < deadline) {
      auto st = CallStats(*dstub);
      ASSERT_TRUE(st.ok()) << st.status().ToString();
      ASSERT_EQ(st->kv_tiers_size(), 1);
      EXPECT_EQ(st->kv_tiers(0).name(), "store");
      written = st->kv_tiers(0).written_blocks();
      if (written >= 2 && st->kv_tier_queued_blocks() == 0 &&
          st->pool().free_blocks() == st->pool().num_blocks())
        break;
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
    }
    ASSERT_GE(written, 2u);
    ASSERT_NO_FATAL_FAILURE(Restart(pair));
    prompt.insert(prompt.end(), r.tokens.begin(), r.tokens.end());
    const auto message = MakePrompt(10, 512, 98);
    prompt.insert(prompt.end(), message.begin(), message.end());  // 80 tokens: 79 at the prefill
    bool computed = false;
    ASSERT_NO_FATAL_FAILURE(Run(kTiny, prompt, cached, &computed));
    EXPECT_TRUE(computed);
    auto st = WaitForPrefillIdle(prefill_address(), DeadlineAfterMs(5000));
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    ASSERT_NE(Tier(*st, "store"), nullptr);
    *store = *Tier(*st, "store");
  }
};

TEST_F(KvStoreDecodeTest, TheNextTurnFindsThePreviousAnswerInTheStore) {
  RedisServer redis;
  int32_t cached = -1;
  v1::KvTierStats store;
  ASSERT_NO_FATAL_FAILURE(TwoTurns(PairWithDecodeStore(redis, std::string(32, 's')), &cached, &store));
  EXPECT_EQ(cached, 64);  // 4 blocks: the 3rd and 4th hold the previous answer
  EXPECT_EQ(store.hit_blocks(), 4u);
  EXPECT_EQ(store.read_failures(), 0u);
}

TEST_F(KvStoreDecodeTest, ADecodeWithAnotherSecretPlantsNothing) {
  RedisServer redis;
  int32_t cached = -1;
  v1::KvTierStats store;
  ASSERT_NO_FATAL_FAILURE(TwoTurns(PairWithDecodeStore(redis, std::string(32, 'x')), &cached, &store));
  // The decode's blocks are refused (the prefill's own first 2 may be used, unless the decode's
  // copies reached the store first).
  // (The slow reads run at once: the 3rd and 4th blocks both fail.)
  EXPECT_LE(cached, 32);
  EXPECT_LE(store.hit_blocks(), 2u);
  EXPECT_GE(store.read_failures(), 2u);
}

// The decode writes a conversation down once: the same conversation again (the same prompt,
// the same greedy answer) finds every block in the store (one batched query) and writes none
// (issue 16: write-downs queued blocks a tier held). The store tier's counters, on both
// daemons' /metrics, are those of Stats and of the requests made.
TEST_F(KvStoreDecodeTest, AConversationIsWrittenDownOnceAndItsCountersAreScraped) {
  RedisServer redis;
  DaemonPair pair = PairWithDecodeStore(redis, std::string(32, 's'));
  for (auto* flags : {&pair.prefill, &pair.decode}) {
    const std::string file = dir_.path() + (flags == &pair.prefill ? "/p.mport" : "/d.mport");
    flags->push_back("--metrics=127.0.0.1:0");
    flags->push_back("--metrics_port_file=" + file);
  }
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  const int pmetrics = ReadMetricsPort(dir_.path() + "/p.mport", DeadlineAfterMs(5000));
  const int dmetrics = ReadMetricsPort(dir_.path() + "/d.mport", DeadlineAfterMs(5000));
  ASSERT_GT(pmetrics, 0);
  ASSERT_GT(dmetrics, 0);
  auto dstub = DecodeStub(decode_address());
  // The decode's Stats once its write-down queue is empty and `done` holds.
  auto settled = [&](auto done) {
    const Deadline deadline = DeadlineAfterMs(10000);
    Result<v1::StatsResponse> st = Timeout("no Stats");
    while (Clock::now() < deadline) {
      st = CallStats(*dstub);
      if (st.ok() && st->kv_tiers_size() == 1 && st->kv_tier_queued_blocks() == 0 && done(*st))
        return st;
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
    }
    ADD_FAILURE() << "the decode's write-down did not settle";
    return st;
  };
  const auto prompt = MakePrompt(40, 512, 97);
  const auto want = Colocated(kTiny, prompt, 30);
  auto r = CallGenerate(*stub_, prompt, 30, v1::LOAD_MODE_PIPELINED, 30000);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(r.tokens, want);
  // Every block in the store: the prefill's 2 full and 1 partial, the decode's 3rd and 4th.
  const Deadline deadline = DeadlineAfterMs(10000);
  while (Clock::now() < deadline && redis.Cli({"DBSIZE"}) != "5")
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  ASSERT_EQ(redis.Cli({"DBSIZE"}), "5");
  auto first =
      settled([](const v1::StatsResponse& s) { return s.kv_tiers(0).written_blocks() >= 2; });
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const uint64_t written = first->kv_tiers(0).written_blocks();
  const uint64_t bytes = first->kv_tiers(0).bytes_written();
  const uint64_t held = first->kv_tier_held_blocks();
  EXPECT_LE(written + held, 4u);

  // The same conversation again: the decode's 4 blocks are all held; nothing is written.
  r = CallGenerate(*stub_, prompt, 30, v1::LOAD_MODE_PIPELINED, 30000);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(r.tokens, want);
  auto second =
      settled([&](const v1::StatsResponse& s) { return s.kv_tier_held_blocks() >= held + 4; });
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->kv_tier_held_blocks(), held + 4);
  EXPECT_EQ(second->kv_tiers(0).written_blocks(), written);
  EXPECT_EQ(second->kv_tiers(0).bytes_written(), bytes);
  EXPECT_EQ(second->kv_tier_skipped_blocks(), 0u);
  EXPECT_EQ(redis.Cli({"DBSIZE"}), "5");

  const std::string d = Scrape(dmetrics);
  ASSERT_FALSE(d.empty());
  const std::string store = "{tier=\"store\"}";
  EXPECT_EQ(SampleValue(d, "kvstream_decode_kv_tier_written_blocks_total" + store),
            double(written)) << d;
  EXPECT_EQ(SampleValue(d, "kvstream_decode_kv_tier_written_bytes_total" + store), double(bytes));
  EXPECT_EQ(SampleValue(d, "kvstream_decode_kv_tier_write_failures_total" + store), 0);
  EXPECT_EQ(SampleValue(d, "kvstream_decode_kv_tier_held_blocks_total"), double(held + 4));
  EXPECT_EQ(SampleValue(d, "kvstream_decode_kv_tier_queued_blocks"), 0);
  EXPECT_EQ(SampleValue(d, "kvstream_decode_kv_tier_skipped_blocks_total"), 0);
  // The prefill: its 3 blocks written once, then found held (the second call read them all).
  auto pst = WaitForPrefillIdle(prefill_address(), DeadlineAfterMs(5000));
  ASSERT_TRUE(pst.ok()) << pst.status().ToString();
  const std::string p = Scrape(pmetrics);
  EXPECT_EQ(pst->kv_tier_held_blocks(), 3u);
  EXPECT_EQ(SampleValue(p, "kvstream_prefill_kv_tier_held_blocks_total"), 3) << p;
  EXPECT_EQ(SampleValue(p, "kvstream_prefill_kv_tier_written_blocks_total" + store),
            double(Tier(*pst, "store")->written_blocks()));
  EXPECT_EQ(SampleValue(p, "kvstream_prefill_kv_tier_blocks_read_total" + store), 3);
  // The new series pass promtool as the others do.
  for (const std::string* text : {&d, &p}) {
    int rc = 0;
    const std::string out = PromtoolCheck(*text, dir_.path(), &rc);
    if (rc == -2) break;  // promtool not installed (daemons_metrics_test says so)
    EXPECT_EQ(rc, 0) << out;
    EXPECT_EQ(out, "") << out;
  }
}

// Issue 16 item 5: a decode reaching the store loads the prompt's prefix found there itself and
// tells the prefill to write only the rest (PrefillRequest.skip_blocks); a restarted (cold)
// decode loads from storage; a prompt whose whole prefix is stored needs no prefill at all; the
// store killed means the prefill writes everything. The colocated tokens throughout.
class KvStoreDecodeLoadTest : public KvStoreDecodeTest {
 protected:
  DaemonPair LoadingPair(const RedisServer& redis) {
    DaemonPair pair = PairWithDecodeStore(redis, std::string(32, 's'));
    pair.decode.push_back("--kv_prefetch_threshold_tokens=0");
    return pair;
  }
  // Turn 1: 40 tokens, a 30-token answer (the decode writes down 4 full blocks of the 69 whose
  // KV it holds); returns the conversation (prompt and answer) once the write-down settled.
  void FirstTurn(std::vector<int32_t>* conversation) {
    auto prompt = MakePrompt(40, 512, 97);
    auto r = CallGenerate(*stub_, prompt, 30, v1::LOAD_MODE_PIPELINED, 30000);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    ASSERT_EQ(r.tokens, Colocated(kTiny, prompt, 30));
    auto dstub = DecodeStub(decode_address());
    const Deadline deadline = DeadlineAfterMs(10000);
    uint64_t written = 0;
    while (Clock::now() < deadline) {
      auto st = CallStats(*dstub);
      ASSERT_TRUE(st.ok()) << st.status().ToString();
      written = st->kv_tiers(0).written_blocks() + st->kv_tier_held_blocks();
      if (written >= 4 && st->kv_tier_queued_blocks() == 0 &&
          st->pool().free_blocks() == st->pool().num_blocks())
        break;
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
    }
    ASSERT_GE(written, 4u);
    prompt.insert(prompt.end(), r.tokens.begin(), r.tokens.end());
    *conversation = std::move(prompt);
  }
  // The next turn: the conversation so far and a new 10-token message (`seed`).
  static std::vector<int32_t> NextTurn(const std::vector<int32_t>& conversation, uint64_t seed) {
    auto prompt = conversation;
    const auto message = MakePrompt(10, 512, seed);
    prompt.insert(prompt.end(), message.begin(), message.end());
    return prompt;
  }
  // The load figures of a call (its last message carrying them).
  static v1::LoadInfo Load(const GenerateResult& r) {
    v1::LoadInfo info;
    for (const auto& m : r.messages)
      if (m.has_load()) info = m.load();
    return info;
  }
  uint64_t BlockBytes() {  // one block over every layer
    auto st = CallStats(*stub_);
    EXPECT_TRUE(st.ok());
    return st.ok() ? st->pool().block_bytes() * uint64_t(st->pool().num_layers()) : 0;
  }
};

TEST_F(KvStoreDecodeLoadTest, AColdDecodeLoadsThePrefixAndThePrefillWritesTheRest) {
  RedisServer redis;
  const DaemonPair pair = LoadingPair(redis);
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  std::vector<int32_t> conversation;
  ASSERT_NO_FATAL_FAILURE(FirstTurn(&conversation));
  ASSERT_NO_FATAL_FAILURE(Restart(pair));  // both cold: the store alone holds the KV
  const uint64_t block = BlockBytes();
  ASSERT_GT(block, 0u);

  // Turn 2 (80 tokens, 79 loaded): blocks 0-3 from the store by the decode, block 4 written.
  auto prompt = NextTurn(conversation, 98);
  auto r = CallGenerate(*stub_, prompt, 6, v1::LOAD_MODE_PIPELINED, 30000);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, Colocated(kTiny, prompt, 6));
  v1::LoadInfo load = Load(r);
  EXPECT_TRUE(load.loaded_remotely());
  EXPECT_EQ(load.decode_tier_tokens(), 64);
  EXPECT_EQ(load.kv_bytes(), block);  // what the prefill wrote: one block
  auto pst = WaitForPrefillIdle(prefill_address(), DeadlineAfterMs(5000));
  ASSERT_TRUE(pst.ok()) << pst.status().ToString();
  EXPECT_EQ(pst->counters().kv_bytes_moved(), block);
  EXPECT_EQ(pst->counters().requests_total(), 1u);
  auto dst = CallStats(*stub_);
  ASSERT_TRUE(dst.ok());
  EXPECT_EQ(dst->kv_tier_fetched_tokens(), 64u);
  EXPECT_EQ(Tier(*dst, "store")->hit_blocks(), 4u);
  EXPECT_EQ(Tier(*dst, "store")->read_failures(), 0u);

  // 65 tokens: the 64 before the last all stored, so no prefill call at all.
  prompt.assign(conversation.begin(), conversation.begin() + 65);
  r = CallGenerate(*stub_, prompt, 6, v1::LOAD_MODE_PIPELINED, 30000);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, Colocated(kTiny, prompt, 6));
  load = Load(r);
  EXPECT_FALSE(load.loaded_remotely());
  EXPECT_EQ(load.decode_tier_tokens(), 64);
  pst = WaitForPrefillIdle(prefill_address(), DeadlineAfterMs(5000));
  ASSERT_TRUE(pst.ok()) << pst.status().ToString();
  EXPECT_EQ(pst->counters().requests_total(), 1u);
  EXPECT_EQ(pst->counters().kv_bytes_moved(), block);
  // Every block back once the requests ended (the loaded ones included).
  dst = CallStats(*stub_);
  ASSERT_TRUE(dst.ok());
  EXPECT_EQ(dst->pool().free_blocks(), dst->pool().num_blocks());

  // Under another tenant's cache_salt the stored prefix is not found: all from the prefill.
  v1::GenerateRequest salted;
  *salted.mutable_prompt_tokens() = {prompt.begin(), prompt.end()};
  salted.set_max_tokens(6);
  salted.set_load_mode(v1::LOAD_MODE_PIPELINED);
  salted.set_cache_salt("another tenant");
  r = CallGenerate(*stub_, salted, 30000);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, Colocated(kTiny, prompt, 6));
  load = Load(r);
  EXPECT_TRUE(load.loaded_remotely());
  EXPECT_EQ(load.decode_tier_tokens(), 0);
  EXPECT_EQ(load.kv_bytes(), 4 * block);
}

TEST_F(KvStoreDecodeLoadTest, WithTheStoreDownThePrefillWritesEverything) {
  RedisServer redis;
  DaemonPair pair = LoadingPair(redis);
  pair.decode.push_back("--kv_decode_loads_prefix=true");
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  std::vector<int32_t> conversation;
  ASSERT_NO_FATAL_FAILURE(FirstTurn(&conversation));
  redis.Kill();
  auto prompt = NextTurn(conversation, 99);
  const auto t0 = Clock::now();
  auto r = CallGenerate(*stub_, prompt, 6, v1::LOAD_MODE_PIPELINED, 30000);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(r.tokens, Colocated(kTiny, prompt, 6));
  const v1::LoadInfo load = Load(r);
  EXPECT_TRUE(load.loaded_remotely());
  EXPECT_EQ(load.decode_tier_tokens(), 0);
  EXPECT_EQ(load.kv_bytes(), 5 * BlockBytes());  // all 79 tokens' blocks from the prefill
}

// Turned off, the decode never loads: the prefill writes every block.
TEST_F(KvStoreDecodeLoadTest, TurnedOffTheDecodeLoadsNothing) {
  RedisServer redis;
  DaemonPair pair = LoadingPair(redis);
  pair.decode.push_back("--kv_decode_loads_prefix=false");
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  std::vector<int32_t> conversation;
  ASSERT_NO_FATAL_FAILURE(FirstTurn(&conversation));
  auto prompt = NextTurn(conversation, 98);
  auto r = CallGenerate(*stub_, prompt, 6, v1::LOAD_MODE_PIPELINED, 30000);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, Colocated(kTiny, prompt, 6));
  EXPECT_EQ(Load(r).decode_tier_tokens(), 0);
  EXPECT_EQ(Load(r).kv_bytes(), 5 * BlockBytes());
}

}  // namespace
}  // namespace kvstream::testing
