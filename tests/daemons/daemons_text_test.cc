// Text in, text out through the daemons: a checkpoint folder with a tokenizer.json serves
// prompt_text (encoded as the tokenizer does) and streams text pieces whose concatenation is the
// decoding of the tokens; a stop string ends generation with the text cut just before it. A
// preset (dummy weights, no tokenizer) refuses text with INVALID_ARGUMENT saying so.
#include <fstream>
#include <sstream>

#include "tests/daemons/disagg_fixture.h"
#include "tokenizer/tokenizer.h"

namespace kvstream::testing {
namespace {

namespace v1 = kvstream::v1;

struct TextResult {
  grpc::Status status;
  std::vector<int32_t> tokens;
  std::string text, stop_string;
  bool last_seen = false;
};

TextResult GenerateText(v1::Decode::Stub& stub, const std::string& prompt, int max_tokens,
                        const std::vector<std::string>& stops, v1::LoadMode mode) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  v1::GenerateRequest req;
  req.set_prompt_text(prompt);
  req.set_max_tokens(max_tokens);
  req.set_load_mode(mode);
  for (const auto& s : stops) req.add_stop_strings(s);
  auto reader = stub.Generate(&ctx, req);
  v1::GenerateResponse msg;
  TextResult r;
  while (reader->Read(&msg)) {
    r.tokens.push_back(msg.token_id());
    r.text += msg.text();
    if (!msg.stop_string().empty()) r.stop_string = msg.stop_string();
    r.last_seen = r.last_seen || msg.last();
  }
  r.status = reader->Finish();
  return r;
}

TEST_F(DisaggTest, TextInTextOutWithStopStrings) {
  const std::string ck = dir_.path() + "/ck";
  int rc = 0;
  const std::string out = RunCapture(std::string(KVSTREAM_CLI_BIN) + " make-checkpoint --model tiny --out " + ck, &rc, true);
  ASSERT_EQ(rc, 0) << out;
  std::ofstream(ck + "/tokenizer.json") << SmallTokenizerJson(KVSTREAM_TOKENIZER_DATA);
  auto tok = tokenizer::Tokenizer::Load(ck);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();

  DaemonPair pair;
  pair.common = {"--model=" + ck, "--pool_blocks=64"};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  const std::string prompt = "Hello, world! The answer is 42.";
  const auto ids = (*tok)->Encode(prompt).value();
  ASSERT_EQ(ids.front(), 500);  // BOS, as the template adds it

  const TextResult r = GenerateText(*stub_, prompt, 24, {}, v1::LOAD_MODE_PIPELINED);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(r.tokens.size(), 24u);
  EXPECT_TRUE(r.last_seen);
  // The same request as ids gives the same tokens; the streamed text is their decoding.
  const auto by_ids = CallGenerate(*stub_, ids, 24, v1::LOAD_MODE_LOCAL, 120000);
  ASSERT_TRUE(by_ids.status.ok()) << by_ids.status.error_message();
  EXPECT_EQ(r.tokens, by_ids.tokens);
  EXPECT_EQ(r.text, (*tok)->Decode(r.tokens, true).value());

  // A stop string taken from that text: generation ends where it first appears.
  std::string stop;
  for (size_t i = 1; i < r.tokens.size() && stop.empty(); ++i) {
    const std::string piece = (*tok)->Decode(std::vector<int32_t>{r.tokens[i]}, true).value();
    bool printable = piece.size() >= 2;
    for (const char c : piece) printable = printable && c > ' ' && c < 0x7f;
    if (printable) stop = piece;
  }
  if (stop.empty()) GTEST_SKIP() << "the dummy model's text has no printable token to stop at";
  const TextResult s = GenerateText(*stub_, prompt, 24, {"\x01never", stop}, v1::LOAD_MODE_PIPELINED);
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_EQ(s.stop_string, stop);
  EXPECT_TRUE(s.last_seen);
  EXPECT_EQ(s.text, r.text.substr(0, r.text.find(stop))) << "stop '" << stop << "' in '" << r.text << "'";
  EXPECT_LT(s.tokens.size(), r.tokens.size() + 1);
  EXPECT_EQ(s.tokens, std::vector<int32_t>(r.tokens.begin(), r.tokens.begin() + s.tokens.size()));

  // Both prompt forms at once are refused.
  grpc::ClientContext ctx;
  v1::GenerateRequest both;
  both.set_prompt_text("x");
  both.add_prompt_tokens(1);
  both.set_max_tokens(2);
  auto reader = stub_->Generate(&ctx, both);
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
  }
  const grpc::Status st = reader->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("not both"), std::string::npos) << st.error_message();
  EXPECT_TRUE(WaitForAllBlocksFree(decode_address(), true, DeadlineAfterMs(5000)).ok());
}

TEST_F(DisaggTest, PresetWithoutTokenizerRefusesText) {
  DaemonPair pair;
  pair.common = {"--model=tiny", "--pool_blocks=16"};
  ASSERT_NO_FATAL_FAILURE(StartDaemons(pair));
  const TextResult r = GenerateText(*stub_, "Hello", 4, {}, v1::LOAD_MODE_DEFAULT);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(r.status.error_message().find("preset"), std::string::npos) << r.status.error_message();
  EXPECT_NE(r.status.error_message().find("prompt_tokens"), std::string::npos) << r.status.error_message();
  // Token ids still work, with empty text.
  const auto ok = CallGenerate(*stub_, {1, 2, 3}, 3, v1::LOAD_MODE_DEFAULT, 60000);
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  for (const auto& m : ok.messages) EXPECT_TRUE(m.text().empty());
}

}  // namespace
}  // namespace kvstream::testing
