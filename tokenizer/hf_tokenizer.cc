// tokenizer.json: added tokens, the encode pipeline (added tokens, normalizer, pre-tokenizer, BPE,
// post-processor) and decoding, as Hugging Face tokenizers does them.
#include <algorithm>
#include <array>

#include <nlohmann/json.hpp>

#include "tokenizer/bpe.h"
#include "tokenizer/hf_pipeline.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace kvstream::tokenizer {

using nlohmann::json;

namespace {

constexpr size_t kMaxAddedTokens = 1 << 20;
constexpr size_t kMaxAddedBytes = 64 << 20;

struct AddedToken {
  int32_t id = -1;
  std::string content;
  std::string decoded;  // what decoding shows: the normalized content for normalized tokens
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

// Leftmost-longest matching of added tokens' texts.
class TokenTrie {
 public:
  void Add(const std::string& text, int32_t index) {
    int32_t node = -1;
    for (const char c : text) {
      const uint8_t b = static_cast<uint8_t>(c);
      int32_t child = Child(node, b);
      if (child < 0) {
        child = static_cast<int32_t>(nodes_.size());
        nodes_.push_back(Node{});
        if (node < 0) root_[b] = child;
        else nodes_[node].next.emplace_back(b, child);
      }
      node = child;
    }
    if (node >= 0) nodes_[node].index = index;
  }
  bool empty() const { return nodes_.empty(); }
  // The token index and end of the longest match starting at `pos`, or -1.
  int32_t LongestAt(std::string_view s, size_t pos, size_t* end) const {
    int32_t node = -1, best = -1;
    for (size_t k = pos; k < s.size(); ++k) {
      node = Child(node, static_cast<uint8_t>(s[k]));
      if (node < 0) break;
      if (nodes_[node].index >= 0) best = nodes_[node].index, *end = k + 1;
    }
    return best;
  }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> next;
    int32_t index = -1;
  };
  int32_t Child(int32_t node, uint8_t b) const {
    if (node < 0) return root_[b];
    for (const auto& [c, n] : nodes_[node].next) {
      if (c == b) return n;
    }
    return -1;
  }
  std::array<int32_t, 256> root_ = [] { std::array<int32_t, 256> a; a.fill(-1); return a; }();
  std::vector<Node> nodes_;
};

// A part of the input: either an added token or text to tokenize.
struct Segment {
  int32_t added = -1;  // index into added_
  size_t begin = 0, end = 0;
};

bool EndsWithWord(std::string_view s) {
  if (s.empty()) return false;
  size_t start = 0;
  return IsAlphanumeric(LastCodePoint(s, start));
}
bool StartsWithWord(std::string_view s) {
  size_t i = 0;
  return !s.empty() && IsAlphanumeric(NextCodePoint(s, i));
}

class HfTokenizer : public Tokenizer {
 public:
  Status Init(const json& j);
  Result<std::vector<int32_t>> Encode(std::string_view text, bool add_special) const override;
  Result<std::string> Decode(std::span<const int32_t> ids, bool skip_special) const override;
  int32_t vocab_size() const override { return vocab_size_; }
  bool IsSpecial(int32_t id) const override {
    auto it = added_by_id_.find(id);
    return it != added_by_id_.end() && added_[it->second].special;
  }
  std::string Describe() const override {
    return std::string("tokenizer.json (BPE") + (byte_level_ ? ", byte-level" : "") + ", " +
           std::to_string(vocab_size_) + " tokens)";
  }

 private:
  Status ParseAddedTokens(const json& j);
  void SplitAdded(std::string_view s, const TokenTrie& trie, std::vector<Segment>& out) const;
  Status EncodeText(std::string text, bool first, std::vector<int32_t>& out) const;

  std::unique_ptr<Bpe> model_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<Decoder> decoder_;
  PostProcessor post_;
  bool byte_level_ = false;
  std::vector<AddedToken> added_;
  std::unordered_map<int32_t, size_t> added_by_id_;
  TokenTrie raw_trie_, normalized_trie_;
  int32_t vocab_size_ = 0;
};

Status Bad(const std::string& what) { return InvalidArgument("tokenizer.json: " + what); }

Result<std::vector<std::pair<std::string, std::string>>> ParseMerges(const json& m) {
  std::vector<std::pair<std::string, std::string>> merges;
  if (!m.is_array()) return Bad("model.merges must be an array");
  merges.reserve(m.size());
  for (size_t i = 0; i < m.size(); ++i) {
    const json& e = m[i];
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        return Bad("merge " + std::to_string(i) + " '" + s + "' is not two tokens separated by one space");
      }
      merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
    } else {
      return Bad("merge " + std::to_string(i) + " is neither \"a b\" nor [\"a\", \"b\"]");
    }
  }
  return merges;
}

Status HfTokenizer::Init(const json& j) {
  if (!j.is_object()) return Bad("the top level must be an object");
  KV_RETURN_IF_ERROR(CheckKeys(j, "top level", {"version", "truncation", "padding", "added_tokens",
                                                "normalizer", "pre_tokenizer", "post_processor", "decoder", "model"}));
  for (const char* k : {"truncation", "padding"}) {
    if (j.contains(k) && !j[k].is_null()) return Bad(std::string("'") + k + "' is set, which is not implemented");
  }
  if (!j.contains("model") || !j["model"].is_object()) return Bad("'model' is missing");
  const json& m = j["model"];
  const std::string type = m.value("type", std::string("BPE"));
  if (type != "BPE") return Bad("model type '" + type + "' is not implemented (BPE is)");
  KV_RETURN_IF_ERROR(CheckKeys(m, "model (BPE)", {"type", "dropout", "unk_token", "continuing_subword_prefix",
                                                  "end_of_word_suffix", "fuse_unk", "byte_fallback", "ignore_merges",
                                                  "vocab", "merges"}));
  if (m.contains("dropout") && !m["dropout"].is_null() && !(m["dropout"].is_number() && m["dropout"].get<double>() == 0.0)) {
    return Bad("model.dropout is set, which is not implemented");
  }
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (m.contains(k) && !m[k].is_null() && !(m[k].is_string() && m[k].get<std::string>().empty())) {
      return Bad(std::string("model.") + k + " is set, which is not implemented");
    }
  }
  if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null()) {
    KV_ASSIGN_OR_RETURN(pre_tokenizer_, ParsePreTokenizer(j["pre_tokenizer"], "pre_tokenizer", &byte_level_));
  }
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    KV_ASSIGN_OR_RETURN(normalizer_, ParseNormalizer(j["normalizer"], "normalizer"));
  }
  if (j.contains("decoder") && !j["decoder"].is_null()) {
    KV_ASSIGN_OR_RETURN(decoder_, ParseDecoder(j["decoder"], "decoder"));
  }
  if (j.contains("post_processor") && !j["post_processor"].is_null()) {
    KV_ASSIGN_OR_RETURN(post_, ParsePostProcessor(j["post_processor"], "post_processor"));
  }
  BpeOptions opt;
  opt.byte_level = byte_level_;
  for (auto [key, field] : {std::pair{"fuse_unk", &opt.fuse_unk}, std::pair{"byte_fallback", &opt.byte_fallback},
                            std::pair{"ignore_merges", &opt.ignore_merges}}) {
    if (!m.contains(key) || m[key].is_null()) continue;
    if (!m[key].is_boolean()) return Bad(std::string("model.") + key + " must be true or false");
    *field = m[key].get<bool>();
  }
  if (m.contains("unk_token") && !m["unk_token"].is_null()) {
    if (!m["unk_token"].is_string()) return Bad("model.unk_token must be a string");
    opt.unk_token = m["unk_token"].get<std::string>();
  }
  if (!m.contains("vocab") || !m["vocab"].is_object()) return Bad("model.vocab must be an object");
  std::vector<std::pair<std::string, int32_t>> vocab;
  vocab.reserve(m["vocab"].size());
  for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > INT32_MAX) {
      return Bad("vocabulary entry '" + it.key() + "' has no valid id");
    }
    vocab.emplace_back(it.key(), static_cast<int32_t>(it->get<int64_t>()));
  }
  KV_ASSIGN_OR_RETURN(auto merges, ParseMerges(m.contains("merges") ? m["merges"] : json::array()));
  KV_ASSIGN_OR_RETURN(model_, Bpe::Create(std::move(vocab), merges, opt));
  vocab_size_ = model_->max_id() + 1;
  KV_RETURN_IF_ERROR(ParseAddedTokens(j.contains("added_tokens") ? j["added_tokens"] : json::array()));
  for (const auto* ids : {&post_.prefix, &post_.suffix}) {
    for (const int32_t id : *ids) {
      if (id >= vocab_size_) return Bad("post_processor names id " + std::to_string(id) + ", past the vocabulary");
    }
  }
  return OkStatus();
}

Status HfTokenizer::ParseAddedTokens(const json& a) {
  if (!a.is_array()) return Bad("'added_tokens' must be an array");
  if (a.size() > kMaxAddedTokens) return Bad("too many added tokens");
  size_t added_bytes = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const json& t = a[i];
    const std::string at = "added_tokens[" + std::to_string(i) + "]";
    if (!t.is_object()) return Bad(at + " must be an object");
    KV_RETURN_IF_ERROR(CheckKeys(t, at, {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"}));
    AddedToken tok;
    if (!t.contains("id") || !t["id"].is_number_unsigned() || t["id"].get<uint64_t>() > static_cast<uint64_t>(vocab_size_) + kMaxAddedTokens) {
      return Bad(at + " has no id, or an id far past the vocabulary");
    }
    tok.id = static_cast<int32_t>(t["id"].get<uint64_t>());
    if (!t.contains("content") || !t["content"].is_string()) return Bad(at + " has no content");
    tok.content = t["content"].get<std::string>();
    if (tok.content.empty() || !IsValidUtf8(tok.content)) return Bad(at + " has empty or non-UTF-8 content");
    added_bytes += tok.content.size();
    if (added_bytes > kMaxAddedBytes) return Bad("added tokens hold more than 64 MiB of text");
    for (auto [key, field] : {std::pair{"special", &tok.special}, std::pair{"lstrip", &tok.lstrip},
                              std::pair{"rstrip", &tok.rstrip}, std::pair{"single_word", &tok.single_word},
                              std::pair{"normalized", &tok.normalized}}) {
      if (t.contains(key) && !t[key].is_boolean()) return Bad(at + "." + key + " must be true or false");
      *field = t.value(key, false);
    }
    tok.decoded = tok.content;
    if (tok.normalized && normalizer_) {
      KV_ASSIGN_OR_RETURN(tok.decoded, normalizer_->Apply(tok.content));
    }
    const std::string* in_model = model_->Token(tok.id);
    if (in_model != nullptr && *in_model != tok.content) {
      return Bad(at + " has id " + std::to_string(tok.id) + ", which the vocabulary gives to another token");
    }
    if (added_by_id_.count(tok.id)) return Bad(at + " repeats id " + std::to_string(tok.id));
    vocab_size_ = std::max(vocab_size_, tok.id + 1);
    added_by_id_[tok.id] = added_.size();
    // Special and non-normalized tokens match the raw text; the others the normalized text.
    if (tok.normalized) normalized_trie_.Add(tok.decoded, static_cast<int32_t>(added_.size()));
    else raw_trie_.Add(tok.content, static_cast<int32_t>(added_.size()));
    added_.push_back(std::move(tok));
  }
  return OkStatus();
}

// Finds added tokens in s (leftmost, longest), honouring single_word, lstrip and rstrip.
void HfTokenizer::SplitAdded(std::string_view s, const TokenTrie& trie, std::vector<Segment>& out) const {
  if (trie.empty()) {
    out.push_back(Segment{-1, 0, s.size()});
    return;
  }
  size_t done = 0, pos = 0;
  while (pos < s.size()) {
    size_t stop = 0;
    const int32_t idx = trie.LongestAt(s, pos, &stop);
    if (idx < 0) {
      ++pos;
      continue;
    }
    const AddedToken& t = added_[idx];
    size_t start = pos;
    pos = stop;
    if (t.single_word && (EndsWithWord(s.substr(0, start)) || StartsWithWord(s.substr(stop)))) continue;
    if (t.lstrip) {
      size_t b = start;
      while (b > 0) {
        size_t cs = 0;
        if (!IsWhitespace(LastCodePoint(s.substr(0, b), cs))) break;
        b = cs;
      }
      start = std::max(b, done);
    }
    if (t.rstrip) {
      while (stop < s.size()) {
        size_t k = stop;
        if (!IsWhitespace(NextCodePoint(s, k))) break;
        stop = k;
      }
      pos = stop;
    }
    if (start > done) out.push_back(Segment{-1, done, start});
    out.push_back(Segment{idx, start, stop});
    done = stop;
  }
  if (done < s.size()) out.push_back(Segment{-1, done, s.size()});
}

Status HfTokenizer::EncodeText(std::string text, bool first, std::vector<int32_t>& out) const {
  std::vector<Piece> pieces;
  pieces.push_back(Piece{std::move(text), first});
  if (pre_tokenizer_) KV_RETURN_IF_ERROR(pre_tokenizer_->Split(pieces));
  for (const auto& p : pieces) model_->Tokenize(p.text, out);
  return OkStatus();
}

Result<std::vector<int32_t>> HfTokenizer::Encode(std::string_view text, bool add_special) const {
  if (!IsValidUtf8(text)) return InvalidArgument("text to encode is not valid UTF-8");
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special) ids.insert(ids.end(), post_.prefix.begin(), post_.prefix.end());
  std::vector<Segment> raw;
  SplitAdded(text, raw_trie_, raw);
  std::vector<Segment> inner;
  for (const Segment& seg : raw) {
    if (seg.added >= 0) {
      ids.push_back(added_[seg.added].id);
      continue;
    }
    std::string part(text.substr(seg.begin, seg.end - seg.begin));
    if (normalizer_) {
      KV_ASSIGN_OR_RETURN(part, normalizer_->Apply(std::move(part)));
    }
    inner.clear();
    SplitAdded(part, normalized_trie_, inner);
    for (const Segment& s : inner) {
      if (s.added >= 0) {
        ids.push_back(added_[s.added].id);
      } else if (s.end > s.begin) {
        KV_RETURN_IF_ERROR(EncodeText(part.substr(s.begin, s.end - s.begin), seg.begin == 0 && s.begin == 0, ids));
      }
    }
  }
  if (add_special) ids.insert(ids.end(), post_.suffix.begin(), post_.suffix.end());
  return ids;
}

Result<std::string> HfTokenizer::Decode(std::span<const int32_t> ids, bool skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int32_t id : ids) {
    auto it = added_by_id_.find(id);
    if (it != added_by_id_.end()) {
      const AddedToken& t = added_[it->second];
      if (!(skip_special && t.special)) tokens.push_back(t.decoded);
      continue;
    }
    const std::string* tok = model_->Token(id);
    if (tok == nullptr) return InvalidArgument("token id " + std::to_string(id) + " is not in the vocabulary");
    tokens.push_back(*tok);
  }
  if (!decoder_) {
    std::string all;
    for (size_t i = 0; i < tokens.size(); ++i) all += (i ? " " : "") + tokens[i];
    return all;
  }
  KV_RETURN_IF_ERROR(decoder_->Decode(tokens));
  std::string all;
  for (const auto& t : tokens) all += t;
  return all;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromHfJson(std::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument("tokenizer.json is not valid JSON");
  auto t = std::make_unique<HfTokenizer>();
  KV_RETURN_IF_ERROR(t->Init(j));
  return std::unique_ptr<Tokenizer>(std::move(t));
}

}  // namespace kvstream::tokenizer
