// TextStream: stop strings end the text just before them, also when they span tokens; text that
// could still become a stop string is held back, and released when it does not.
#include <gtest/gtest.h>

#include "tests/tokenizer/golden_util.h"
#include "tokenizer/text_stream.h"

namespace kvstream::tokenizer {
namespace {

struct Outcome {
  std::string text;
  std::vector<std::string> pieces;
  std::string stop;
  size_t tokens_used = 0;
};

Outcome StreamText(const Tokenizer& tok, const std::string& generated, std::vector<std::string> stops) {
  auto ids = tok.Encode(generated, false);
  EXPECT_TRUE(ids.ok());
  TextStream ts(tok, std::move(stops));
  Outcome o;
  for (size_t i = 0; i < ids->size(); ++i) {
    auto step = ts.Push((*ids)[i], i + 1 == ids->size());
    EXPECT_TRUE(step.ok()) << step.status().ToString();
    o.text += step->text;
    o.pieces.push_back(step->text);
    ++o.tokens_used;
    if (!step->stop_string.empty()) {
      o.stop = step->stop_string;
      EXPECT_TRUE(ts.stopped());
      break;
    }
  }
  return o;
}

class TextStreamTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto t = Tokenizer::Load(testing::DataDir() + "/" + GetParam());
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tok_ = std::move(t).value();
  }
  std::unique_ptr<Tokenizer> tok_;
};

TEST_P(TextStreamTest, WithoutStopStringsTheTextIsTheWholeDecoding) {
  const std::string text = "The answer is 42.\nUser: and 中文 🤖 done";
  const Outcome o = StreamText(*tok_, text, {});
  auto ids = tok_->Encode(text, false);
  EXPECT_EQ(o.text, tok_->Decode(*ids, true).value());
  EXPECT_TRUE(o.stop.empty());
}

TEST_P(TextStreamTest, StopsBeforeAStopStringSpanningTokens) {
  const Outcome o = StreamText(*tok_, "The answer is 42.\nUser: more text after", {"\nUser:", "never"});
  EXPECT_EQ(o.stop, "\nUser:");
  EXPECT_EQ(o.text, "The answer is 42.");
  EXPECT_NE(o.text.find("42."), std::string::npos);
  EXPECT_EQ(o.text.find("User"), std::string::npos);
}

TEST_P(TextStreamTest, HoldsBackAPossibleStopStringThenReleasesIt) {
  // "is 4" could start the stop string "is 5" until the "2" arrives.
  const Outcome o = StreamText(*tok_, "it is 42 and is 5 here", {"is 5"});
  EXPECT_EQ(o.stop, "is 5");
  EXPECT_EQ(o.text, "it is 42 and ");
  for (const auto& p : o.pieces) EXPECT_EQ(p.find("is 5"), std::string::npos);
}

TEST_P(TextStreamTest, StopStringsOfManyBytesInsideCharactersSplitOverTokens) {
  const Outcome o = StreamText(*tok_, "robots: 🤖🤖 and more", {"🤖"});
  EXPECT_EQ(o.stop, "🤖");
  EXPECT_EQ(o.text, "robots: ");
}

TEST_P(TextStreamTest, EarliestStopStringWins) {
  const Outcome o = StreamText(*tok_, "alpha beta gamma", {"gamma", "beta"});
  EXPECT_EQ(o.stop, "beta");
}

INSTANTIATE_TEST_SUITE_P(Families, TextStreamTest, ::testing::Values("llama3", "llama2", "sp_bpe"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kvstream::tokenizer
