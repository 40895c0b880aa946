// Integration: sampling through real daemons. The same seed gives the same tokens (and
// log-probabilities) disaggregated, pipelined or not, computed locally, batched with other
// requests or alone, as colocated Generate(); generation_config.json's eos ids stop generation
// unless ignore_eos; bad sampling parameters are refused with INVALID_ARGUMENT.
#include <filesystem>
#include <fstream>
#include <thread>

#include "model/weights.h"
#include "tests/daemons/disagg_fixture.h"

namespace kvstream::testing {
namespace {

namespace v1 = kvstream::v1;

class SamplingDaemonsTest : public DisaggTest {
 protected:
  // A tiny f16 checkpoint in the test's directory, and the colocated reference over it.
  void SetUp() override {
    model::ModelSpec spec;
    spec.model = "tiny";
    spec.seed = 5;
    auto w = model::OpenWeights(spec);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    ck_ = dir_.path() + "/ck";
    ASSERT_TRUE(model::WriteHfCheckpoint(**w, DType::kF16, ck_).ok());
    model::ModelSpec from_ck;
    from_ck.model = ck_;
    model::BackendOptions bo;
    bo.num_threads = 1;
    auto b = model::CreateBackend(from_ck, bo);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    ref_ = std::move(b).value();
  }

  model::GenerateResult Reference(const std::vector<int32_t>& prompt, int max_tokens,
                                  const model::SamplingParams& p) {
    auto pool = ref_->CreatePool(model::BlocksForTokens(int(prompt.size()) + max_tokens, 16), 16);
    EXPECT_TRUE(pool.ok());
    model::GenerateOptions go;
    go.max_new_tokens = max_tokens;
    go.sampling = p;
    auto r = model::Generate(*ref_, **pool, prompt, go);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : model::GenerateResult{};
  }

  static v1::GenerateRequest Request(const std::vector<int32_t>& prompt, int max_tokens,
                                     v1::LoadMode mode) {
    v1::GenerateRequest req;
    *req.mutable_prompt_tokens() = {prompt.begin(), prompt.end()};
    req.set_max_tokens(max_tokens);
    req.set_load_mode(mode);
    req.set_ignore_eos(true);
    return req;
  }

  std::string ck_;
  std::unique_ptr<model::ModelBackend> ref_;
};

TEST_F(SamplingDaemonsTest, SameSeedSameTokensDisaggregatedColocatedAndBatched) {
  DaemonPair pair;
  pair.common = {"--model=" + ck_, "--pool_blocks=128"};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  const int vocab = ref_->config().vocab_size;
  model::SamplingParams p;
  p.temperature = 1.3f;
  p.top_k = 50;
  p.top_p = 0.95f;
  p.min_p = 0.01f;
  p.seed = 77;
  p.top_logprobs = 3;
  const int kTokens = 10;
  for (int n : {1, 17, 40}) {
    const auto prompt = MakePrompt(n, vocab, n);
    const model::GenerateResult want = Reference(prompt, kTokens, p);
    ASSERT_EQ(want.tokens.size(), size_t(kTokens));
    ASSERT_EQ(want.logprobs.size(), size_t(kTokens));
    EXPECT_NE(want.tokens, Reference(prompt, kTokens, {}).tokens) << "sampling changes nothing?";
    for (auto mode : {v1::LOAD_MODE_PIPELINED, v1::LOAD_MODE_NON_PIPELINED, v1::LOAD_MODE_LOCAL}) {
      v1::GenerateRequest req = Request(prompt, kTokens, mode);
      v1::SamplingParams* s = req.mutable_sampling();
      s->set_temperature(p.temperature);
      s->set_top_k(p.top_k);
      s->set_top_p(p.top_p);
      s->set_min_p(p.min_p);
      s->set_seed(p.seed);
      s->set_top_logprobs(p.top_logprobs);
      // Alone, then while four other sampled requests (random seeds) share the decode steps.
      for (int others : {0, 4}) {
        std::vector<std::thread> threads;
        for (int i = 0; i < others; ++i) {
          threads.emplace_back([&, i] {
            auto stub = DecodeStub(decode_address());
            v1::GenerateRequest o = Request(MakePrompt(20 + i, vocab, 100 + i), 16, mode);
            o.mutable_sampling()->set_temperature(0.9f);
            EXPECT_TRUE(CallGenerate(*stub, o, 30000).status.ok());
          });
        }
        auto r = CallGenerate(*stub_, req, 30000);
        for (auto& t : threads) t.join();
        ASSERT_TRUE(r.status.ok()) << r.status.error_message();
        SCOPED_TRACE("prompt " + std::to_string(n) + " mode " + std::to_string(mode) +
                     " others " + std::to_string(others));
        EXPECT_EQ(r.tokens, want.tokens);
        ASSERT_EQ(r.messages.size(), want.logprobs.size());
        for (size_t i = 0; i < r.messages.size(); ++i) {
          const v1::GenerateResponse& m = r.messages[i];
          ASSERT_TRUE(m.has_logprob());
          EXPECT_EQ(m.logprob(), want.logprobs[i].logprob);
          ASSERT_EQ(m.top_logprobs_size(), 3);
          for (int j = 0; j < 3; ++j) {
            EXPECT_EQ(m.top_logprobs(j).token_id(), want.logprobs[i].top[j].token);
            EXPECT_EQ(m.top_logprobs(j).logprob(), want.logprobs[i].top[j].logprob);
          }
        }
        EXPECT_EQ(r.messages.front().seed(), 77u);
      }
    }
  }
  // No seed: the daemon picks one and says which; that seed reproduces the tokens.
  const auto prompt = MakePrompt(30, vocab, 9);
  v1::GenerateRequest req = Request(prompt, kTokens, v1::LOAD_MODE_DEFAULT);
  req.mutable_sampling()->set_temperature(1.0f);
  auto a = CallGenerate(*stub_, req, 30000);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  const uint64_t seed = a.messages.front().seed();
  EXPECT_FALSE(a.messages.front().has_logprob());
  model::SamplingParams again;
  again.temperature = 1.0f;
  again.seed = seed;
  EXPECT_EQ(a.tokens, Reference(prompt, kTokens, again).tokens);
  EXPECT_TRUE(WaitForAllBlocksFree(decode_address(), true, DeadlineAfterMs(5000)).ok());
}

TEST_F(SamplingDaemonsTest, GenerationConfigEosStopsUnlessIgnored) {
  const int vocab = ref_->config().vocab_size;
  const auto prompt = MakePrompt(25, vocab, 3);
  const auto greedy = Reference(prompt, 8, {}).tokens;
  ASSERT_EQ(greedy.size(), 8u);
  const int32_t eos = greedy[2];
  std::ofstream(ck_ + "/generation_config.json")
      << R"({"bos_token_id": 1, "eos_token_id": [)" << eos << ", " << vocab - 1 << "]}";
  DaemonPair pair;
  pair.common = {"--model=" + ck_};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  v1::GenerateRequest req = Request(prompt, 8, v1::LOAD_MODE_PIPELINED);
  req.set_ignore_eos(false);
  auto r = CallGenerate(*stub_, req, 30000);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  const size_t first = std::find(greedy.begin(), greedy.end(), eos) - greedy.begin();
  EXPECT_EQ(r.tokens, std::vector<int32_t>(greedy.begin(), greedy.begin() + first + 1));
  EXPECT_TRUE(r.messages.back().last());
  req.set_ignore_eos(true);
  r = CallGenerate(*stub_, req, 30000);
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.tokens, greedy);
}

TEST_F(SamplingDaemonsTest, MalformedGenerationConfigStopsTheDaemonClearly) {
  std::ofstream(ck_ + "/generation_config.json") << R"({"eos_token_id": "2"})";
  int rc = -1;
  const std::string out = RunCapture(DecodeBin() + " --model=" + ck_ +
                                         " --listen=127.0.0.1:0 --peer=127.0.0.1:1 2>&1",
                                     &rc, true);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("eos_token_id"), std::string::npos) << out;
}

TEST_F(SamplingDaemonsTest, BadSamplingParametersAreInvalidArgument) {
  DaemonPair pair;
  pair.common = {"--model=" + ck_};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  const auto prompt = MakePrompt(20, ref_->config().vocab_size, 4);
  auto check = [&](const char* what, auto set) {
    v1::GenerateRequest req = Request(prompt, 4, v1::LOAD_MODE_DEFAULT);
    set(req.mutable_sampling());
    auto r = CallGenerate(*stub_, req, 5000);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << what;
    EXPECT_NE(r.status.error_message().find(what), std::string::npos) << r.status.error_message();
  };
  check("temperature", [](v1::SamplingParams* s) { s->set_temperature(NAN); });
  check("temperature", [](v1::SamplingParams* s) { s->set_temperature(-1); });
  check("top_k", [](v1::SamplingParams* s) { s->set_top_k(-3); });
  check("top_p", [](v1::SamplingParams* s) { s->set_top_p(0); });
  check("top_p", [](v1::SamplingParams* s) { s->set_top_p(1.01f); });
  check("min_p", [](v1::SamplingParams* s) { s->set_min_p(INFINITY); });
  check("top_logprobs", [](v1::SamplingParams* s) { s->set_top_logprobs(1 << 30); });
  EXPECT_TRUE(WaitForAllBlocksFree(decode_address(), true, DeadlineAfterMs(5000)).ok());
  auto stats = CallStats(*stub_);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->counters().requests_ok(), 0u);
}

}  // namespace
}  // namespace kvstream::testing
