// PromptTokens: prompt_tokens as they are, prompt_text encoded with the tokenizer, and the text
// fields refused clearly without one.
#include <gtest/gtest.h>

#include "decode/text_request.h"

namespace kvstream::decode {
namespace {

std::unique_ptr<tokenizer::Tokenizer> Llama3() {
  return tokenizer::Tokenizer::Load(std::string(KVSTREAM_TOKENIZER_DATA) + "/llama3").value();
}

TEST(PromptTokens, TokensPassThroughAndTextIsEncoded) {
  const auto tok = Llama3();
  const TextSupport text{tok.get(), ""};
  v1::GenerateRequest req;
  req.add_prompt_tokens(5);
  req.add_prompt_tokens(6);
  EXPECT_EQ(PromptTokens(req, text).value(), (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(PromptTokens(req, TextSupport{nullptr, "none"}).value(), (std::vector<int32_t>{5, 6}));
  v1::GenerateRequest t;
  t.set_prompt_text("Hello, world!");
  EXPECT_EQ(PromptTokens(t, text).value(), tok->Encode("Hello, world!").value());
}

TEST(PromptTokens, RefusesWhatCannotBeServed) {
  const auto tok = Llama3();
  v1::GenerateRequest both;
  both.set_prompt_text("x");
  both.add_prompt_tokens(1);
  auto r = PromptTokens(both, TextSupport{tok.get(), ""});
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("not both"), std::string::npos);

  v1::GenerateRequest t;
  t.set_prompt_text("x");
  r = PromptTokens(t, TextSupport{nullptr, "model 'tiny' is a preset"});
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("model 'tiny' is a preset"), std::string::npos) << r.status().ToString();

  v1::GenerateRequest stop;
  stop.add_prompt_tokens(1);
  stop.add_stop_strings("\n");
  EXPECT_EQ(PromptTokens(stop, TextSupport{nullptr, "none"}).status().code(), StatusCode::kInvalidArgument);
  stop.add_stop_strings("bad \xC3\x28");
  EXPECT_EQ(PromptTokens(stop, TextSupport{tok.get(), ""}).status().code(), StatusCode::kInvalidArgument);

  v1::GenerateRequest bad;
  bad.set_prompt_text("bad \xC3\x28 text");
  EXPECT_EQ(PromptTokens(bad, TextSupport{tok.get(), ""}).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvstream::decode
