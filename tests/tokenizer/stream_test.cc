// DecodeStream: what it emits, concatenated, equals Decode(); it never emits half a character.
#include <gtest/gtest.h>

#include "tests/tokenizer/golden_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace kvstream::tokenizer {
namespace {

class StreamTest : public ::testing::TestWithParam<std::string> {};

void CheckStream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip) {
  DecodeStream stream(tok, skip);
  std::string all;
  for (const int32_t id : ids) {
    auto piece = stream.Push(id);
    ASSERT_TRUE(piece.ok()) << piece.status().ToString();
    EXPECT_TRUE(IsValidUtf8(*piece));
    all += *piece;
  }
  auto rest = stream.Finish();
  ASSERT_TRUE(rest.ok());
  all += *rest;
  auto whole = tok.Decode(ids, skip);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(all, *whole) << nlohmann::json(ids).dump();
}

TEST_P(StreamTest, StreamedPiecesJoinToTheWholeDecoding) {
  auto tok = Tokenizer::Load(testing::DataDir() + "/" + GetParam());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const auto golden = testing::Golden(GetParam());
  for (const auto& c : golden["cases"]) {
    CheckStream(**tok, c["ids"].get<std::vector<int32_t>>(), true);
    CheckStream(**tok, c["ids"].get<std::vector<int32_t>>(), false);
  }
}

TEST_P(StreamTest, HoldsBackIncompleteCharacters) {
  auto tok = Tokenizer::Load(testing::DataDir() + "/" + GetParam());
  ASSERT_TRUE(tok.ok());
  // Emoji and CJK are split into byte tokens (byte-level pieces or byte fallback) in these small
  // vocabularies: no pushed piece may end inside a character or carry U+FFFD.
  auto ids = (*tok)->Encode("🤖 中文 👨‍👩‍👧‍👦 ok", false);
  ASSERT_TRUE(ids.ok());
  DecodeStream stream(**tok);
  for (const int32_t id : *ids) {
    auto piece = stream.Push(id);
    ASSERT_TRUE(piece.ok());
    EXPECT_TRUE(IsValidUtf8(*piece));
    EXPECT_EQ(piece->find("\xEF\xBF\xBD"), std::string::npos) << "piece '" << *piece << "'";
  }
}

INSTANTIATE_TEST_SUITE_P(Families, StreamTest, ::testing::ValuesIn(testing::Families()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kvstream::tokenizer
