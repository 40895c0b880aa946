// Fuzzes the tokenizers: the first byte picks what the rest is.
//   0: a tokenizer.json (Tokenizer::FromHfJson); an accepted one encodes and decodes a fixed text
//   1: a SentencePiece model (Tokenizer::FromSentencePiece), likewise
//   2: text for the committed Llama 3 and Llama 2 style tokenizers; valid UTF-8 must encode, and
//      the ids decode, streamed and whole, to the same text
//   3: ids (little-endian int32) to decode with them: an id out of range is an error, never a crash
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

using kvstream::tokenizer::DecodeStream;
using kvstream::tokenizer::Tokenizer;

namespace {

void Exercise(const Tokenizer& tok, const std::string& text) {
  auto ids = tok.Encode(text);
  if (!kvstream::tokenizer::IsValidUtf8(text)) {
    if (ids.ok()) kvstream::fuzz::Fail("invalid UTF-8 was encoded");
    return;
  }
  if (!ids.ok()) return;  // e.g. a pattern's match limit
  for (const int32_t id : *ids) {
    if (id < 0 || id >= tok.vocab_size()) kvstream::fuzz::Fail("encode produced an id past the vocabulary");
  }
  auto whole = tok.Decode(*ids, true);
  if (!whole.ok()) kvstream::fuzz::Fail("encoded ids do not decode: " + whole.status().ToString());
  DecodeStream stream(tok, true);
  std::string joined;
  for (const int32_t id : *ids) {
    auto piece = stream.Push(id);
    if (!piece.ok()) kvstream::fuzz::Fail("stream: " + piece.status().ToString());
    if (!kvstream::tokenizer::IsValidUtf8(*piece)) kvstream::fuzz::Fail("stream emitted invalid UTF-8");
    joined += *piece;
  }
  auto rest = stream.Finish();
  if (!rest.ok()) kvstream::fuzz::Fail("stream finish failed");
  joined += *rest;
  if (joined != *whole) kvstream::fuzz::Fail("streamed text differs from the whole decoding");
}

const std::vector<std::unique_ptr<Tokenizer>>& Committed() {
  static const auto* all = [] {
    auto* v = new std::vector<std::unique_ptr<Tokenizer>>();
    for (const char* family : {"llama3", "llama2"}) {
      auto t = Tokenizer::Load(std::string(KVSTREAM_TOKENIZER_DATA) + "/" + family);
      if (!t.ok()) kvstream::fuzz::Fail("cannot load the committed tokenizer " + std::string(family));
      v->push_back(std::move(t).value());
    }
    return v;
  }();
  return *all;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0: {
      auto t = Tokenizer::FromHfJson(rest);
      if (t.ok()) Exercise(**t, "Hello, world! 123 <s> \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\xA4\x96\n\n  x");
      break;
    }
    case 1: {
      auto t = Tokenizer::FromSentencePiece(rest);
      if (t.ok()) Exercise(**t, "Hello, world! 123 \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\xA4\x96");
      break;
    }
    case 2:
      for (const auto& t : Committed()) Exercise(*t, rest);
      break;
    default: {
      std::vector<int32_t> ids(rest.size() / 4);
      if (!ids.empty()) std::memcpy(ids.data(), rest.data(), ids.size() * 4);
      for (const auto& t : Committed()) {
        bool in_range = true;
        for (const int32_t id : ids) in_range = in_range && id >= 0 && id < t->vocab_size();
        auto text = t->Decode(ids, false);
        if (text.ok() != in_range) kvstream::fuzz::Fail("decode accepted an id out of range, or refused one in range");
        if (text.ok() && !kvstream::tokenizer::IsValidUtf8(*text)) kvstream::fuzz::Fail("decode gave invalid UTF-8");
      }
      break;
    }
  }
  return 0;
}
