// Generated text, token by token, with stop strings: what a server streams to its client.
//
// Guarantees:
//  - Push(id) returns the text that is final after this token: never half a UTF-8 character, and
//    never text that could still turn out to be the start of a stop string (it is held back).
//  - When the decoded text contains a stop string, the step reports it and its text ends just
//    before it (as vLLM does by default); nothing follows.
//  - Push(id, /*last=*/true) returns everything still held back (cut at a stop string if the
//    held text contains one). Special tokens are not part of the text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "tokenizer/tokenizer.h"

namespace kvstream::tokenizer {

struct TextStep {
  std::string text;         // new text to show
  std::string stop_string;  // the stop string that ended generation, or empty
};

class TextStream {
 public:
  // Empty strings in `stop_strings` are ignored.
  TextStream(const Tokenizer& tokenizer, std::vector<std::string> stop_strings);
  Result<TextStep> Push(int32_t id, bool last);
  bool stopped() const { return stopped_; }

 private:
  DecodeStream stream_;
  std::vector<std::string> stops_;
  std::string held_;  // decoded text not yet returned
  bool stopped_ = false;
};

}  // namespace kvstream::tokenizer
