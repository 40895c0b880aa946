// Text in a Generate request: the prompt as token ids (prompt_tokens, or prompt_text encoded with
// the checkpoint's tokenizer) and the checks of the text fields. Pure (no server state), so it is
// unit-tested and fuzzed with the other request checks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "proto/kvstream.pb.h"
#include "tokenizer/tokenizer.h"

namespace kvstream::decode {

// The daemon's tokenizer, or why it has none (said in the INVALID_ARGUMENT of a text request).
struct TextSupport {
  const tokenizer::Tokenizer* tokenizer = nullptr;
  std::string why_none;
};

// prompt_tokens as they are, or prompt_text encoded. INVALID_ARGUMENT when both or neither text
// field rules are broken: prompt_text with prompt_tokens, text fields (prompt_text, stop_strings)
// without a tokenizer, a stop string or prompt that is not UTF-8.
Result<std::vector<int32_t>> PromptTokens(const kvstream::v1::GenerateRequest& req, const TextSupport& text);

}  // namespace kvstream::decode
