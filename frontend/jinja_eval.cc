#include "frontend/jinja_eval.h"

#include <algorithm>
#include <cmath>
#include <optional>

namespace kvstream::frontend::jinja {
namespace {

[[noreturn]] void UndefinedError(const Value& v) {
  RuntimeFail("UndefinedError: " + (v.s.empty() ? std::string("value is undefined") : v.s));
}

double AsDouble(const Value& v) {
  return v.kind == Value::Kind::kFloat ? v.f : v.kind == Value::Kind::kBool ? double(v.b)
                                                                             : double(v.i);
}
int64_t AsInt(const Value& v) { return v.kind == Value::Kind::kBool ? int64_t(v.b) : v.i; }
bool IsIntLike(const Value& v) { return v.kind == Value::Kind::kInt || v.kind == Value::Kind::kBool; }

// Python's index normalisation for v[i] over n elements; false when out of range.
bool NormIndex(int64_t* i, size_t n) {
  if (*i < 0) *i += int64_t(n);
  return *i >= 0 && *i < int64_t(n);
}

}  // namespace

int64_t CheckedInt(__int128 v) {
  if (v > INT64_MAX || v < INT64_MIN) Unsupported("integers beyond 64 bits");
  return int64_t(v);
}

Renderer::Renderer(const Body& body, std::shared_ptr<Dict> globals, RenderLimits limits)
    : body_(body), globals_(std::move(globals)), limits_(limits) {
  builtins_ = BuiltinGlobals(this);
}

std::string Renderer::Render() {
  scopes_.assign(1, std::make_shared<Dict>());
  std::string out;
  Exec(body_, &out);
  return out;
}

void Renderer::Step(int64_t n) {
  steps_ += n;
  if (steps_ > limits_.max_steps)
    Fail(TemplateError::Kind::kLimit,
         "template ran more than " + std::to_string(limits_.max_steps) + " steps");
}

void Renderer::CheckSize(size_t bytes) const {
  if (bytes > limits_.max_output_bytes)
    Fail(TemplateError::Kind::kLimit, "template output or a string in it exceeds " +
                                          std::to_string(limits_.max_output_bytes) + " bytes");
}

void Renderer::Append(std::string* out, const std::string& text) {
  CheckSize(out->size() + text.size());
  *out += text;
}

Renderer::Flow Renderer::Exec(const Body& body, std::string* out) {
  for (const StmtPtr& s : body) {
    const Flow f = ExecStmt(*s, out);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Renderer::Flow Renderer::ExecStmt(const Stmt& s, std::string* out) {
  Step();
  switch (s.kind) {
    case Stmt::Kind::kText: Append(out, s.text); return Flow::kNormal;
    case Stmt::Kind::kOutput: Append(out, Str(Eval(*s.exprs[0]))); return Flow::kNormal;
    case Stmt::Kind::kIf:
      for (size_t k = 0; k < s.exprs.size(); ++k)
        if (Truthy(Eval(*s.exprs[k]))) return Exec(s.bodies[k], out);
      if (s.bodies.size() > s.exprs.size()) return Exec(s.bodies.back(), out);
      return Flow::kNormal;
    case Stmt::Kind::kFor: ExecFor(s, out); return Flow::kNormal;
    case Stmt::Kind::kSet: {
      const Value v = Eval(*s.exprs[0]);
      if (s.text.empty()) {
        Assign(s.targets, v, s.line);
        return Flow::kNormal;
      }
      const Value ns = Lookup(s.targets[0]);
      if (ns.kind != Value::Kind::kNamespace)
        RuntimeFail("line " + std::to_string(s.line) + ": cannot assign attribute on non-namespace"
                    " object '" + s.targets[0] + "'");
      ns.dict->Set(s.text, v);
      return Flow::kNormal;
    }
    case Stmt::Kind::kSetBlock: {
      std::string text;
      Exec(s.bodies[0], &text);
      Assign(s.targets, Value::Str(std::move(text)), s.line);
      return Flow::kNormal;
    }
    case Stmt::Kind::kMacro: scopes_.back()->Set(s.text, MakeMacro(s)); return Flow::kNormal;
    case Stmt::Kind::kBreak: return Flow::kBreak;
    case Stmt::Kind::kContinue: return Flow::kContinue;
    case Stmt::Kind::kBlock: return Exec(s.bodies[0], out);
  }
  return Flow::kNormal;
}

void Renderer::Assign(const std::vector<std::string>& targets, const Value& v, int line) {
  if (targets.size() == 1) {
    scopes_.back()->Set(targets[0], v);
    return;
  }
  const List items = Iterate(v);
  if (items.size() != targets.size())
    RuntimeFail("line " + std::to_string(line) + ": cannot unpack " + std::to_string(items.size()) +
                " values into " + std::to_string(targets.size()) + " names");
  for (size_t k = 0; k < targets.size(); ++k) scopes_.back()->Set(targets[k], items[k]);
}

void Renderer::ExecFor(const Stmt& s, std::string* out) {
  const List all = Iterate(Eval(*s.exprs[0]));
  List items;
  if (s.exprs.size() > 1) {
    for (const Value& v : all) {
      scopes_.push_back(std::make_shared<Dict>());
      Assign(s.targets, v, s.line);
      const bool keep = Truthy(Eval(*s.exprs[1]));
      scopes_.pop_back();
      if (keep) items.push_back(v);
    }
  } else {
    items = all;
  }
  const int64_t n = int64_t(items.size());
  for (int64_t k = 0; k < n; ++k) {
    Step();
    auto scope = std::make_shared<Dict>();
    scopes_.push_back(scope);
    Assign(s.targets, items[size_t(k)], s.line);
    auto loop = std::make_shared<Dict>();
    loop->Set("index", Value::Int(k + 1));
    loop->Set("index0", Value::Int(k));
    loop->Set("revindex", Value::Int(n - k));
    loop->Set("revindex0", Value::Int(n - k - 1));
    loop->Set("first", Value::Bool(k == 0));
    loop->Set("last", Value::Bool(k == n - 1));
    loop->Set("length", Value::Int(n));
    loop->Set("depth", Value::Int(1));
    loop->Set("depth0", Value::Int(0));
    loop->Set("previtem", k > 0 ? items[size_t(k - 1)] : Value::Undefined("there is no previous item"));
    loop->Set("nextitem", k + 1 < n ? items[size_t(k + 1)] : Value::Undefined("there is no next item"));
    loop->Set("cycle", Value::Callable("loop.cycle", [](CallArgs&) -> Value {
      Unsupported("loop.cycle");
    }));
    loop->Set("changed", Value::Callable("loop.changed", [](CallArgs&) -> Value {
      Unsupported("loop.changed");
    }));
    scope->Set("loop", Value::MakeDict(loop));
    const Flow f = Exec(s.bodies[0], out);
    scopes_.pop_back();
    if (f == Flow::kBreak) break;
  }
  if (n == 0 && s.bodies.size() > 1) {
    scopes_.push_back(std::make_shared<Dict>());
    Exec(s.bodies[1], out);
    scopes_.pop_back();
  }
}

Value Renderer::MakeMacro(const Stmt& s) {
  const Stmt* def = &s;
  return Value::Callable(s.text, [this, def](CallArgs& args) -> Value {
    if (++call_depth_ > limits_.max_call_depth)
      Fail(TemplateError::Kind::kLimit, "macro calls nested deeper than " +
                                            std::to_string(limits_.max_call_depth));
    if (args.pos.size() > def->targets.size())
      RuntimeFail("macro '" + def->text + "' takes " + std::to_string(def->targets.size()) +
                  " arguments");
    auto scope = std::make_shared<Dict>();
    for (size_t k = 0; k < def->targets.size(); ++k) {
      Value v = args.Get(k, def->targets[k].c_str());
      if (v.IsUndefined() && def->exprs[k]) v = Eval(*def->exprs[k]);
      if (v.IsUndefined()) v = Value::Undefined("'" + def->targets[k] + "' is undefined");
      scope->Set(def->targets[k], v);
    }
    for (const auto& [k, v] : args.kw) {
      bool known = false;
      for (const std::string& t : def->targets) known = known || t == k;
      if (!known) RuntimeFail("macro '" + def->text + "' takes no keyword argument '" + k + "'");
    }
    std::vector<std::shared_ptr<Dict>> saved = {scopes_[0], scope};
    std::swap(saved, scopes_);
    std::string out;
    try {
      Exec(def->bodies[0], &out);
    } catch (...) {
      std::swap(saved, scopes_);
      --call_depth_;
      throw;
    }
    std::swap(saved, scopes_);
    --call_depth_;
    return Value::Str(std::move(out));
  });
}

Value Renderer::Lookup(const std::string& name) {
  for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it)
    if (const Value* v = (*it)->Find(name)) return *v;
  if (const Value* v = globals_->Find(name)) return *v;
  if (const Value* v = builtins_->Find(name)) return *v;
  return Value::Undefined("'" + name + "' is undefined");
}

List Renderer::Iterate(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return {};
    case Value::Kind::kList: return *v.list;
    case Value::Kind::kDict: {
      List keys;
      for (const auto& kv : v.dict->items) keys.push_back(Value::Str(kv.first));
      return keys;
    }
    case Value::Kind::kString: {
      List chars;
      for (uint32_t cp : Decode(v.s)) chars.push_back(Value::Str(Encode({cp})));
      return chars;
    }
    default: RuntimeFail("'" + TypeName(v) + "' object is not iterable");
  }
}

Value Renderer::GetAttr(const Value& obj, const std::string& name) {
  if (obj.IsUndefined()) UndefinedError(obj);
  if (obj.kind == Value::Kind::kDict || obj.kind == Value::Kind::kString ||
      obj.kind == Value::Kind::kList) {
    Value m = Method(this, obj, name);
    if (!m.IsUndefined()) return m;
  }
  if (obj.kind == Value::Kind::kDict || obj.kind == Value::Kind::kNamespace) {
    if (const Value* v = obj.dict->Find(name)) return *v;
  }
  return Value::Undefined("'" + TypeName(obj) + " object' has no attribute '" + name + "'");
}

Value Renderer::GetItem(const Value& obj, const Value& key) {
  if (obj.IsUndefined()) UndefinedError(obj);
  if (obj.kind == Value::Kind::kDict && key.IsString()) {
    if (const Value* v = obj.dict->Find(key.s)) return *v;
  } else if ((obj.kind == Value::Kind::kList || obj.IsString()) && IsIntLike(key)) {
    int64_t i = AsInt(key);
    if (obj.kind == Value::Kind::kList) {
      if (NormIndex(&i, obj.list->size())) return (*obj.list)[size_t(i)];
    } else {
      const auto cps = Decode(obj.s);
      if (NormIndex(&i, cps.size())) return Value::Str(Encode({cps[size_t(i)]}));
    }
  } else if (key.IsString()) {
    return GetAttr(obj, key.s);
  }
  return Value::Undefined("'" + TypeName(obj) + " object' has no element " + Repr(key));
}

Value Renderer::Slice(const Value& v, const Value& start, const Value& stop, const Value& step) {
  if (v.IsUndefined()) UndefinedError(v);
  auto opt = [](const Value& x, const char* what) -> std::optional<int64_t> {
    if (x.IsUndefined() || x.IsNone()) return std::nullopt;
    if (!IsIntLike(x)) RuntimeFail(std::string("slice ") + what + " must be an integer or None");
    return AsInt(x);
  };
  const int64_t st = opt(step, "step").value_or(1);
  if (st == 0) RuntimeFail("slice step cannot be zero");
  std::vector<uint32_t> cps;
  const bool is_str = v.IsString();
  if (!is_str && v.kind != Value::Kind::kList)
    RuntimeFail("'" + TypeName(v) + "' object is not subscriptable");
  if (is_str) cps = Decode(v.s);
  const int64_t n = is_str ? int64_t(cps.size()) : int64_t(v.list->size());
  auto clamp = [&](std::optional<int64_t> x, int64_t dflt) {
    if (!x) return dflt;
    int64_t i = *x;
    if (i < 0) i += n;
    if (st > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t a = clamp(opt(start, "start"), st > 0 ? 0 : n - 1);
  const int64_t b = clamp(opt(stop, "stop"), st > 0 ? n : -1);
  std::vector<size_t> idx;
  for (int64_t i = a; st > 0 ? i < b : i > b; i += st) idx.push_back(size_t(i));
  Step(int64_t(idx.size()));
  if (is_str) {
    std::vector<uint32_t> out;
    for (size_t i : idx) out.push_back(cps[i]);
    return Value::Str(Encode(out));
  }
  List out;
  for (size_t i : idx) out.push_back((*v.list)[i]);
  return Value::MakeList(std::move(out), v.tuple);
}

Value Renderer::Call(const Value& fn, CallArgs& args) {
  Step();
  if (fn.IsUndefined()) UndefinedError(fn);
  if (fn.kind != Value::Kind::kCallable)
    RuntimeFail("'" + TypeName(fn) + "' object is not callable");
  return (*fn.fn)(args);
}

Value Renderer::Filter(const std::string& name, const Value& v, CallArgs& args) {
  Step();
  return ApplyFilter(this, name, v, args);
}

bool Renderer::Test(const std::string& name, const Value& v, CallArgs& args) {
  Step();
  return ApplyTest(this, name, v, args);
}

Value Renderer::Eval(const Expr& e) {
  Step();
  auto call_args = [&](size_t from) {
    CallArgs a;
    for (size_t k = from; k < e.args.size(); ++k) a.pos.push_back(Eval(*e.args[k]));
    for (const auto& [k, x] : e.kwargs) a.kw.emplace_back(k, Eval(*x));
    return a;
  };
  switch (e.kind) {
    case Expr::Kind::kLiteral: return e.value;
    case Expr::Kind::kName: return Lookup(e.name);
    case Expr::Kind::kList: {
      List items;
      for (const auto& a : e.args) items.push_back(Eval(*a));
      return Value::MakeList(std::move(items), e.value.tuple);
    }
    case Expr::Kind::kDict: {
      auto d = std::make_shared<Dict>();
      for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
        const Value key = Eval(*e.args[k]);
        if (!key.IsString()) Unsupported("dict keys other than strings (line " +
                                         std::to_string(e.line) + ")");
        d->Set(key.s, Eval(*e.args[k + 1]));
      }
      return Value::MakeDict(std::move(d));
    }
    case Expr::Kind::kAttr: return GetAttr(Eval(*e.args[0]), e.name);
    case Expr::Kind::kItem: {
      const Value obj = Eval(*e.args[0]);
      return GetItem(obj, Eval(*e.args[1]));
    }
    case Expr::Kind::kSlice: {
      const Value obj = Eval(*e.args[0]);
      Value p[3];
      for (int k = 0; k < 3; ++k)
        if (e.args[size_t(k) + 1]) p[k] = Eval(*e.args[size_t(k) + 1]);
      return Slice(obj, p[0], p[1], p[2]);
    }
    case Expr::Kind::kCall: {
      const Value fn = Eval(*e.args[0]);
      CallArgs a = call_args(1);
      return Call(fn, a);
    }
    case Expr::Kind::kFilter: {
      const Value v = Eval(*e.args[0]);
      CallArgs a = call_args(1);
      return Filter(e.name, v, a);
    }
    case Expr::Kind::kTest: {
      const Value v = Eval(*e.args[0]);
      CallArgs a = call_args(1);
      return Value::Bool(Test(e.name, v, a) != e.negated);
    }
    case Expr::Kind::kUnary: {
      const Value v = Eval(*e.args[0]);
      if (e.name == "not") return Value::Bool(!Truthy(v));
      if (v.IsUndefined()) UndefinedError(v);
      if (!v.IsNumber()) RuntimeFail("bad operand type for unary " + e.name + ": '" +
                                     TypeName(v) + "'");
      if (e.name == "+") return v.kind == Value::Kind::kFloat ? v : Value::Int(AsInt(v));
      if (v.kind == Value::Kind::kFloat) return Value::Float(-v.f);
      return Value::Int(CheckedInt(-__int128(AsInt(v))));
    }
    case Expr::Kind::kAnd: {
      Value a = Eval(*e.args[0]);
      return Truthy(a) ? Eval(*e.args[1]) : a;
    }
    case Expr::Kind::kOr: {
      Value a = Eval(*e.args[0]);
      return Truthy(a) ? a : Eval(*e.args[1]);
    }
    case Expr::Kind::kCond:
      if (Truthy(Eval(*e.args[0]))) return Eval(*e.args[1]);
      return e.args[2] ? Eval(*e.args[2]) : Value::Undefined("the conditional had no else");
    case Expr::Kind::kBinary: {
      const Value a = Eval(*e.args[0]);
      const Value b = Eval(*e.args[1]);
      return EvalBinary(e.name, a, b, e.line);
    }
  }
  return Value::Undefined();
}

Value Renderer::EvalBinary(const std::string& op, const Value& a, const Value& b, int line) {
  auto type_error = [&]() -> Value {
    RuntimeFail("line " + std::to_string(line) + ": unsupported operand types for " + op + ": '" +
                TypeName(a) + "' and '" + TypeName(b) + "'");
  };
  if (op == "~") {
    std::string s = Str(a) + Str(b);
    CheckSize(s.size());
    return Value::Str(std::move(s));
  }
  if (op == "==") return Value::Bool(Equal(a, b));
  if (op == "!=") return Value::Bool(!Equal(a, b));
  if (op == "in" || op == "notin") {
    bool found = false;
    if (b.IsString()) {
      if (!a.IsString()) RuntimeFail("'in <string>' requires string as left operand, not " +
                                     TypeName(a));
      found = b.s.find(a.s) != std::string::npos;
    } else if (b.kind == Value::Kind::kDict) {
      found = a.IsString() && b.dict->Find(a.s) != nullptr;
    } else if (b.kind == Value::Kind::kList) {
      for (const Value& x : *b.list) found = found || Equal(a, x);
    } else if (!b.IsUndefined()) {
      RuntimeFail("argument of type '" + TypeName(b) + "' is not iterable");
    }
    return Value::Bool(found != (op == "notin"));
  }
  if (a.IsUndefined()) UndefinedError(a);
  if (b.IsUndefined()) UndefinedError(b);
  if (op == "<") return Value::Bool(Less(a, b));
  if (op == ">") return Value::Bool(Less(b, a));
  if (op == "<=") return Value::Bool(!Less(b, a));
  if (op == ">=") return Value::Bool(!Less(a, b));
  if (a.IsNumber() && b.IsNumber()) {
    const bool ints = IsIntLike(a) && IsIntLike(b);
    const __int128 x = AsInt(a), y = AsInt(b);
    const double fx = AsDouble(a), fy = AsDouble(b);
    if (op == "+") return ints ? Value::Int(CheckedInt(x + y)) : Value::Float(fx + fy);
    if (op == "-") return ints ? Value::Int(CheckedInt(x - y)) : Value::Float(fx - fy);
    if (op == "*") return ints ? Value::Int(CheckedInt(x * y)) : Value::Float(fx * fy);
    if (op == "/") {
      if (fy == 0) RuntimeFail("division by zero");
      return Value::Float(fx / fy);
    }
    if (op == "//" || op == "%") {
      if (ints ? y == 0 : fy == 0) RuntimeFail(op == "%" ? "modulo by zero" : "division by zero");
      if (ints) {
        __int128 q = x / y, r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) {
          --q;
          r += y;
        }
        return Value::Int(CheckedInt(op == "//" ? q : r));
      }
      const double q = std::floor(fx / fy);
      return Value::Float(op == "//" ? q : fx - q * fy);
    }
    if (op == "**") {
      if (ints && y >= 0) {
        if (x == 0) return Value::Int(y == 0 ? 1 : 0);
        if (x == 1) return Value::Int(1);
        if (x == -1) return Value::Int(y % 2 ? -1 : 1);
        __int128 r = 1;
        for (__int128 k = 0; k < y; ++k) r = CheckedInt(r * x);  // |x| >= 2: 63 rounds at most
        return Value::Int(int64_t(r));
      }
      return Value::Float(std::pow(fx, fy));
    }
    return type_error();
  }
  if (op == "+") {
    if (a.IsString() && b.IsString()) {
      CheckSize(a.s.size() + b.s.size());
      return Value::Str(a.s + b.s);
    }
    if (a.kind == Value::Kind::kList && b.kind == Value::Kind::kList && a.tuple == b.tuple) {
      CheckSize((a.list->size() + b.list->size()) * 8);
      List out = *a.list;
      out.insert(out.end(), b.list->begin(), b.list->end());
      return Value::MakeList(std::move(out), a.tuple);
    }
    return type_error();
  }
  if (op == "*") {
    const Value& seq = IsIntLike(a) ? b : a;
    const Value& cnt = IsIntLike(a) ? a : b;
    if (!IsIntLike(cnt) || (!seq.IsString() && seq.kind != Value::Kind::kList)) return type_error();
    const int64_t n = std::max<int64_t>(0, AsInt(cnt));
    const size_t unit = seq.IsString() ? seq.s.size() : seq.list->size() * 8;
    CheckSize(size_t(std::min<__int128>(__int128(unit) * n, INT64_MAX)));
    if (seq.IsString()) {
      std::string out;
      for (int64_t k = 0; k < n; ++k) out += seq.s;
      return Value::Str(std::move(out));
    }
    List out;
    for (int64_t k = 0; k < n; ++k) out.insert(out.end(), seq.list->begin(), seq.list->end());
    return Value::MakeList(std::move(out), seq.tuple);
  }
  if (op == "%" && a.IsString()) Unsupported("string % formatting (line " + std::to_string(line) + ")");
  return type_error();
}

}  // namespace kvstream::frontend::jinja
