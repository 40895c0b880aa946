#include "tokenizer/hf_pipeline.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

#include "tokenizer/unicode.h"

namespace kvstream::tokenizer {

using nlohmann::json;

namespace {

constexpr uint32_t kMatchLimit = 10'000'000;  // a hostile pattern fails instead of hanging
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const std::string kMetaspace = "\xE2\x96\x81";  // U+2581

Status Bad(const std::string& at, const std::string& what) {
  return InvalidArgument("tokenizer.json: " + at + ": " + what);
}

Result<std::string> GetString(const json& j, const std::string& at, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return Bad(at, std::string("'") + key + "' must be a string");
  return it->get<std::string>();
}

Result<bool> GetBool(const json& j, const std::string& at, const char* key, bool dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_boolean()) return Bad(at, std::string("'") + key + "' must be true or false");
  return it->get<bool>();
}

Result<std::string> GetType(const json& j, const std::string& at) {
  if (!j.is_object()) return Bad(at, "must be an object");
  return GetString(j, at, "type");
}

// {"String": "..."} or {"Regex": "..."}: the pattern and whether it is literal.
Result<std::pair<std::string, bool>> GetPattern(const json& j, const std::string& at) {
  auto it = j.find("pattern");
  if (it == j.end() || !it->is_object() || it->size() != 1) {
    return Bad(at, "'pattern' must be {\"String\": ...} or {\"Regex\": ...}");
  }
  if (it->contains("String") && (*it)["String"].is_string()) return std::pair{(*it)["String"].get<std::string>(), true};
  if (it->contains("Regex") && (*it)["Regex"].is_string()) return std::pair{(*it)["Regex"].get<std::string>(), false};
  return Bad(at, "'pattern' must be {\"String\": ...} or {\"Regex\": ...}");
}

// Replaces every match of `re` in `s` with `content`.
Result<std::string> ReplaceAll(const Regex& re, const std::string& s, const std::string& content) {
  std::vector<std::pair<size_t, size_t>> m;
  KV_RETURN_IF_ERROR(re.FindAll(s, m));
  if (m.empty()) return s;
  std::string out;
  size_t last = 0;
  for (const auto& [b, e] : m) {
    out.append(s, last, b - last);
    out.append(content);
    last = e;
  }
  out.append(s, last, std::string::npos);
  return out;
}

// ---- normalizers ----

class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(NormalForm f) : form_(f) {}
  Result<std::string> Apply(std::string text) const override { return Normalize(form_, text); }
 private:
  NormalForm form_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string p) : prepend_(std::move(p)) {}
  Result<std::string> Apply(std::string text) const override {
    return text.empty() ? text : prepend_ + text;
  }
 private:
  std::string prepend_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(std::unique_ptr<Regex> re, std::string content)
      : re_(std::move(re)), content_(std::move(content)) {}
  Result<std::string> Apply(std::string text) const override { return ReplaceAll(*re_, text, content_); }
 private:
  std::unique_ptr<Regex> re_;
  std::string content_;
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> s) : steps_(std::move(s)) {}
  Result<std::string> Apply(std::string text) const override {
    for (const auto& s : steps_) {
      KV_ASSIGN_OR_RETURN(text, s->Apply(std::move(text)));
    }
    return text;
  }
 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

// ---- pre-tokenizers ----

// Splits each piece at the matches of a pattern; matches and the text between them become pieces
// (behavior Isolated) or only the text between them (Removed).
class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<Regex> re, bool removed) : re_(std::move(re)), removed_(removed) {}
  Status Split(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    out.reserve(pieces.size() * 4);
    std::vector<std::pair<size_t, size_t>> m;
    for (auto& p : pieces) {
      m.clear();
      KV_RETURN_IF_ERROR(re_->FindAll(p.text, m));
      size_t last = 0;
      auto emit = [&](size_t b, size_t e) {
        if (e > b) out.push_back(Piece{p.text.substr(b, e - b), p.first && b == 0});
      };
      for (const auto& [b, e] : m) {
        emit(last, b);
        if (!removed_) emit(b, e);
        last = e;
      }
      emit(last, p.text.size());
    }
    pieces = std::move(out);
    return OkStatus();
  }
 private:
  std::unique_ptr<Regex> re_;
  bool removed_;
};

// The byte-level step: pieces stay raw bytes (the model maps them); optionally a leading space and
// GPT-2's split first.
class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Regex> re)
      : add_prefix_space_(add_prefix_space), split_(re ? std::make_unique<SplitPreTokenizer>(std::move(re), false) : nullptr) {}
  Status Split(std::vector<Piece>& pieces) const override {
    if (add_prefix_space_) {
      for (auto& p : pieces) {
        if (p.text.empty() || p.text[0] != ' ') p.text.insert(0, 1, ' ');
      }
    }
    return split_ ? split_->Split(pieces) : OkStatus();
  }
 private:
  bool add_prefix_space_;
  std::unique_ptr<SplitPreTokenizer> split_;
};

enum class Prepend { kAlways, kFirst, kNever };

Result<Prepend> ParsePrependScheme(const json& j, const std::string& at) {
  if (j.contains("prepend_scheme")) {
    KV_ASSIGN_OR_RETURN(std::string s, GetString(j, at, "prepend_scheme"));
    if (s == "always") return Prepend::kAlways;
    if (s == "first") return Prepend::kFirst;
    if (s == "never") return Prepend::kNever;
    return Bad(at, "prepend_scheme '" + s + "' is not implemented");
  }
  KV_ASSIGN_OR_RETURN(bool add, GetBool(j, at, "add_prefix_space", true));
  return add ? Prepend::kAlways : Prepend::kNever;
}

Result<std::string> ParseReplacement(const json& j, const std::string& at) {
  KV_ASSIGN_OR_RETURN(std::string r, GetString(j, at, "replacement"));
  size_t i = 0;
  if (r.empty() || !IsValidUtf8(r) || (NextCodePoint(r, i), i != r.size())) {
    return Bad(at, "'replacement' must be one character");
  }
  return r;
}

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string rep, Prepend scheme, bool split)
      : rep_(std::move(rep)), scheme_(scheme), split_(split) {}
  Status Split(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    for (auto& p : pieces) {
      std::string t;
      for (const char c : p.text) {
        if (c == ' ') t += rep_;
        else t.push_back(c);
      }
      const bool starts = t.compare(0, rep_.size(), rep_) == 0;
      if (!starts && (scheme_ == Prepend::kAlways || (scheme_ == Prepend::kFirst && p.first))) t.insert(0, rep_);
      if (!split_) {
        out.push_back(Piece{std::move(t), p.first});
        continue;
      }
      // Each replacement character starts a new piece (merged with what follows it).
      size_t b = 0;
      for (size_t k = t.find(rep_, 1); k != std::string::npos; k = t.find(rep_, k + 1)) {
        out.push_back(Piece{t.substr(b, k - b), p.first && b == 0});
        b = k;
      }
      if (b < t.size()) out.push_back(Piece{t.substr(b), p.first && b == 0});
    }
    pieces = std::move(out);
    return OkStatus();
  }
 private:
  std::string rep_;
  Prepend scheme_;
  bool split_;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> s) : steps_(std::move(s)) {}
  Status Split(std::vector<Piece>& pieces) const override {
    for (const auto& s : steps_) KV_RETURN_IF_ERROR(s->Split(pieces));
    return OkStatus();
  }
 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

// ---- decoders ----

class ByteLevelDecoder : public Decoder {
 public:
  Status Decode(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const auto& t : tokens) {
      const size_t mark = bytes.size();
      bool mapped = true;
      for (size_t i = 0; i < t.size() && mapped;) {
        const int b = CharToByte(NextCodePoint(t, i));
        mapped = b >= 0;
        bytes.push_back(static_cast<char>(b));
      }
      if (!mapped) {  // a token outside the byte alphabet (an added token) stands for itself
        bytes.resize(mark);
        bytes.append(t);
      }
    }
    tokens.assign(1, Utf8Lossy(bytes));
    return OkStatus();
  }
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string rep, Prepend scheme) : rep_(std::move(rep)), scheme_(scheme) {}
  Status Decode(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& t = tokens[i];
      for (size_t k = 0; k < t.size();) {
        if (t.compare(k, rep_.size(), rep_) == 0) {
          if (i != 0 || scheme_ == Prepend::kNever) out.push_back(' ');
          k += rep_.size();
        } else {
          out.push_back(t[k++]);
        }
      }
      tokens[i] = std::move(out);
    }
    return OkStatus();
  }
 private:
  std::string rep_;
  Prepend scheme_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(std::string from, std::string to) : from_(std::move(from)), to_(std::move(to)) {}
  Status Decode(std::vector<std::string>& tokens) const override {
    if (from_.empty()) return OkStatus();
    for (auto& t : tokens) {
      std::string out;
      size_t last = 0;
      for (size_t k = t.find(from_); k != std::string::npos; k = t.find(from_, last)) {
        out.append(t, last, k - last);
        out.append(to_);
        last = k + from_.size();
      }
      out.append(t, last, std::string::npos);
      t = std::move(out);
    }
    return OkStatus();
  }
 private:
  std::string from_, to_;
};

// Runs of <0xAB> tokens become their bytes when those form UTF-8, else one U+FFFD per token.
class ByteFallbackDecoder : public Decoder {
 public:
  Status Decode(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string run;
    size_t run_len = 0;
    auto flush = [&] {
      if (run_len == 0) return;
      if (IsValidUtf8(run)) {
        out.push_back(run);
      } else {
        for (size_t k = 0; k < run_len; ++k) out.push_back("\xEF\xBF\xBD");
      }
      run.clear();
      run_len = 0;
    };
    for (auto& t : tokens) {
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && IsHex(t[3]) && IsHex(t[4])) {
        run.push_back(static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16)));
        ++run_len;
        continue;
      }
      flush();
      out.push_back(std::move(t));
    }
    flush();
    tokens = std::move(out);
    return OkStatus();
  }
 private:
  static bool IsHex(char c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F') || (c >= 'a' && c <= 'f'); }
};

class FuseDecoder : public Decoder {
 public:
  Status Decode(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
    return OkStatus();
  }
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  Status Decode(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      size_t b = 0, e = t.size();
      for (size_t k = 0; k < start_ && t.compare(b, content_.size(), content_) == 0 && b < e; ++k) b += content_.size();
      for (size_t k = 0; k < stop_ && e >= b + content_.size() &&
                         t.compare(e - content_.size(), content_.size(), content_) == 0; ++k) {
        e -= content_.size();
      }
      t = t.substr(b, e - b);
    }
    return OkStatus();
  }
 private:
  std::string content_;
  size_t start_, stop_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> s) : steps_(std::move(s)) {}
  Status Decode(std::vector<std::string>& tokens) const override {
    for (const auto& s : steps_) KV_RETURN_IF_ERROR(s->Decode(tokens));
    return OkStatus();
  }
 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

Result<const json*> GetArray(const json& j, const std::string& at, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_array()) return Bad(at, std::string("'") + key + "' must be an array");
  if (it->size() > 64) return Bad(at, std::string("'") + key + "' has more than 64 steps");
  return &*it;
}

}  // namespace

// ---- Regex ----

Result<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern, bool literal) {
  if (!IsValidUtf8(pattern)) return InvalidArgument("tokenizer.json: a pattern is not UTF-8");
  int err = 0;
  PCRE2_SIZE off = 0;
  const uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), opts,
                                   &err, &off, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return InvalidArgument("tokenizer.json: pattern '" + std::string(pattern) + "' does not compile at offset " +
                           std::to_string(off) + ": " + reinterpret_cast<const char*>(msg));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // without JIT (unsupported CPU) matching still works
  auto re = std::unique_ptr<Regex>(new Regex());
  re->code_ = code;
  return re;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

namespace {
struct MatchScratch {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* ctx = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
  MatchScratch() {
    pcre2_set_match_limit(ctx, kMatchLimit);
    if (stack != nullptr) pcre2_jit_stack_assign(ctx, nullptr, stack);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(ctx);
    pcre2_match_data_free(data);
  }
};
}  // namespace

Status Regex::FindAll(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
  thread_local MatchScratch scratch;
  auto* code = static_cast<pcre2_code*>(code_);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t pos = 0;
  while (pos <= s.size()) {
    const int rc = pcre2_match(code, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, scratch.data, scratch.ctx);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      return InvalidArgument(std::string("tokenizer pattern failed to match: ") + reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.data);
    if (ov[1] > ov[0]) {
      out.emplace_back(ov[0], ov[1]);
      pos = ov[1];
    } else {  // an empty match: no piece; go on after the next character
      if (ov[0] >= s.size()) break;
      pos = ov[0] + static_cast<size_t>(Utf8SeqLen(static_cast<unsigned char>(s[ov[0]])));
    }
  }
  return OkStatus();
}

// ---- parsing ----

Status CheckKeys(const json& j, const std::string& at, std::initializer_list<const char*> known) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool ok = false;
    for (const char* k : known) ok = ok || it.key() == k;
    if (!ok) return Bad(at, "has key '" + it.key() + "', which is not implemented");
  }
  return OkStatus();
}

Result<std::unique_ptr<Normalizer>> ParseNormalizer(const json& j, const std::string& at) {
  KV_ASSIGN_OR_RETURN(std::string type, GetType(j, at));
  const std::string here = at + " (" + type + ")";
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    KV_RETURN_IF_ERROR(CheckKeys(j, here, {"type"}));
    const NormalForm f = type == "NFC" ? NormalForm::kNfc : type == "NFD" ? NormalForm::kNfd
                       : type == "NFKC" ? NormalForm::kNfkc : NormalForm::kNfkd;
    return std::unique_ptr<Normalizer>(new UnicodeNormalizer(f));
  }
  if (type == "Sequence") {
    KV_RETURN_IF_ERROR(CheckKeys(j, here, {"type", "normalizers"}));
    KV_ASSIGN_OR_RETURN(const json* arr, GetArray(j, here, "normalizers"));
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (size_t i = 0; i < arr->size(); ++i) {
      KV_ASSIGN_OR_RETURN(auto s, ParseNormalizer((*arr)[i], here + ".normalizers[" + std::to_string(i) + "]"));
      steps.push_back(std::move(s));
    }
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(steps)));
  }
  if (type == "Prepend") {
    KV_RETURN_IF_ERROR(CheckKeys(j, here, {"type", "prepend"}));
    KV_ASSIGN_OR_RETURN(std::string p, GetString(j, here, "prepend"));
    if (!IsValidUtf8(p)) return Bad(here, "'prepend' is not UTF-8");
    return std::unique_ptr<Normalizer>(new PrependNormalizer(std::move(p)));
  }
  if (type == "Replace") {
    KV_RETURN_IF_ERROR(CheckKeys(j, here, {"type", "pattern", "content"}));
    KV_ASSIGN_OR_RETURN(auto pat, GetPattern(j, here));
    KV_ASSIGN_OR_RETURN(std::string content, GetString(j, here, "content"));
    if (!IsValidUtf8(content)) return Bad(here, "'content' is not UTF-8");
    KV_ASSIGN_OR_RETURN(auto re, Regex::Compile(pat.first, pat.second));
    return std::unique_ptr<Normalizer>(new ReplaceNormalizer(std::move(re), std::move(content)));
  }
  return Bad(here, "normalizer type '" + type + "' is not implemented");
}

Result<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const json& j, const std::string& at, bool* byte_level) {
  KV_ASSIGN_OR_RETURN(std::string type, GetType(j, at));
  const std::string here = at + " (" + type + ")";
  *byte_level = false;
  if (type == "Sequence") {
    KV_RETURN_IF_ERROR(CheckKeys(j, here, {"type", "pretokenizers"}));
    KV_ASSIGN_OR_RETURN(const json* arr, GetArray(j, here, "pretokenizers"));
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t i = 0; i < arr->size(); ++i) {
      if (*byte_level) return Bad(here, "a step after ByteLevel is not implemented");
      KV_ASSIGN_OR_RETURN(auto s, ParsePreTokenizer((*arr)[i], here + ".pretokenizers[" + std::to_string(i) + "]", byte_level));
      steps.push_back(std::move(s));
    }
    return std::unique_ptr<PreTokenizer>(new SequencePreTokenizer(std::move(steps)));
  }
  if (type == "Split") {
    KV_RETURN_IF_ERROR(CheckKeys(j, here, {"type", "pattern", "behavior", "invert"}));
    KV_ASSIGN_OR_RETURN(auto pat, GetPattern(j, here));
    KV_ASSIGN_OR_RETURN(std::string behavior, GetString(j, here, "behavior"));
    KV_ASSIGN_OR_RETURN(bool invert, GetBool(j, here, "invert", false));
    if (invert) return Bad(here, "invert: true is not implemented");
    if (behavior != "Isolated" && behavior != "Removed") return Bad(here, "behavior '" + behavior + "' is not implemented");
    KV_ASSIGN_OR_RETURN(auto re, Regex::Compile(pat.first, pat.second));
    return std::unique_ptr<PreTokenizer>(new SplitPreTokenizer(std::move(re), behavior == "Removed"));
  }
  if (type == "ByteLevel") {
    KV_RETURN_IF_ERROR(CheckKeys(j, here, {"type", "add_prefix_space", "trim_offsets", "use_regex"}));
    KV_ASSIGN_OR_RETURN(bool prefix, GetBool(j, here, "add_prefix_space", true));
    KV_ASSIGN_OR_RETURN(bool use_regex, GetBool(j, here, "use_regex", true));
    KV_ASSIGN_OR_RETURN(bool trim, GetBool(j, here, "trim_offsets", true));
    (void)trim;  // offsets only
    std::unique_ptr<Regex> re;
    if (use_regex) {
      KV_ASSIGN_OR_RETURN(re, Regex::Compile(kGpt2Pattern, false));
    }
    *byte_level = true;
    return std::unique_ptr<PreTokenizer>(new ByteLevelPreTokenizer(prefix, std::move(re)));
  }
  if (type == "Metaspace") {
    KV_RETURN_IF_ERROR(CheckKeys(j, here, {"type", "replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"}));
    KV_ASSIGN_OR_RETURN(std::string rep, ParseReplacement(j, here));
    KV_ASSIGN_OR_RETURN(Prepend scheme, ParsePrependScheme(j, here));
    KV_ASSIGN_OR_RETURN(bool split, GetBool(j, here, "split", true));
    return std::unique_ptr<PreTokenizer>(new MetaspacePreTokenizer(std::move(rep), scheme, split));
  }
  return Bad(here, "pre-tokenizer type '" + type + "' is not implemented");
}

Result<PostProcessor> ParsePostProcessor(const json& j, const std::string& at) {
  KV_ASSIGN_OR_RETURN(std::string type, GetType(j, at));
  const std::string here = at + " (" + type + ")";
  if (type == "ByteLevel") {  // offsets only
    KV_RETURN_IF_ERROR(CheckKeys(j, here, {"type", "add_prefix_space", "trim_offsets", "use_regex"}));
    return PostProcessor{};
  }
  if (type == "Sequence") {
    KV_RETURN_IF_ERROR(CheckKeys(j, here, {"type", "processors"}));
    KV_ASSIGN_OR_RETURN(const json* arr, GetArray(j, here, "processors"));
    PostProcessor all;
    for (size_t i = 0; i < arr->size(); ++i) {
      KV_ASSIGN_OR_RETURN(PostProcessor p, ParsePostProcessor((*arr)[i], here + ".processors[" + std::to_string(i) + "]"));
      if ((!p.prefix.empty() || !p.suffix.empty()) && (!all.prefix.empty() || !all.suffix.empty())) {
        return Bad(here, "two templates in one sequence are not implemented");
      }
      all.prefix.insert(all.prefix.end(), p.prefix.begin(), p.prefix.end());
      all.suffix.insert(all.suffix.end(), p.suffix.begin(), p.suffix.end());
    }
    return all;
  }
  if (type != "TemplateProcessing") return Bad(here, "post-processor type '" + type + "' is not implemented");
  KV_RETURN_IF_ERROR(CheckKeys(j, here, {"type", "single", "pair", "special_tokens"}));
  auto single = j.find("single");
  auto specials = j.find("special_tokens");
  if (single == j.end() || !single->is_array()) return Bad(here, "'single' must be an array");
  if (specials == j.end() || !specials->is_object()) return Bad(here, "'special_tokens' must be an object");
  PostProcessor p;
  bool seen_a = false;
  for (const auto& item : *single) {
    if (item.is_object() && item.size() == 1 && item.contains("Sequence") && item["Sequence"].is_object()) {
      const json& s = item["Sequence"];
      if (!s.contains("id") || s["id"] != "A" || seen_a) return Bad(here, "'single' must hold sequence A once");
      seen_a = true;
      continue;
    }
    if (!item.is_object() || item.size() != 1 || !item.contains("SpecialToken") || !item["SpecialToken"].is_object() ||
        !item["SpecialToken"].contains("id") || !item["SpecialToken"]["id"].is_string()) {
      return Bad(here, "an item of 'single' is neither {\"Sequence\"} nor {\"SpecialToken\"}");
    }
    const std::string name = item["SpecialToken"]["id"].get<std::string>();
    auto sp = specials->find(name);
    if (sp == specials->end() || !sp->is_object() || !sp->contains("ids") || !(*sp)["ids"].is_array()) {
      return Bad(here, "special token '" + name + "' has no ids in 'special_tokens'");
    }
    for (const auto& id : (*sp)["ids"]) {
      if (!id.is_number_unsigned() || id.get<uint64_t>() > INT32_MAX) return Bad(here, "special token '" + name + "' has a bad id");
      (seen_a ? p.suffix : p.prefix).push_back(static_cast<int32_t>(id.get<uint64_t>()));
    }
  }
  if (!seen_a) return Bad(here, "'single' has no sequence A");
  return p;
}

Result<std::unique_ptr<Decoder>> ParseDecoder(const json& j, const std::string& at) {
  KV_ASSIGN_OR_RETURN(std::string type, GetType(j, at));
  const std::string here = at + " (" + type + ")";
  if (type == "ByteLevel") {
    KV_RETURN_IF_ERROR(CheckKeys(j, here, {"type", "add_prefix_space", "trim_offsets", "use_regex"}));
    return std::unique_ptr<Decoder>(new ByteLevelDecoder());
  }
  if (type == "Metaspace") {
    KV_RETURN_IF_ERROR(CheckKeys(j, here, {"type", "replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"}));
    KV_ASSIGN_OR_RETURN(std::string rep, ParseReplacement(j, here));
    KV_ASSIGN_OR_RETURN(Prepend scheme, ParsePrependScheme(j, here));
    return std::unique_ptr<Decoder>(new MetaspaceDecoder(std::move(rep), scheme));
  }
  if (type == "Sequence") {
    KV_RETURN_IF_ERROR(CheckKeys(j, here, {"type", "decoders"}));
    KV_ASSIGN_OR_RETURN(const json* arr, GetArray(j, here, "decoders"));
    std::vector<std::unique_ptr<Decoder>> steps;
    for (size_t i = 0; i < arr->size(); ++i) {
      KV_ASSIGN_OR_RETURN(auto s, ParseDecoder((*arr)[i], here + ".decoders[" + std::to_string(i) + "]"));
      steps.push_back(std::move(s));
    }
    return std::unique_ptr<Decoder>(new SequenceDecoder(std::move(steps)));
  }
  if (type == "Replace") {
    KV_RETURN_IF_ERROR(CheckKeys(j, here, {"type", "pattern", "content"}));
    KV_ASSIGN_OR_RETURN(auto pat, GetPattern(j, here));
    if (!pat.second) return Bad(here, "a Regex pattern in a Replace decoder is not implemented");
    KV_ASSIGN_OR_RETURN(std::string content, GetString(j, here, "content"));
    if (!IsValidUtf8(pat.first) || !IsValidUtf8(content)) return Bad(here, "pattern or content is not UTF-8");
    return std::unique_ptr<Decoder>(new ReplaceDecoder(pat.first, std::move(content)));
  }
  if (type == "ByteFallback" || type == "Fuse") {
    KV_RETURN_IF_ERROR(CheckKeys(j, here, {"type"}));
    if (type == "Fuse") return std::unique_ptr<Decoder>(new FuseDecoder());
    return std::unique_ptr<Decoder>(new ByteFallbackDecoder());
  }
  if (type == "Strip") {
    KV_RETURN_IF_ERROR(CheckKeys(j, here, {"type", "content", "start", "stop"}));
    KV_ASSIGN_OR_RETURN(std::string content, GetString(j, here, "content"));
    size_t n = 0;
    if (content.empty() || !IsValidUtf8(content) || (NextCodePoint(content, n), n != content.size())) {
      return Bad(here, "'content' must be one character");
    }
    const json& s = j.value("start", json(0));
    const json& e = j.value("stop", json(0));
    if (!s.is_number_unsigned() || !e.is_number_unsigned() || s.get<uint64_t>() > 1024 || e.get<uint64_t>() > 1024) {
      return Bad(here, "'start' and 'stop' must be small counts");
    }
    return std::unique_ptr<Decoder>(new StripDecoder(std::move(content), s.get<size_t>(), e.get<size_t>()));
  }
  return Bad(here, "decoder type '" + type + "' is not implemented");
}

}  // namespace kvstream::tokenizer
