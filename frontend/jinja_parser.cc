// Recursive descent over jinja_lexer's tokens, in the order of Jinja2's parser.py: condexpr, or,
// and, not, compare (chained), + -, ~, * / // %, **, unary - +, then postfix (. [] ()) and the
// filter/test chain, which binds tightest.
#include "frontend/jinja_parser.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "frontend/jinja_lexer.h"

namespace kvstream::frontend::jinja {
namespace {

class Parser {
 public:
  Parser(std::vector<Token> tokens, const ParseLimits& limits)
      : t_(std::move(tokens)), limits_(limits) {}

  Body Template() {
    Body body = Subparse({});
    if (Cur().kind != Token::kEof) Error("unexpected tag '" + Next(1).text + "'");
    return body;
  }

 private:
  struct DepthGuard {
    explicit DepthGuard(Parser* p) : p(p) {
      if (++p->depth_ > p->limits_.max_depth)
        Fail(TemplateError::Kind::kLimit, "template nested deeper than " +
                                              std::to_string(p->limits_.max_depth) + " (line " +
                                              std::to_string(p->Cur().line) + ")");
    }
    ~DepthGuard() { --p->depth_; }
    Parser* p;
  };

  const Token& Cur() const { return t_[i_]; }
  const Token& Next(size_t k) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  [[noreturn]] void Error(const std::string& what) const {
    Fail(TemplateError::Kind::kSyntax, "syntax error, line " + std::to_string(Cur().line) + ": " +
                                           what);
  }
  bool IsOp(const char* op) const { return Cur().kind == Token::kOp && Cur().text == op; }
  bool IsName(const char* n) const { return Cur().kind == Token::kName && Cur().text == n; }
  void ExpectOp(const char* op) {
    if (!IsOp(op)) Error(std::string("expected '") + op + "', got " + Describe(Cur()));
    ++i_;
  }
  void ExpectName(const char* n) {
    if (!IsName(n)) Error(std::string("expected '") + n + "', got " + Describe(Cur()));
    ++i_;
  }
  void ExpectBlockEnd() {
    if (Cur().kind != Token::kBlockEnd) Error("expected end of tag, got " + Describe(Cur()));
    ++i_;
  }
  static std::string Describe(const Token& t) {
    switch (t.kind) {
      case Token::kEof: return "end of template";
      case Token::kBlockEnd: return "end of tag";
      case Token::kVarEnd: return "end of print statement";
      case Token::kString: return "a string";
      default: return "'" + t.text + "'";
    }
  }
  std::string NameToken() {
    if (Cur().kind != Token::kName) Error("expected a name, got " + Describe(Cur()));
    return t_[i_++].text;
  }
  ExprPtr Make(Expr::Kind k, std::string name = {}) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = Cur().line;
    e->name = std::move(name);
    return e;
  }

  // Statements until a block tag named in `ends` (left unconsumed: the caller reads it).
  Body Subparse(std::initializer_list<const char*> ends) {
    DepthGuard g(this);
    Body body;
    while (Cur().kind != Token::kEof) {
      const Token& tok = Cur();
      if (tok.kind == Token::kData) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->line = tok.line;
        s->text = tok.text;
        body.push_back(std::move(s));
        ++i_;
      } else if (tok.kind == Token::kVarBegin) {
        ++i_;
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kOutput;
        s->line = tok.line;
        s->exprs.push_back(Tuple(true));
        if (Cur().kind != Token::kVarEnd) Error("expected '}}', got " + Describe(Cur()));
        ++i_;
        body.push_back(std::move(s));
      } else if (tok.kind == Token::kBlockBegin) {
        const Token& name = Next(1);
        for (const char* e : ends)
          if (name.kind == Token::kName && name.text == e) return body;
        ++i_;
        body.push_back(Statement());
      } else {
        Error("unexpected " + Describe(tok));
      }
    }
    if (ends.size() != 0) {
      std::string want;
      for (const char* e : ends) want += std::string(want.empty() ? "'" : ", '") + e + "'";
      Error("unexpected end of template, expected " + want);
    }
    return body;
  }

  StmtPtr Statement() {
    auto s = std::make_unique<Stmt>();
    s->line = Cur().line;
    if (Cur().kind != Token::kName) Error("tag name expected, got " + Describe(Cur()));
    const std::string tag = t_[i_++].text;
    if (tag == "for") return For(std::move(s));
    if (tag == "if") return If(std::move(s));
    if (tag == "set") return Set(std::move(s));
    if (tag == "macro") return Macro(std::move(s));
    if (tag == "break" || tag == "continue") {
      if (loops_ == 0) Error("'" + tag + "' outside a loop");
      s->kind = tag == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      ExpectBlockEnd();
      return s;
    }
    if (tag == "generation") {
      ExpectBlockEnd();
      s->kind = Stmt::Kind::kBlock;
      s->bodies.push_back(Subparse({"endgeneration"}));
      EndTag("endgeneration");
      return s;
    }
    static const char* kKnown[] = {"filter", "call", "include", "import", "from", "extends",
                                   "block", "with", "autoescape", "do", "trans", "print"};
    for (const char* k : kKnown)
      if (tag == k) Unsupported("the '" + tag + "' tag (line " + std::to_string(s->line) + ")");
    Error("unknown tag '" + tag + "'");
  }

  void EndTag(const char* name) {
    ++i_;  // block begin
    ExpectName(name);
    ExpectBlockEnd();
  }

  std::vector<std::string> AssignTargets() {
    std::vector<std::string> names;
    const bool paren = IsOp("(");
    if (paren) ++i_;
    names.push_back(NameToken());
    while (IsOp(",")) {
      ++i_;
      if (Cur().kind != Token::kName) break;
      names.push_back(NameToken());
    }
    if (paren) ExpectOp(")");
    return names;
  }

  StmtPtr For(StmtPtr s) {
    s->kind = Stmt::Kind::kFor;
    s->targets = AssignTargets();
    ExpectName("in");
    s->exprs.push_back(Tuple(false));
    if (IsName("if")) {
      ++i_;
      s->exprs.push_back(Expression(true));
    }
    if (IsName("recursive")) Unsupported("recursive for loops (line " + std::to_string(s->line) + ")");
    ExpectBlockEnd();
    ++loops_;
    s->bodies.push_back(Subparse({"endfor", "else"}));
    --loops_;
    if (Next(1).text == "else") {
      EndTag("else");
      s->bodies.push_back(Subparse({"endfor"}));
    }
    EndTag("endfor");
    return s;
  }

  StmtPtr If(StmtPtr s) {
    s->kind = Stmt::Kind::kIf;
    s->exprs.push_back(Tuple(false));
    ExpectBlockEnd();
    while (true) {
      s->bodies.push_back(Subparse({"elif", "else", "endif"}));
      const std::string tag = Next(1).text;
      i_ += 2;
      if (tag == "elif") {
        s->exprs.push_back(Tuple(false));
        ExpectBlockEnd();
        continue;
      }
      ExpectBlockEnd();
      if (tag == "else") {
        s->bodies.push_back(Subparse({"endif"}));
        EndTag("endif");
      }
      return s;
    }
  }

  StmtPtr Set(StmtPtr s) {
    const std::string first = NameToken();
    if (IsOp(".")) {  // namespace attribute
      ++i_;
      s->kind = Stmt::Kind::kSet;
      s->targets.push_back(first);
      s->text = NameToken();
      ExpectOp("=");
      s->exprs.push_back(Tuple(true));
      ExpectBlockEnd();
      return s;
    }
    s->targets.push_back(first);
    while (IsOp(",")) {
      ++i_;
      if (Cur().kind != Token::kName) break;
      s->targets.push_back(NameToken());
    }
    if (IsOp("=")) {
      ++i_;
      s->kind = Stmt::Kind::kSet;
      s->exprs.push_back(Tuple(true));
      ExpectBlockEnd();
      return s;
    }
    if (IsOp("|")) Unsupported("filtered block set (line " + std::to_string(s->line) + ")");
    if (s->targets.size() != 1) Error("a block set takes one name");
    ExpectBlockEnd();
    s->kind = Stmt::Kind::kSetBlock;
    s->bodies.push_back(Subparse({"endset"}));
    EndTag("endset");
    return s;
  }

  StmtPtr Macro(StmtPtr s) {
    s->kind = Stmt::Kind::kMacro;
    s->text = NameToken();
    ExpectOp("(");
    while (!IsOp(")")) {
      if (!s->targets.empty()) ExpectOp(",");
      if (IsOp(")")) break;
      if (IsOp("*") || IsOp("**")) Unsupported("*args / **kwargs in a macro");
      s->targets.push_back(NameToken());
      if (IsOp("=")) {
        ++i_;
        s->exprs.push_back(Expression(true));
      } else {
        s->exprs.push_back(nullptr);
      }
    }
    ++i_;
    ExpectBlockEnd();
    const int saved = loops_;
    loops_ = 0;
    s->bodies.push_back(Subparse({"endmacro"}));
    loops_ = saved;
    EndTag("endmacro");
    return s;
  }

  // Comma-separated expressions; a tuple when there is a comma. `condexpr`: allow "a if b".
  ExprPtr Tuple(bool condexpr, bool parenthesized = false) {
    auto list = Make(Expr::Kind::kList);
    list->value.tuple = true;
    bool comma = false;
    while (true) {
      if (!list->args.empty()) {
        if (!IsOp(",")) break;
        ++i_;
        comma = true;
      }
      if (Cur().kind == Token::kVarEnd || Cur().kind == Token::kBlockEnd || IsOp(")") ||
          IsName("in") || (IsName("if") && !condexpr) || IsName("recursive"))
        break;
      list->args.push_back(Expression(condexpr));
    }
    if (list->args.empty() && !parenthesized) Error("expected an expression, got " + Describe(Cur()));
    if (!comma && list->args.size() == 1) return std::move(list->args[0]);
    return list;
  }

  ExprPtr Expression(bool condexpr) {
    DepthGuard g(this);
    if (!condexpr) return Or();
    ExprPtr e = Or();
    while (IsName("if")) {
      ++i_;
      auto c = Make(Expr::Kind::kCond);
      c->args.push_back(Or());
      c->args.push_back(std::move(e));
      if (IsName("else")) {
        ++i_;
        c->args.push_back(Expression(true));
      } else {
        c->args.push_back(nullptr);
      }
      e = Grown(std::move(c));
    }
    return e;
  }

  ExprPtr Binary(Expr::Kind k, const std::string& op, ExprPtr a, ExprPtr b) {
    auto e = Make(k, op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return Grown(std::move(e));
  }

  // Sets e's height; evaluating and freeing a tree recurse through it, so it is bounded.
  ExprPtr Grown(ExprPtr e) {
    for (const auto& a : e->args)
      if (a) e->height = std::max(e->height, a->height + 1);
    for (const auto& kv : e->kwargs) e->height = std::max(e->height, kv.second->height + 1);
    if (e->height > limits_.max_height)
      Fail(TemplateError::Kind::kLimit, "expression nested deeper than " +
                                            std::to_string(limits_.max_height) + " (line " +
                                            std::to_string(e->line) + ")");
    return e;
  }

  ExprPtr Or() {
    ExprPtr e = And();
    while (IsName("or")) {
      ++i_;
      e = Binary(Expr::Kind::kOr, "or", std::move(e), And());
    }
    return e;
  }
  ExprPtr And() {
    ExprPtr e = Not();
    while (IsName("and")) {
      ++i_;
      e = Binary(Expr::Kind::kAnd, "and", std::move(e), Not());
    }
    return e;
  }
  ExprPtr Not() {
    if (IsName("not")) {
      DepthGuard g(this);
      ++i_;
      auto e = Make(Expr::Kind::kUnary, "not");
      e->args.push_back(Not());
      return Grown(std::move(e));
    }
    return Compare();
  }

  std::string CompareOp() {
    for (const char* op : {"==", "!=", "<", ">", "<=", ">="})
      if (IsOp(op)) {
        ++i_;
        return op;
      }
    if (IsName("in")) {
      ++i_;
      return "in";
    }
    if (IsName("not") && Next(1).kind == Token::kName && Next(1).text == "in") {
      i_ += 2;
      return "notin";
    }
    return "";
  }

  ExprPtr Compare() {
    ExprPtr left = Math1();
    std::string op = CompareOp();
    if (op.empty()) return left;
    ExprPtr right = Math1();
    std::string op2 = CompareOp();
    if (op2.empty()) return Binary(Expr::Kind::kBinary, op, std::move(left), std::move(right));
    Unsupported("chained comparisons (line " + std::to_string(Cur().line) + ")");
  }

  ExprPtr Math1() {
    ExprPtr e = Concat();
    while (IsOp("+") || IsOp("-")) {
      const std::string op = t_[i_++].text;
      e = Binary(Expr::Kind::kBinary, op, std::move(e), Concat());
    }
    return e;
  }
  ExprPtr Concat() {
    ExprPtr e = Math2();
    while (IsOp("~")) {
      ++i_;
      e = Binary(Expr::Kind::kBinary, "~", std::move(e), Math2());
    }
    return e;
  }
  ExprPtr Math2() {
    ExprPtr e = Pow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const std::string op = t_[i_++].text;
      e = Binary(Expr::Kind::kBinary, op, std::move(e), Pow());
    }
    return e;
  }
  ExprPtr Pow() {
    ExprPtr e = Unary(true);
    while (IsOp("**")) {
      ++i_;
      e = Binary(Expr::Kind::kBinary, "**", std::move(e), Unary(true));
    }
    return e;
  }

  ExprPtr Unary(bool with_filter) {
    DepthGuard g(this);
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      e = Make(Expr::Kind::kUnary, t_[i_++].text);
      e->args.push_back(Unary(false));
      e = Grown(std::move(e));
    } else {
      e = Primary();
    }
    e = Postfix(std::move(e));
    if (with_filter) e = FilterChain(std::move(e));
    return e;
  }

  ExprPtr Primary() {
    const Token& tok = Cur();
    if (tok.kind == Token::kName) {
      ++i_;
      auto e = Make(Expr::Kind::kLiteral);
      if (tok.text == "true" || tok.text == "True") e->value = Value::Bool(true);
      else if (tok.text == "false" || tok.text == "False") e->value = Value::Bool(false);
      else if (tok.text == "none" || tok.text == "None") e->value = Value::None();
      else e = Make(Expr::Kind::kName, tok.text);
      return e;
    }
    if (tok.kind == Token::kString) {
      std::string s;
      while (Cur().kind == Token::kString) s += t_[i_++].text;
      auto e = Make(Expr::Kind::kLiteral);
      e->value = Value::Str(std::move(s));
      return e;
    }
    if (tok.kind == Token::kInt || tok.kind == Token::kFloat) {
      auto e = Make(Expr::Kind::kLiteral);
      errno = 0;
      if (tok.kind == Token::kInt) {
        const long long v = std::strtoll(tok.text.c_str(), nullptr, 10);
        if (errno == ERANGE) Unsupported("integer literal beyond 64 bits");
        e->value = Value::Int(v);
      } else {
        e->value = Value::Float(std::strtod(tok.text.c_str(), nullptr));
      }
      ++i_;
      return e;
    }
    if (IsOp("(")) {
      ++i_;
      ExprPtr e = Tuple(true, true);
      ExpectOp(")");
      return e;
    }
    if (IsOp("[")) {
      ++i_;
      auto e = Make(Expr::Kind::kList);
      while (!IsOp("]")) {
        if (!e->args.empty()) ExpectOp(",");
        if (IsOp("]")) break;
        e->args.push_back(Expression(true));
      }
      ++i_;
      return e;
    }
    if (IsOp("{")) {
      ++i_;
      auto e = Make(Expr::Kind::kDict);
      while (!IsOp("}")) {
        if (!e->args.empty()) ExpectOp(",");
        if (IsOp("}")) break;
        e->args.push_back(Expression(true));
        ExpectOp(":");
        e->args.push_back(Expression(true));
      }
      ++i_;
      return e;
    }
    Error("unexpected " + Describe(tok));
  }

  ExprPtr Postfix(ExprPtr e) {
    while (true) {
      if (IsOp(".")) {
        ++i_;
        if (Cur().kind == Token::kInt) {
          auto idx = Make(Expr::Kind::kLiteral);
          idx->value = Value::Int(std::atoll(t_[i_++].text.c_str()));
          auto item = Make(Expr::Kind::kItem);
          item->args.push_back(std::move(e));
          item->args.push_back(std::move(idx));
          e = Grown(std::move(item));
        } else {
          auto a = Make(Expr::Kind::kAttr, NameToken());
          a->args.push_back(std::move(e));
          e = Grown(std::move(a));
        }
      } else if (IsOp("[")) {
        ++i_;
        e = Subscript(std::move(e));
      } else if (IsOp("(")) {
        e = Call(std::move(e), Expr::Kind::kCall, "");
      } else {
        return e;
      }
    }
  }

  ExprPtr Subscript(ExprPtr target) {
    ExprPtr parts[3];
    int colons = 0;
    if (!IsOp(":")) parts[0] = Expression(true);
    while (IsOp(":") && colons < 2) {
      ++i_;
      ++colons;
      if (!IsOp(":") && !IsOp("]")) parts[colons] = Expression(true);
    }
    if (IsOp(",")) Unsupported("tuple subscripts (line " + std::to_string(Cur().line) + ")");
    ExpectOp("]");
    auto e = Make(colons ? Expr::Kind::kSlice : Expr::Kind::kItem);
    e->args.push_back(std::move(target));
    for (int k = 0; k < (colons ? 3 : 1); ++k) e->args.push_back(std::move(parts[k]));
    return Grown(std::move(e));
  }

  // Adds "(args)" to a call, filter or test node whose args[0] is already `target`.
  ExprPtr Call(ExprPtr target, Expr::Kind kind, std::string name) {
    auto e = Make(kind, std::move(name));
    e->args.push_back(std::move(target));
    ExpectOp("(");
    bool first = true;
    while (!IsOp(")")) {
      if (!first) ExpectOp(",");
      first = false;
      if (IsOp(")")) break;
      if (IsOp("*") || IsOp("**")) Unsupported("*args / **kwargs in a call");
      if (Cur().kind == Token::kName && Next(1).kind == Token::kOp && Next(1).text == "=") {
        std::string key = NameToken();
        ++i_;
        e->kwargs.emplace_back(std::move(key), Expression(true));
      } else {
        if (!e->kwargs.empty()) Error("positional argument after a keyword argument");
        e->args.push_back(Expression(true));
      }
    }
    ++i_;
    return Grown(std::move(e));
  }

  ExprPtr FilterChain(ExprPtr e) {
    while (true) {
      if (IsOp("|")) {
        ++i_;
        std::string name = NameToken();
        while (IsOp(".")) {
          ++i_;
          name += "." + NameToken();
        }
        if (IsOp("(")) {
          e = Call(std::move(e), Expr::Kind::kFilter, name);
        } else {
          auto f = Make(Expr::Kind::kFilter, name);
          f->args.push_back(std::move(e));
          e = Grown(std::move(f));
        }
      } else if (IsName("is")) {
        ++i_;
        bool negated = false;
        if (IsName("not")) {
          ++i_;
          negated = true;
        }
        std::string name = NameToken();
        ExprPtr t;
        if (IsOp("(")) {
          t = Call(std::move(e), Expr::Kind::kTest, name);
        } else {
          t = Make(Expr::Kind::kTest, name);
          t->args.push_back(std::move(e));
          const Token& c = Cur();
          const bool arg_start = c.kind == Token::kName || c.kind == Token::kString ||
                                 c.kind == Token::kInt || c.kind == Token::kFloat || IsOp("(") ||
                                 IsOp("[") || IsOp("{");
          if (arg_start && !IsName("else") && !IsName("or") && !IsName("and")) {
            if (IsName("is")) Error("tests cannot be chained with 'is'");
            t->args.push_back(Postfix(Primary()));
          }
        }
        t->negated = negated;
        e = Grown(std::move(t));
      } else if (IsOp("(")) {
        e = Call(std::move(e), Expr::Kind::kCall, "");
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  ParseLimits limits_;
  int depth_ = 0;
  int loops_ = 0;
};

}  // namespace

Body Parse(const std::string& source, const ParseLimits& limits) {
  if (source.size() > limits.max_source_bytes)
    Fail(TemplateError::Kind::kLimit, "template larger than " +
                                          std::to_string(limits.max_source_bytes) + " bytes");
  return Parser(Tokenize(source), limits).Template();
}

}  // namespace kvstream::frontend::jinja
