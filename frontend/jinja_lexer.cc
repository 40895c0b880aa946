// The tokenizer of Jinja2's lexer.py with trim_blocks and lstrip_blocks (HF's chat template
// environment): text between tags, whitespace control (-, +), comments, and the tokens inside
// {{ }} and {% %} (end tags only count where brackets are balanced, as in Jinja2).
#include "frontend/jinja_lexer.h"

#include <cctype>
#include <cstring>

namespace kvstream::frontend::jinja {
namespace {

bool IsWs(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

[[noreturn]] void SyntaxError(int line, const std::string& what) {
  Fail(TemplateError::Kind::kSyntax, "syntax error, line " + std::to_string(line) + ": " + what);
}

std::string Normalize(const std::string& in) {
  std::string s;
  s.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '\r') {
      s += '\n';
      if (i + 1 < in.size() && in[i + 1] == '\n') ++i;
    } else {
      s += in[i];
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();  // keep_trailing_newline=False
  return s;
}

int HexVal(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Python's unicode-escape decoding of a string literal's body.
std::string Unescape(const std::string& body, int line) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 >= body.size()) {
      out += body[i];
      continue;
    }
    const char c = body[++i];
    switch (c) {
      case '\n': break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'v': out += '\v'; break;
      case 'x':
      case 'u':
      case 'U': {
        const size_t n = c == 'x' ? 2 : c == 'u' ? 4 : 8;
        uint32_t cp = 0;
        for (size_t k = 0; k < n; ++k) {
          const int h = i + 1 + k < body.size() ? HexVal(body[i + 1 + k]) : -1;
          if (h < 0) SyntaxError(line, std::string("truncated \\") + c + " escape in a string");
          cp = cp * 16 + uint32_t(h);
        }
        if (cp > 0x10FFFF) SyntaxError(line, "escape beyond U+10FFFF in a string");
        out += Encode({cp});
        i += n;
        break;
      }
      case 'N': Unsupported("\\N{...} escapes in strings (line " + std::to_string(line) + ")");
      default:
        if (c >= '0' && c <= '7') {
          uint32_t cp = uint32_t(c - '0');
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7';
               ++k)
            cp = cp * 8 + uint32_t(body[++i] - '0');
          out += Encode({cp});
        } else {
          out += '\\';
          out += c;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(const std::string& src) : s_(Normalize(src)) {}

  std::vector<Token> Run() {
    bool line_starting = true;
    while (pos_ < s_.size()) {
      size_t start = std::string::npos;
      char kind = 0;
      for (size_t p = s_.find('{', pos_); p != std::string::npos; p = s_.find('{', p + 1)) {
        if (p + 1 < s_.size() && std::strchr("{%#", s_[p + 1]) != nullptr) {
          start = p;
          kind = s_[p + 1];
          break;
        }
      }
      if (start == std::string::npos) {
        Emit(Token::kData, s_.substr(pos_));
        break;
      }
      std::string text = s_.substr(pos_, start - pos_);
      const char ctrl = start + 2 < s_.size() && (s_[start + 2] == '-' || s_[start + 2] == '+')
                            ? s_[start + 2]
                            : 0;
      if (ctrl == '-') {
        size_t e = text.size();
        while (e > 0 && IsWs(text[e - 1])) --e;
        text.resize(e);
      } else if (ctrl != '+' && kind != '{') {  // lstrip_blocks: not for {{ }}
        const size_t l = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if (l > 0 || line_starting) {
          bool ws = l < text.size();
          for (size_t k = l; k < text.size(); ++k) ws = ws && IsWs(text[k]);
          if (ws) text.resize(l);
        }
      }
      CountLines(pos_, start);
      Emit(Token::kData, text);
      pos_ = start + 2 + (ctrl ? 1 : 0);
      if (kind == '#') {
        line_starting = Comment();
      } else {
        if (kind == '%') CheckRaw();
        Emit(kind == '{' ? Token::kVarBegin : Token::kBlockBegin, "");
        line_starting = InsideTag(kind == '{' ? '}' : '%');
      }
    }
    tokens_.push_back(Token{Token::kEof, "", line_});
    return std::move(tokens_);
  }

 private:
  void Emit(Token::Kind k, std::string v) {
    if (k == Token::kData && v.empty()) return;
    tokens_.push_back(Token{k, std::move(v), line_});
  }
  void CountLines(size_t from, size_t to) {
    for (size_t k = from; k < to && k < s_.size(); ++k) line_ += s_[k] == '\n';
  }
  bool At(const char* lit) const { return s_.compare(pos_, std::strlen(lit), lit) == 0; }

  // After an end tag: "-" eats all whitespace, "+" none, plain trims one newline (trim_blocks;
  // not after }}). Returns whether the consumed text ended with a newline (Jinja's line_starting).
  bool AfterEnd(char ctrl, bool block) {
    const size_t from = pos_;
    if (ctrl == '-') {
      while (pos_ < s_.size() && IsWs(s_[pos_])) ++pos_;
    } else if (ctrl != '+' && block && pos_ < s_.size() && s_[pos_] == '\n') {
      ++pos_;
    }
    CountLines(from, pos_);
    return pos_ > 0 && s_[pos_ - 1] == '\n';
  }

  bool Comment() {
    for (size_t p = pos_; p + 1 < s_.size(); ++p) {
      char ctrl = 0;
      if ((s_[p] == '+' || s_[p] == '-') && s_.compare(p + 1, 2, "#}") == 0) ctrl = s_[p];
      else if (s_.compare(p, 2, "#}") != 0) continue;
      CountLines(pos_, p);
      pos_ = p + (ctrl ? 3 : 2);
      return AfterEnd(ctrl, true);
    }
    SyntaxError(line_, "missing end of comment tag");
  }

  void CheckRaw() {
    size_t p = pos_;
    while (p < s_.size() && IsWs(s_[p])) ++p;
    if (s_.compare(p, 3, "raw") == 0 && (p + 3 >= s_.size() || !std::isalnum(
                                             static_cast<unsigned char>(s_[p + 3]))))
      Unsupported("the raw tag (line " + std::to_string(line_) + ")");
  }

  bool InsideTag(char close) {
    std::vector<char> balance;
    while (true) {
      while (pos_ < s_.size() && IsWs(s_[pos_])) {
        line_ += s_[pos_] == '\n';
        ++pos_;
      }
      if (pos_ >= s_.size()) SyntaxError(line_, "unexpected end of template inside a tag");
      if (balance.empty()) {
        const std::string end = close == '}' ? "}}" : "%}";
        char ctrl = 0;
        bool hit = false;
        if (close == '%' && At("+%}")) ctrl = '+', hit = true;
        else if (s_[pos_] == '-' && s_.compare(pos_ + 1, 2, end) == 0) ctrl = '-', hit = true;
        else if (s_.compare(pos_, 2, end) == 0) hit = true;
        if (hit) {
          pos_ += ctrl ? 3 : 2;
          Emit(close == '}' ? Token::kVarEnd : Token::kBlockEnd, "");
          return AfterEnd(ctrl, close == '%');
        }
      }
      const char c = s_[pos_];
      if (c == '\'' || c == '"') {
        size_t p = pos_ + 1;
        while (p < s_.size() && s_[p] != c) p += s_[p] == '\\' ? 2 : 1;
        if (p >= s_.size()) SyntaxError(line_, "unterminated string");
        const int at = line_;
        CountLines(pos_, p);
        tokens_.push_back(Token{Token::kString, Unescape(s_.substr(pos_ + 1, p - pos_ - 1), at), at});
        pos_ = p + 1;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        Number();
      } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t p = pos_;
        while (p < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[p])) || s_[p] == '_')) ++p;
        Emit(Token::kName, s_.substr(pos_, p - pos_));
        pos_ = p;
      } else {
        static const char* kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%",
                                     "~", "[", "]", "(", ")", "{", "}", ">", "<", "=", ".", ":",
                                     "|", ",", ";"};
        const char* op = nullptr;
        for (const char* o : kOps)
          if (At(o)) {
            op = o;
            break;
          }
        if (op == nullptr) SyntaxError(line_, std::string("unexpected character '") + c + "'");
        if (*op == '(' || *op == '[' || *op == '{') balance.push_back(*op);
        if (*op == ')' || *op == ']' || *op == '}') {
          const char want = *op == ')' ? '(' : *op == ']' ? '[' : '{';
          if (balance.empty() || balance.back() != want)
            SyntaxError(line_, std::string("unexpected '") + *op + "'");
          balance.pop_back();
        }
        Emit(Token::kOp, op);
        pos_ += std::strlen(op);
      }
    }
  }

  void Number() {
    size_t p = pos_;
    auto digits = [&] {
      const size_t from = p;
      while (p < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[p])) ||
                               (s_[p] == '_' && p > from && p + 1 < s_.size() &&
                                std::isdigit(static_cast<unsigned char>(s_[p + 1])))))
        ++p;
    };
    digits();
    bool is_float = false;
    if (p + 1 < s_.size() && s_[p] == '.' && std::isdigit(static_cast<unsigned char>(s_[p + 1]))) {
      ++p;
      digits();
      is_float = true;
    }
    if (p < s_.size() && (s_[p] == 'e' || s_[p] == 'E')) {
      size_t q = p + 1;
      if (q < s_.size() && (s_[q] == '+' || s_[q] == '-')) ++q;
      if (q < s_.size() && std::isdigit(static_cast<unsigned char>(s_[q]))) {
        p = q;
        digits();
        is_float = true;
      }
    }
    std::string text;
    for (size_t k = pos_; k < p; ++k)
      if (s_[k] != '_') text += s_[k];
    if (!is_float && text.size() > 1 && text[0] == '0' && text.find_first_not_of('0') != std::string::npos)
      Unsupported("integer literals with a leading zero or a base prefix (line " +
                  std::to_string(line_) + ")");
    tokens_.push_back(Token{is_float ? Token::kFloat : Token::kInt, text, line_});
    pos_ = p;
  }

  std::string s_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> Tokenize(const std::string& source) { return Lexer(source).Run(); }

}  // namespace kvstream::frontend::jinja
