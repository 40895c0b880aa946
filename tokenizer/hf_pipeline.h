// The parts of a Hugging Face tokenizer.json around the model: normalizer, pre-tokenizer,
// post-processor and decoder, parsed strictly (an unknown type or option is an error naming it).
//
// Guarantees: each Parse* returns a ready, immutable step or an INVALID_ARGUMENT Status that names
// the JSON path; Apply/Split/Decode are thread-safe and work on valid UTF-8.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"

namespace kvstream::tokenizer {

// A compiled PCRE2 pattern (UTF, UCP, JIT where available).
class Regex {
 public:
  static Result<std::unique_ptr<Regex>> Compile(std::string_view pattern, bool literal);
  ~Regex();
  // Appends [start, end) of each non-overlapping match in s (valid UTF-8).
  Status FindAll(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  Regex() = default;
  void* code_ = nullptr;  // pcre2_code_8
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual Result<std::string> Apply(std::string text) const = 0;
};
Result<std::unique_ptr<Normalizer>> ParseNormalizer(const nlohmann::json& j, const std::string& at);

// A piece of text being pre-tokenized; `first` is true for the piece that starts the input.
struct Piece {
  std::string text;
  bool first = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual Status Split(std::vector<Piece>& pieces) const = 0;
};
// Sets *byte_level when the chain ends with a ByteLevel step: its pieces are then raw bytes for a
// byte-level model (the mapping to the byte alphabet is the model's).
Result<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const nlohmann::json& j, const std::string& at,
                                                        bool* byte_level);

// Special-token ids the post-processor puts around a single sequence.
struct PostProcessor {
  std::vector<int32_t> prefix;
  std::vector<int32_t> suffix;
};
// `token_id` resolves a special token's content to its id (-1: unknown).
Result<PostProcessor> ParsePostProcessor(const nlohmann::json& j, const std::string& at);

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual Status Decode(std::vector<std::string>& tokens) const = 0;
};
Result<std::unique_ptr<Decoder>> ParseDecoder(const nlohmann::json& j, const std::string& at);

// Checks that an object has only `known` keys: "tokenizer.json: <at> has key 'x', which is not
// implemented".
Status CheckKeys(const nlohmann::json& j, const std::string& at, std::initializer_list<const char*> known);

}  // namespace kvstream::tokenizer
