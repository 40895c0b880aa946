#include "decode/generate_request.h"

#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>

namespace kvstream::decode {
namespace {

constexpr GenerateLimits kLimits{/*vocab_size=*/100, /*max_position=*/64, /*block_size=*/16,
                                 /*pool_blocks=*/3};

v1::GenerateRequest Request(std::initializer_list<int32_t> prompt, int32_t max_tokens) {
  v1::GenerateRequest r;
  for (int32_t t : prompt) r.add_prompt_tokens(t);
  r.set_max_tokens(max_tokens);
  return r;
}

void ExpectRefused(const v1::GenerateRequest& r, const std::string& words) {
  Status s = CheckGenerateRequest(r, kLimits);
  EXPECT_EQ(StatusCode::kInvalidArgument, s.code()) << s.ToString();
  EXPECT_NE(std::string::npos, s.message().find(words)) << s.message();
}

TEST(GenerateRequest, AcceptsAndCountsBlocks) {
  int need = -1;
  ASSERT_TRUE(CheckGenerateRequest(Request({1, 2, 3}, 14), kLimits, &need).ok());
  EXPECT_EQ(2, need);  // 17 tokens in blocks of 16
  ASSERT_TRUE(CheckGenerateRequest(Request({99}, 15), kLimits, &need).ok());
  EXPECT_EQ(1, need);
}

TEST(GenerateRequest, RefusesWhatCannotBeServed) {
  ExpectRefused(Request({}, 4), "prompt_tokens is empty");
  ExpectRefused(Request({1}, 0), "max_tokens must be >= 1");
  ExpectRefused(Request({1}, -5), "max_tokens must be >= 1");
  ExpectRefused(Request({1, 100}, 4), "token id 100 outside the vocabulary [0, 100)");
  ExpectRefused(Request({-1}, 4), "token id -1 outside");
  ExpectRefused(Request({1, 2}, 63), "prompt + max_tokens = 65 exceeds the model's max_position 64");
  v1::GenerateRequest salted = Request({1, 2}, 4);
  salted.set_cache_salt(std::string(256, 's'));
  EXPECT_TRUE(CheckGenerateRequest(salted, kLimits).ok());
  salted.set_cache_salt(std::string(257, 's'));
  ExpectRefused(salted, "cache_salt holds 257 bytes, at most 256");
  GenerateLimits small = kLimits;
  small.pool_blocks = 1;
  Status s = CheckGenerateRequest(Request({1, 2}, 20), small);
  EXPECT_EQ(StatusCode::kInvalidArgument, s.code());
  EXPECT_EQ("request needs 2 KV blocks, the pool has 1", s.message());
}

TEST(GenerateRequest, RefusesAMaxTokensThatWouldOverflowTheTotal) {
  // prompt + max_tokens past 2^31: refused as over max_position, not wrapped to a negative size.
  ExpectRefused(Request({1, 2}, 2147483647),
                "prompt + max_tokens = 2147483649 exceeds the model's max_position 64");
  ExpectRefused(Request({1}, 2147483647 - 10), "exceeds the model's max_position 64");
}

TEST(GenerateRequest, RefusesBadSamplingAndReadsGoodSampling) {
  auto with = [](auto set) {
    v1::GenerateRequest r = Request({1, 2}, 4);
    set(r.mutable_sampling());
    return r;
  };
  ExpectRefused(with([](v1::SamplingParams* s) { s->set_temperature(NAN); }), "temperature");
  ExpectRefused(with([](v1::SamplingParams* s) { s->set_temperature(-0.5f); }), "temperature");
  ExpectRefused(with([](v1::SamplingParams* s) { s->set_temperature(1e9f); }), "temperature");
  ExpectRefused(with([](v1::SamplingParams* s) { s->set_top_k(-1); }), "top_k");
  ExpectRefused(with([](v1::SamplingParams* s) { s->set_top_p(0); }), "top_p");
  ExpectRefused(with([](v1::SamplingParams* s) { s->set_top_p(-1); }), "top_p");
  ExpectRefused(with([](v1::SamplingParams* s) { s->set_top_p(NAN); }), "top_p");
  ExpectRefused(with([](v1::SamplingParams* s) { s->set_top_p(1.5f); }), "top_p");
  ExpectRefused(with([](v1::SamplingParams* s) { s->set_min_p(-0.1f); }), "min_p");
  ExpectRefused(with([](v1::SamplingParams* s) { s->set_min_p(NAN); }), "min_p");
  ExpectRefused(with([](v1::SamplingParams* s) { s->set_top_logprobs(21); }), "top_logprobs");
  ExpectRefused(with([](v1::SamplingParams* s) { s->set_top_logprobs(-1); }), "top_logprobs");
  // Absent fields are off: an empty sampling message is greedy.
  v1::GenerateRequest empty = with([](v1::SamplingParams*) {});
  ASSERT_TRUE(CheckGenerateRequest(empty, kLimits).ok());
  EXPECT_TRUE(SamplingFromRequest(empty, 9).greedy());
  EXPECT_EQ(SamplingFromRequest(empty, 9).top_p, 1.0f);
  EXPECT_EQ(SamplingFromRequest(empty, 9).seed, 9u);
  v1::GenerateRequest good = with([](v1::SamplingParams* s) {
    s->set_temperature(0.7f);
    s->set_top_k(40);
    s->set_top_p(0.9f);
    s->set_min_p(0.05f);
    s->set_seed(0);
    s->set_top_logprobs(20);
  });
  ASSERT_TRUE(CheckGenerateRequest(good, kLimits).ok());
  const model::SamplingParams p = SamplingFromRequest(good, 9);
  EXPECT_EQ(p.temperature, 0.7f);
  EXPECT_EQ(p.top_k, 40);
  EXPECT_EQ(p.top_p, 0.9f);
  EXPECT_EQ(p.min_p, 0.05f);
  EXPECT_EQ(p.seed, 0u);  // given, even if 0
  EXPECT_EQ(p.top_logprobs, 20);
  EXPECT_TRUE(SamplingFromRequest(Request({1}, 1), 9).greedy());
}

}  // namespace
}  // namespace kvstream::decode
