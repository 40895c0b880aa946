// kvstream tokenize, run as a user would: each stdin line's ids equal the reference goldens, and
// --decode gives the golden text back.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/tokenizer/golden_util.h"

namespace kvstream {
namespace {

namespace tt = tokenizer::testing;

struct CliRun {
  int exit_code;
  std::string out;
};

CliRun Tokenize(const std::string& flags, const std::string& input) {
  const auto in = std::filesystem::temp_directory_path() / ("kvstream_tokenize_" + std::to_string(getpid()));
  std::ofstream(in, std::ios::binary) << input;
  const std::string cmd = std::string(KVSTREAM_BIN) + " tokenize " + flags + " < " + in.string() + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int st = pclose(p);
  std::filesystem::remove(in);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

std::string Join(const nlohmann::json& ids) {
  std::string s;
  for (const auto& id : ids) s += (s.empty() ? "" : " ") + std::to_string(id.get<int32_t>());
  return s;
}

class TokenizeCli : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizeCli, PrintsEachLinesIdsAndDecodesThemBack) {
  const auto corpus = tt::Corpus();
  const auto golden = tt::Golden(GetParam());
  std::string input, want_ids, ids_input, want_text;
  for (size_t i = 0; i < corpus.size(); ++i) {
    if (corpus[i].find_first_of("\r\n") != std::string::npos) continue;  // one line each
    const auto& c = golden["cases"][i];
    input += corpus[i] + "\n";
    want_ids += Join(c["ids"]) + "\n";
    ids_input += Join(c["ids"]) + "\n";
    want_text += c["text"].get<std::string>() + "\n";
  }
  // A checkpoint folder, as the daemons see it.
  const std::string path = tt::DataDir() + "/" + GetParam();
  const CliRun enc = Tokenize("--tokenizer " + path, input);
  ASSERT_EQ(enc.exit_code, 0) << enc.out;
  EXPECT_EQ(enc.out, want_ids);
  const CliRun dec = Tokenize("--tokenizer " + path + " --decode", ids_input);
  ASSERT_EQ(dec.exit_code, 0) << dec.out;
  EXPECT_EQ(dec.out, want_text);
}

INSTANTIATE_TEST_SUITE_P(Families, TokenizeCli, ::testing::Values("llama3", "qwen2", "sp_bpe"),
                         [](const auto& info) { return info.param; });

TEST(TokenizeCliErrors, NamesWhatIsWrong) {
  CliRun r = Tokenize("", "hello\n");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--tokenizer"), std::string::npos) << r.out;
  r = Tokenize("--tokenizer /nonexistent/dir", "hello\n");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("does not exist"), std::string::npos) << r.out;
  r = Tokenize("--tokenizer " + tt::DataDir() + "/llama3/tokenizer.json --decode", "1 2\n3 x\n");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("line 2"), std::string::npos) << r.out;
  r = Tokenize("--tokenizer " + tt::DataDir() + "/llama3/tokenizer.json --decode", "1 99999999\n");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("99999999"), std::string::npos) << r.out;
  r = Tokenize("--tokenizer " + tt::DataDir() + "/sp_bpe/tokenizer.model --no-special-tokens", "hi\n\n");
  EXPECT_EQ(r.exit_code, 0) << r.out;
}

}  // namespace
}  // namespace kvstream
