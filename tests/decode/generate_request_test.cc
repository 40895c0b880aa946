#include "decode/generate_request.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace kvstream::decode
