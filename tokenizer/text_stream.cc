#include "tokenizer/text_stream.h"

#include <algorithm>

namespace kvstream::tokenizer {

TextStream::TextStream(const Tokenizer& tokenizer, std::vector<std::string> stop_strings)
    : stream_(tokenizer, /*skip_special_tokens=*/true) {
  for (auto& s : stop_strings) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

Result<TextStep> TextStream::Push(int32_t id, bool last) {
  TextStep step;
  if (stopped_) return step;
  KV_ASSIGN_OR_RETURN(std::string piece, stream_.Push(id));
  held_ += piece;
  if (last) {
    KV_ASSIGN_OR_RETURN(std::string rest, stream_.Finish());
    held_ += rest;
  }
  // The earliest stop string wins; text before it is final, the string and what follows dropped.
  size_t first = std::string::npos;
  for (const auto& s : stops_) {
    const size_t at = held_.find(s);
    if (at != std::string::npos && (first == std::string::npos || at < first)) {
      first = at;
      step.stop_string = s;
    }
  }
  if (first != std::string::npos) {
    step.text = held_.substr(0, first);
    held_.clear();
    stopped_ = true;
    return step;
  }
  if (last) {
    step.text = std::move(held_);
    held_.clear();
    return step;
  }
  // Hold back the longest tail that is a proper prefix of a stop string.
  size_t keep = 0;
  for (const auto& s : stops_) {
    for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n) {
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
    }
  }
  // Never split a character: the held tail starts at a character boundary.
  while (keep < held_.size() && (static_cast<unsigned char>(held_[held_.size() - keep]) & 0xC0) == 0x80) ++keep;
  step.text = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return step;
}

}  // namespace kvstream::tokenizer
