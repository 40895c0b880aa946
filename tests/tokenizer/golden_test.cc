// Every family's encodings and decodings equal the reference library's on every corpus line.
#include <gtest/gtest.h>

#include "tests/tokenizer/golden_util.h"
#include "tokenizer/tokenizer.h"

namespace kvstream::tokenizer {
namespace {

using testing::Corpus;
using testing::DataDir;
using testing::Golden;

std::string Show(const std::string& s) {
  std::string out;
  for (const unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof(b), "\\x%02x", c);
      out += b;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, EncodesAndDecodesEveryCorpusLineAsTheReference) {
  auto tok = Tokenizer::Load(DataDir() + "/" + GetParam());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const auto corpus = Corpus();
  const auto golden = Golden(GetParam());
  ASSERT_EQ(golden["cases"].size(), corpus.size());
  EXPECT_EQ((*tok)->vocab_size(), golden["vocab_size"].get<int32_t>());
  int bad = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    const auto& c = golden["cases"][i];
    auto ids = (*tok)->Encode(corpus[i], true);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    const auto want = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(*ids, want) << "line " << i << ": '" << Show(corpus[i]) << "'";
    auto plain = (*tok)->Encode(corpus[i], false);
    ASSERT_TRUE(plain.ok());
    EXPECT_EQ(*plain, c["ids_plain"].get<std::vector<int32_t>>()) << "line " << i << " without special tokens";
    auto text = (*tok)->Decode(want, false);
    ASSERT_TRUE(text.ok()) << text.status().ToString();
    EXPECT_EQ(Show(*text), Show(c["text"].get<std::string>())) << "decoding line " << i;
    if (c.contains("text_skip")) {
      auto skip = (*tok)->Decode(want, true);
      ASSERT_TRUE(skip.ok());
      EXPECT_EQ(Show(*skip), Show(c["text_skip"].get<std::string>())) << "decoding line " << i << " skipping special tokens";
    }
    bad += *ids != want;
  }
  EXPECT_EQ(bad, 0) << bad << " of " << corpus.size() << " lines differ";
}

TEST_P(GoldenTest, DecodesEverySingleIdAndRandomSequencesAsTheReference) {
  auto tok = Tokenizer::Load(DataDir() + "/" + GetParam());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const auto golden = Golden(GetParam());
  const auto& single = golden["single"];
  for (size_t id = 0; id < single.size(); ++id) {
    const int32_t i = static_cast<int32_t>(id);
    auto text = (*tok)->Decode(std::span<const int32_t>(&i, 1), false);
    ASSERT_TRUE(text.ok()) << text.status().ToString();
    EXPECT_EQ(Show(*text), Show(single[id].get<std::string>())) << "id " << id;
  }
  for (const auto& r : golden["random"]) {
    const auto ids = r["ids"].get<std::vector<int32_t>>();
    auto text = (*tok)->Decode(ids, false);
    ASSERT_TRUE(text.ok()) << text.status().ToString();
    EXPECT_EQ(Show(*text), Show(r["text"].get<std::string>())) << r["ids"].dump();
  }
}

INSTANTIATE_TEST_SUITE_P(Families, GoldenTest, ::testing::ValuesIn(testing::Families()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kvstream::tokenizer
