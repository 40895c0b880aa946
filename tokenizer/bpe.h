// The BPE model of a Hugging Face tokenizer.json: vocabulary, ranked merges, unknown-token and
// byte-fallback rules, ignore_merges. Input words are either characters (SentencePiece-style
// vocabularies) or raw bytes mapped through the byte-level alphabet (GPT-2 style vocabularies).
//
// Guarantees: Create() checks every merge names known tokens whose concatenation is in the
// vocabulary; Tokenize() appends the ids of one pre-tokenized word, is thread-safe and equals the
// reference's merge order (lowest rank first, leftmost first among equal ranks).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"

namespace kvstream::tokenizer {

struct BpeOptions {
  std::string unk_token;  // empty: characters that are not in the vocabulary are dropped
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
  bool byte_level = false;  // words are raw bytes, vocabulary in the byte-level alphabet
};

class Bpe {
 public:
  static Result<std::unique_ptr<Bpe>> Create(
      std::vector<std::pair<std::string, int32_t>> vocab,
      const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options);

  void Tokenize(std::string_view word, std::vector<int32_t>& out) const;
  // The vocabulary entry of `id`, or nullptr.
  const std::string* Token(int32_t id) const;
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }
  const std::unordered_map<std::string, int32_t>& vocab() const { return vocab_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t id;
  };
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void InitialSymbols(std::string_view word, std::vector<int32_t>& ids) const;
  void AddChar(std::string_view ch, std::vector<int32_t>& ids, int32_t& pending_unk) const;
  void MergeAll(std::vector<int32_t>& ids) const;

  BpeOptions opt_;
  int32_t unk_id_ = -1;
  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_token_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::unordered_map<std::string, int32_t> raw_vocab_;  // byte_level: raw bytes -> id
  std::vector<int32_t> byte_ids_[256];                  // byte_level: initial symbols of a byte
  std::unordered_map<char32_t, int32_t> char_ids_;      // single-character tokens
  int32_t byte_token_ids_[256];                         // "<0xAB>" tokens, or -1

  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace kvstream::tokenizer
