#include "decode/text_request.h"

#include "tokenizer/unicode.h"

namespace kvstream::decode {

Result<std::vector<int32_t>> PromptTokens(const kvstream::v1::GenerateRequest& req, const TextSupport& text) {
  const bool wants_text = !req.prompt_text().empty() || req.stop_strings_size() > 0;
  if (wants_text && text.tokenizer == nullptr) {
    return InvalidArgument("prompt_text and stop_strings need a tokenizer, and this decode daemon has none (" +
                           text.why_none + "): send prompt_tokens");
  }
  for (const auto& s : req.stop_strings()) {
    if (!tokenizer::IsValidUtf8(s)) return InvalidArgument("a stop string is not valid UTF-8");
  }
  if (req.prompt_text().empty()) return std::vector<int32_t>(req.prompt_tokens().begin(), req.prompt_tokens().end());
  if (req.prompt_tokens_size() > 0) return InvalidArgument("set prompt_tokens or prompt_text, not both");
  auto ids = text.tokenizer->Encode(req.prompt_text());
  if (!ids.ok()) return ids.status().WithContext("prompt_text");
  return ids;
}

}  // namespace kvstream::decode
