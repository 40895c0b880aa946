#include "tokenizer/bpe.h"

#include <cstdio>
#include <queue>

#include "tokenizer/unicode.h"

namespace kvstream::tokenizer {

namespace {
constexpr size_t kCacheWords = 1 << 16;   // cleared when full
constexpr size_t kCacheMaxWordBytes = 256;
constexpr int32_t kMaxId = (1 << 24) - 1;  // far above any served vocabulary
}  // namespace

Result<std::unique_ptr<Bpe>> Bpe::Create(
    std::vector<std::pair<std::string, int32_t>> vocab,
    const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options) {
  auto bpe = std::unique_ptr<Bpe>(new Bpe());
  bpe->opt_ = std::move(options);
  int32_t max_id = -1;
  for (const auto& [tok, id] : vocab) {
    if (id < 0 || id > kMaxId) {
      return InvalidArgument("vocabulary id " + std::to_string(id) + " of token '" + tok +
                             "' is out of range [0, " + std::to_string(kMaxId) + "]");
    }
    if (static_cast<size_t>(id) > 4 * vocab.size() + 1024) {
      return InvalidArgument("vocabulary id " + std::to_string(id) + " is far past the " +
                             std::to_string(vocab.size()) + " entries of the vocabulary");
    }
    max_id = std::max(max_id, id);
  }
  bpe->id_to_token_.resize(static_cast<size_t>(max_id + 1));
  bpe->has_token_.assign(static_cast<size_t>(max_id + 1), false);
  for (auto& [tok, id] : vocab) {
    if (bpe->has_token_[id]) return InvalidArgument("two vocabulary entries have id " + std::to_string(id));
    if (!IsValidUtf8(tok)) return InvalidArgument("vocabulary token " + std::to_string(id) + " is not UTF-8");
    bpe->has_token_[id] = true;
    bpe->id_to_token_[id] = tok;
    bpe->vocab_.emplace(std::move(tok), id);
  }
  if (!bpe->opt_.unk_token.empty()) {
    auto it = bpe->vocab_.find(bpe->opt_.unk_token);
    if (it == bpe->vocab_.end()) {
      return InvalidArgument("unk_token '" + bpe->opt_.unk_token + "' is not in the vocabulary");
    }
    bpe->unk_id_ = it->second;
  }
  bpe->merges_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [a, b] = merges[r];
    auto ia = bpe->vocab_.find(a), ib = bpe->vocab_.find(b), iab = bpe->vocab_.find(a + b);
    if (ia == bpe->vocab_.end() || ib == bpe->vocab_.end()) {
      return InvalidArgument("merge " + std::to_string(r) + " ('" + a + "' '" + b +
                             "') names a token that is not in the vocabulary");
    }
    if (iab == bpe->vocab_.end()) {
      return InvalidArgument("merge " + std::to_string(r) + " ('" + a + "' '" + b +
                             "'): the merged token is not in the vocabulary");
    }
    // A repeated pair takes its last rank, as the reference's map does.
    bpe->merges_[PairKey(ia->second, ib->second)] = Merge{static_cast<int32_t>(r), iab->second};
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = bpe->vocab_.find(name);
    bpe->byte_token_ids_[b] = it == bpe->vocab_.end() ? -1 : it->second;
  }
  for (const auto& [tok, id] : bpe->vocab_) {
    size_t i = 0;
    const char32_t cp = tok.empty() ? 0 : NextCodePoint(tok, i);
    if (!tok.empty() && i == tok.size()) bpe->char_ids_[cp] = id;
  }
  if (bpe->opt_.byte_level) {
    for (const auto& [tok, id] : bpe->vocab_) {
      std::string raw;
      bool ok = true;
      for (size_t i = 0; i < tok.size() && ok;) {
        const int byte = CharToByte(NextCodePoint(tok, i));
        ok = byte >= 0;
        raw.push_back(static_cast<char>(byte));
      }
      if (ok) bpe->raw_vocab_.emplace(std::move(raw), id);
    }
    for (int b = 0; b < 256; ++b) {
      std::string ch;
      AppendUtf8(ch, ByteToChar(static_cast<uint8_t>(b)));
      int32_t pending = -1;
      bpe->AddChar(ch, bpe->byte_ids_[b], pending);
      if (pending >= 0) bpe->byte_ids_[b].push_back(pending);
    }
  }
  return bpe;
}

const std::string* Bpe::Token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_token_[id]) return nullptr;
  return &id_to_token_[id];
}

// One character of a word: its token, else its byte tokens, else <unk> (fused runs when asked),
// else nothing. `pending_unk` holds an unknown run not yet appended (-1 when none).
void Bpe::AddChar(std::string_view ch, std::vector<int32_t>& ids, int32_t& pending_unk) const {
  size_t i = 0;
  const char32_t cp = NextCodePoint(ch, i);
  auto it = char_ids_.find(cp);
  if (it != char_ids_.end()) {
    if (pending_unk >= 0) ids.push_back(pending_unk), pending_unk = -1;
    ids.push_back(it->second);
    return;
  }
  if (opt_.byte_fallback) {
    bool all = true;
    for (const char c : ch) all = all && byte_token_ids_[static_cast<uint8_t>(c)] >= 0;
    if (all) {
      if (pending_unk >= 0) ids.push_back(pending_unk), pending_unk = -1;
      for (const char c : ch) ids.push_back(byte_token_ids_[static_cast<uint8_t>(c)]);
      return;
    }
  }
  if (unk_id_ < 0) return;
  if (pending_unk >= 0 && !opt_.fuse_unk) ids.push_back(pending_unk);
  pending_unk = unk_id_;
}

void Bpe::InitialSymbols(std::string_view word, std::vector<int32_t>& ids) const {
  if (opt_.byte_level) {
    // Unknown runs do not fuse across bytes here: byte-level vocabularies hold every byte.
    for (const char c : word) {
      const auto& v = byte_ids_[static_cast<uint8_t>(c)];
      ids.insert(ids.end(), v.begin(), v.end());
    }
    return;
  }
  int32_t pending = -1;
  for (size_t i = 0; i < word.size();) {
    const size_t start = i;
    i += static_cast<size_t>(Utf8SeqLen(static_cast<uint8_t>(word[i])));
    if (i > word.size()) i = word.size();
    AddChar(word.substr(start, i - start), ids, pending);
  }
  if (pending >= 0) ids.push_back(pending);
}

void Bpe::MergeAll(std::vector<int32_t>& ids) const {
  const size_t n = ids.size();
  if (n < 2) return;
  std::vector<int32_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  struct Cand {
    int32_t rank, pos, id;
    bool operator<(const Cand& o) const {  // min-heap on (rank, pos)
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Cand> q;
  auto push = [&](int32_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    auto it = merges_.find(PairKey(ids[pos], ids[next[pos]]));
    if (it != merges_.end()) q.push(Cand{it->second.rank, pos, it->second.id});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  while (!q.empty()) {
    const Cand c = q.top();
    q.pop();
    if (!alive[c.pos] || next[c.pos] < 0) continue;
    const int32_t right = next[c.pos];
    auto it = merges_.find(PairKey(ids[c.pos], ids[right]));
    if (it == merges_.end() || it->second.id != c.id) continue;  // stale entry
    ids[c.pos] = c.id;
    alive[right] = false;
    next[c.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  size_t w = 0;
  for (int32_t i = 0; i >= 0; i = next[i]) ids[w++] = ids[i];
  ids.resize(w);
}

void Bpe::Tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (opt_.ignore_merges) {
    const auto& map = opt_.byte_level ? raw_vocab_ : vocab_;
    auto it = map.find(std::string(word));
    if (it != map.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  std::string key;
  if (cacheable) {
    key.assign(word);
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  ids.reserve(word.size());
  InitialSymbols(word, ids);
  MergeAll(ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= kCacheWords) cache_.clear();
    cache_.emplace(std::move(key), std::move(ids));
  }
}

}  // namespace kvstream::tokenizer
