#include "prefill/prefill_request.h"

#include <gtest/gtest.h>

namespace kvstream::prefill {
namespace {

TEST(PrefillRequest, AcceptsTokensInTheVocabulary) {
  v1::PrefillRequest r;
  r.add_tokens(0);
  r.add_tokens(99);
  EXPECT_TRUE(CheckPrefillRequest(r, 100, 64).ok());
}

TEST(PrefillRequest, RefusesNoTokensAndTokensOutsideTheVocabulary) {
  v1::PrefillRequest r;
  Status s = CheckPrefillRequest(r, 100, 64);
  EXPECT_EQ(StatusCode::kInvalidArgument, s.code());
  EXPECT_EQ("prefill: no tokens", s.message());
  r.add_tokens(5);
  r.add_tokens(100);
  s = CheckPrefillRequest(r, 100, 64);
  EXPECT_EQ(StatusCode::kInvalidArgument, s.code());
  EXPECT_EQ("token id 100 outside the vocabulary [0, 100)", s.message());
  r.set_tokens(1, -3);
  EXPECT_EQ("token id -3 outside the vocabulary [0, 100)",
            CheckPrefillRequest(r, 100, 64).message());
}

TEST(PrefillRequest, RefusesMoreTokensThanMaxPosition) {
  v1::PrefillRequest r;
  for (int i = 0; i < 65; ++i) r.add_tokens(1);
  Status s = CheckPrefillRequest(r, 100, 64);
  EXPECT_EQ(StatusCode::kInvalidArgument, s.code());
  EXPECT_EQ("prefill: 65 tokens exceed the model's max_position 64", s.message());
  r.mutable_tokens()->RemoveLast();
  EXPECT_TRUE(CheckPrefillRequest(r, 100, 64).ok());
}

}  // namespace
}  // namespace kvstream::prefill
