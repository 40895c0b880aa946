// Tokenizers of the checkpoints kvstream serves: Hugging Face tokenizer.json (BPE) and
// SentencePiece .model files. Text in, token ids out, and back (docs/tokenizers.md).
//
// Guarantees:
//  - Load() reads a checkpoint folder (tokenizer.json, else tokenizer.model), a tokenizer.json or
//    a .model file. Anything in a tokenizer.json that is not implemented is an error naming it;
//    malformed or hostile files fail with a Status, never crash or allocate without bound.
//  - Encode() equals the reference library's default encoding (special tokens added as its
//    post-processor does: BOS for Llama, none for Qwen2); text must be valid UTF-8.
//  - Decode() equals the reference's decode; an id outside the vocabulary is INVALID_ARGUMENT.
//  - A loaded Tokenizer is immutable; Encode/Decode may be called from many threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kvstream::tokenizer {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  static Result<std::unique_ptr<Tokenizer>> Load(const std::string& path);
  // The tokenizer of what --model names: a checkpoint folder's, else NOT_FOUND saying why (a
  // preset with dummy weights has none; a folder may lack the files).
  static Result<std::unique_ptr<Tokenizer>> ForModel(const std::string& model);
  static Result<std::unique_ptr<Tokenizer>> FromHfJson(std::string_view json);
  static Result<std::unique_ptr<Tokenizer>> FromSentencePiece(std::string_view model_proto);

  virtual Result<std::vector<int32_t>> Encode(std::string_view text,
                                              bool add_special_tokens = true) const = 0;
  virtual Result<std::string> Decode(std::span<const int32_t> ids,
                                     bool skip_special_tokens = false) const = 0;
  // One past the largest id (added tokens included).
  virtual int32_t vocab_size() const = 0;
  // Special (control) tokens: skipped by Decode(..., skip_special_tokens = true).
  virtual bool IsSpecial(int32_t id) const = 0;
  // "tokenizer.json (BPE, byte-level)" or "sentencepiece (bpe)": for logs and the CLI.
  virtual std::string Describe() const = 0;
};

// Incremental decoding of a growing id sequence: Push() returns the text that became final, never
// half a UTF-8 character nor a replacement character that a later token could still complete.
// The concatenation of every Push() and Finish() equals Decode() of all ids.
class DecodeStream {
 public:
  explicit DecodeStream(const Tokenizer& tokenizer, bool skip_special_tokens = true)
      : tok_(tokenizer), skip_special_(skip_special_tokens) {}
  Result<std::string> Push(int32_t id);
  // The text held back so far (an incomplete character at the end decodes as U+FFFD).
  Result<std::string> Finish();

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  size_t prefix_index_ = 0;   // ids_[prefix_index_..read_index_) were emitted; kept as context
  size_t read_index_ = 0;     // ids_[read_index_..) not yet emitted
  std::string prefix_;        // Decode(ids_[prefix_index_..read_index_))
};

}  // namespace kvstream::tokenizer
