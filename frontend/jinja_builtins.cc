// Jinja2's filters, tests and globals that chat templates use, HF's tojson and
// raise_exception/strftime_now, and the str / dict methods Python would find. A name not
// implemented here fails naming it (kUnsupported), never renders as something else.
#include <algorithm>
#include <cmath>
#include <ctime>

#include "frontend/jinja_eval.h"

namespace kvstream::frontend::jinja {
namespace {

std::string Lower(std::string s, const char* what) {
  for (char& c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) Unsupported(std::string(what) + " of non-ASCII text");
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  }
  return s;
}

std::string Upper(std::string s, const char* what) {
  for (char& c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) Unsupported(std::string(what) + " of non-ASCII text");
    if (c >= 'a' && c <= 'z') c = char(c - 'a' + 'A');
  }
  return s;
}

std::string Capitalize(const std::string& s) {
  std::string out = Lower(s, "capitalize");
  if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = char(out[0] - 'a' + 'A');
  return out;
}

std::string Title(const std::string& s) {
  std::string out = Lower(s, "title");
  bool prev_alpha = false;
  for (char& c : out) {
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (alpha && !prev_alpha && c >= 'a') c = char(c - 'a' + 'A');
    prev_alpha = alpha;
  }
  return out;
}

// Jinja's title filter: words split at runs of - whitespace ( { [ <; each word's first character
// upper case, the rest lower case.
std::string TitleFilter(const std::string& s) {
  Lower(s, "title");
  std::string out;
  bool word_start = true;
  for (char c : s) {
    const bool sep = c == '-' || c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' ||
                     c == '\v' || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      out += c;
      word_start = true;
    } else {
      out += word_start ? Upper(std::string(1, c), "title")[0] : Lower(std::string(1, c), "title")[0];
      word_start = false;
    }
  }
  return out;
}

// str.strip / lstrip / rstrip: `chars` undefined or None = whitespace.
std::string Strip(const std::string& s, const Value& chars, bool left, bool right) {
  const auto cps = Decode(s);
  std::vector<uint32_t> set;
  const bool ws = chars.IsUndefined() || chars.IsNone();
  if (!ws) {
    if (!chars.IsString()) RuntimeFail("strip arg must be None or str");
    set = Decode(chars.s);
  }
  auto strip = [&](uint32_t cp) {
    return ws ? IsPySpace(cp) : std::find(set.begin(), set.end(), cp) != set.end();
  };
  size_t a = 0, b = cps.size();
  while (left && a < b && strip(cps[a])) ++a;
  while (right && b > a && strip(cps[b - 1])) --b;
  return Encode(std::vector<uint32_t>(cps.begin() + long(a), cps.begin() + long(b)));
}

Value Split(const std::string& s, const Value& sep, const Value& maxsplit) {
  int64_t max = maxsplit.kind == Value::Kind::kInt ? maxsplit.i : -1;
  List out;
  if (sep.IsUndefined() || sep.IsNone()) {
    const auto cps = Decode(s);
    size_t i = 0;
    while (i < cps.size()) {
      while (i < cps.size() && IsPySpace(cps[i])) ++i;
      if (i >= cps.size()) break;
      if (max == 0) {
        size_t e = cps.size();
        while (e > i && IsPySpace(cps[e - 1])) --e;
        out.push_back(Value::Str(Encode({cps.begin() + long(i), cps.begin() + long(e)})));
        break;
      }
      size_t j = i;
      while (j < cps.size() && !IsPySpace(cps[j])) ++j;
      out.push_back(Value::Str(Encode({cps.begin() + long(i), cps.begin() + long(j)})));
      i = j;
      if (max > 0) --max;
    }
    return Value::MakeList(std::move(out));
  }
  if (!sep.IsString()) RuntimeFail("split: separator must be str or None");
  if (sep.s.empty()) RuntimeFail("split: empty separator");
  size_t pos = 0;
  while (true) {
    const size_t hit = max == 0 ? std::string::npos : s.find(sep.s, pos);
    if (hit == std::string::npos) {
      out.push_back(Value::Str(s.substr(pos)));
      break;
    }
    out.push_back(Value::Str(s.substr(pos, hit - pos)));
    pos = hit + sep.s.size();
    if (max > 0) --max;
  }
  return Value::MakeList(std::move(out));
}

std::string Replace(const std::string& s, const std::string& old, const std::string& rep,
                    int64_t count, Renderer* r) {
  std::string out;
  if (old.empty()) {
    const auto cps = Decode(s);
    int64_t done = 0;
    for (size_t k = 0; k <= cps.size(); ++k) {
      if (count < 0 || done < count) {
        out += rep;
        ++done;
      }
      if (k < cps.size()) out += Encode({cps[k]});
      r->CheckSize(out.size());
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t hit = s.find(old, pos);
    if (hit == std::string::npos) break;
    out += s.substr(pos, hit - pos) + rep;
    r->CheckSize(out.size());
    pos = hit + old.size();
    ++done;
  }
  return out + s.substr(pos);
}

const std::string& NeedStr(const Value& v, const char* what) {
  if (!v.IsString()) RuntimeFail(std::string(what) + ": expected a string, got '" + TypeName(v) + "'");
  return v.s;
}

bool StartsOrEnds(const std::string& s, const Value& arg, bool start) {
  List options = arg.kind == Value::Kind::kList && arg.tuple ? *arg.list : List{arg};
  for (const Value& o : options) {
    const std::string& p = NeedStr(o, start ? "startswith" : "endswith");
    if (p.size() <= s.size() && (start ? s.compare(0, p.size(), p) == 0
                                       : s.compare(s.size() - p.size(), p.size(), p) == 0))
      return true;
  }
  return false;
}

Value Bound(const std::string& name, Function fn) { return Value::Callable(name, std::move(fn)); }

Value StrMethod(Renderer* r, const std::string& s, const std::string& name) {
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return Bound("str." + name, [s, name](CallArgs& a) {
      a.Check(name.c_str(), 1, {});
      return Value::Str(Strip(s, a.Get(0, ""), name != "rstrip", name != "lstrip"));
    });
  if (name == "split")
    return Bound("str.split", [s](CallArgs& a) {
      a.Check("split", 2, {"sep", "maxsplit"});
      return Split(s, a.Get(0, "sep"), a.Get(1, "maxsplit"));
    });
  if (name == "startswith" || name == "endswith")
    return Bound("str." + name, [s, name](CallArgs& a) {
      a.Check(name.c_str(), 1, {});
      return Value::Bool(StartsOrEnds(s, a.Get(0, ""), name == "startswith"));
    });
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize")
    return Bound("str." + name, [s, name](CallArgs& a) {
      a.Check(name.c_str(), 0, {});
      if (name == "upper") return Value::Str(Upper(s, "upper"));
      if (name == "lower") return Value::Str(Lower(s, "lower"));
      return Value::Str(name == "title" ? Title(s) : Capitalize(s));
    });
  if (name == "replace")
    return Bound("str.replace", [s, r](CallArgs& a) {
      a.Check("replace", 3, {});
      const Value c = a.Get(2, "");
      return Value::Str(Replace(s, NeedStr(a.Get(0, ""), "replace"), NeedStr(a.Get(1, ""), "replace"),
                                c.kind == Value::Kind::kInt ? c.i : -1, r));
    });
  if (name == "find" || name == "count")
    return Bound("str." + name, [s, name](CallArgs& a) {
      a.Check(name.c_str(), 1, {});
      const std::string& sub = NeedStr(a.Get(0, ""), name.c_str());
      if (name == "find") {
        const size_t hit = s.find(sub);
        return Value::Int(hit == std::string::npos ? -1 : int64_t(CodePointCount(s.substr(0, hit))));
      }
      if (sub.empty()) return Value::Int(int64_t(CodePointCount(s)) + 1);
      int64_t n = 0;
      for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
      return Value::Int(n);
    });
  if (name == "join")
    return Bound("str.join", [s, r](CallArgs& a) {
      a.Check("join", 1, {});
      std::string out;
      bool first = true;
      for (const Value& v : r->Iterate(a.Get(0, ""))) {
        if (!first) out += s;
        first = false;
        out += NeedStr(v, "str.join");
        r->CheckSize(out.size());
      }
      return Value::Str(std::move(out));
    });
  static const char* kOther[] = {"format", "format_map", "splitlines", "rsplit", "partition",
                                 "rpartition", "index", "rfind", "center", "ljust", "rjust",
                                 "zfill", "isdigit", "isalpha", "isspace", "encode", "swapcase"};
  for (const char* o : kOther)
    if (name == o) Unsupported("the str method '" + name + "'");
  return Value::Undefined();
}

Value Items(const Value& v) {
  List out;
  if (v.IsUndefined()) return Value::MakeList(out);
  if (!v.IsMapping()) RuntimeFail("can only get item pairs from a mapping");
  for (const auto& [k, x] : v.dict->items) out.push_back(Value::MakeList({Value::Str(k), x}, true));
  return Value::MakeList(std::move(out));
}

// The HF tojson filter: json.dumps(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False).
Value ToJson(const Value& v, CallArgs& a) {
  a.Check("tojson", 4, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonStyle st;
  const Value ea = a.Get(0, "ensure_ascii"), ind = a.Get(1, "indent"), sep = a.Get(2, "separators"),
              sk = a.Get(3, "sort_keys");
  st.ensure_ascii = Truthy(ea);
  if (ind.kind == Value::Kind::kInt) st.indent = int(std::clamp<int64_t>(ind.i, 0, 64));
  else if (!ind.IsUndefined() && !ind.IsNone()) Unsupported("tojson indent other than an integer");
  if (sep.kind == Value::Kind::kList && sep.list->size() == 2 && (*sep.list)[0].IsString() &&
      (*sep.list)[1].IsString()) {
    st.item_sep = (*sep.list)[0].s;
    st.key_sep = (*sep.list)[1].s;
    if (st.item_sep.empty() || st.key_sep.empty()) Unsupported("tojson with empty separators");
  } else if (!sep.IsUndefined() && !sep.IsNone()) {
    RuntimeFail("tojson: separators must be a pair of strings");
  }
  st.sort_keys = Truthy(sk);
  return Value::Str(Json(v, st));
}

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

Value ToInt(const Value& v, const Value& dflt) {
  const Value d = dflt.IsUndefined() ? Value::Int(0) : dflt;
  if (v.kind == Value::Kind::kInt) return v;
  if (v.kind == Value::Kind::kBool) return Value::Int(v.b);
  if (v.kind == Value::Kind::kFloat)
    return std::isfinite(v.f) && std::fabs(v.f) < 9.2e18 ? Value::Int(int64_t(v.f)) : d;
  if (v.IsString()) {
    const std::string t = Strip(v.s, Value::Undefined(), true, true);
    char* end = nullptr;
    errno = 0;
    const long long i = std::strtoll(t.c_str(), &end, 10);
    if (!t.empty() && end && *end == 0 && errno == 0) return Value::Int(i);
    const double f = std::strtod(t.c_str(), &end);
    if (!t.empty() && end && *end == 0 && std::isfinite(f) && std::fabs(f) < 9.2e18)
      return Value::Int(int64_t(f));
  }
  return d;
}

// Jinja's make_attrgetter: a dotted path, each part an item (an integer part an index) or else
// an attribute.
Value AttrPath(Renderer* r, const Value& item, const std::string& path) {
  Value v = item;
  size_t pos = 0;
  while (true) {
    const size_t dot = path.find('.', pos);
    const std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    const bool digits = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
    v = digits && part.size() < 18 ? r->GetItem(v, Value::Int(std::stoll(part)))
                                   : r->GetItem(v, Value::Str(part));
    if (dot == std::string::npos) return v;
    pos = dot + 1;
  }
}

// Applies the selectattr / select family: `attr` empty for select/reject.
Value SelectFamily(Renderer* r, const Value& v, CallArgs& a, bool by_attr, bool keep) {
  size_t k = 0;
  std::string attr;
  if (by_attr) {
    const Value at = a.Get(k++, "");
    attr = NeedStr(at, "selectattr");
  }
  const Value test = a.Get(k++, "");
  CallArgs targs;
  for (size_t j = k; j < a.pos.size(); ++j) targs.pos.push_back(a.pos[j]);
  List out;
  for (const Value& item : r->Iterate(v)) {
    const Value x = by_attr ? AttrPath(r, item, attr) : item;
    bool ok;
    if (test.IsUndefined()) {
      ok = Truthy(x);
    } else {
      CallArgs copy = targs;
      ok = r->Test(NeedStr(test, "select"), x, copy);
    }
    if (ok == keep) out.push_back(item);
  }
  return Value::MakeList(std::move(out));
}

Value Map(Renderer* r, const Value& v, CallArgs& a) {
  List out;
  const Value attr = a.Get(99, "attribute");
  if (!attr.IsUndefined()) {
    const Value dflt = a.Get(99, "default");
    for (const Value& item : r->Iterate(v)) {
      Value x = AttrPath(r, item, NeedStr(attr, "map"));
      if (x.IsUndefined() && !dflt.IsUndefined()) x = dflt;
      out.push_back(x);
    }
    return Value::MakeList(std::move(out));
  }
  const std::string& name = NeedStr(a.Get(0, ""), "map");
  CallArgs fargs;
  for (size_t j = 1; j < a.pos.size(); ++j) fargs.pos.push_back(a.pos[j]);
  fargs.kw = a.kw;
  for (const Value& item : r->Iterate(v)) {
    CallArgs copy = fargs;
    out.push_back(r->Filter(name, item, copy));
  }
  return Value::MakeList(std::move(out));
}

}  // namespace

Value Method(Renderer* r, const Value& obj, const std::string& name) {
  if (obj.IsString()) return StrMethod(r, obj.s, name);
  if (obj.kind == Value::Kind::kDict) {
    if (name == "items")
      return Bound("dict.items", [obj](CallArgs& a) {
        a.Check("items", 0, {});
        return Items(obj);
      });
    if (name == "keys" || name == "values")
      return Bound("dict." + name, [obj, name](CallArgs& a) {
        a.Check(name.c_str(), 0, {});
        List out;
        for (const auto& [k, v] : obj.dict->items) out.push_back(name == "keys" ? Value::Str(k) : v);
        return Value::MakeList(std::move(out));
      });
    if (name == "get")
      return Bound("dict.get", [obj](CallArgs& a) {
        a.Check("get", 2, {});
        const Value key = a.Get(0, "");
        const Value* v = key.IsString() ? obj.dict->Find(key.s) : nullptr;
        if (v) return *v;
        const Value d = a.Get(1, "");
        return d.IsUndefined() ? Value::None() : d;
      });
    for (const char* m : {"copy", "pop", "popitem", "setdefault", "update", "clear", "fromkeys"})
      if (name == m) Unsupported("the dict method '" + name + "' (HF's sandbox refuses it too)");
  }
  if (obj.kind == Value::Kind::kList) {
    for (const char* m : {"append", "extend", "pop", "insert", "remove", "sort", "reverse", "clear",
                          "index", "count", "copy"})
      if (name == m) Unsupported("the list method '" + name + "'");
  }
  return Value::Undefined();
}

Value ApplyFilter(Renderer* r, const std::string& name, const Value& v, CallArgs& a) {
  auto arg = [&](size_t i, const char* n) { return a.Get(i, n); };
  if (name == "trim") {
    a.Check("trim", 1, {"chars"});
    return Value::Str(Strip(Str(v), arg(0, "chars"), true, true));
  }
  if (name == "length" || name == "count") {
    a.Check(name.c_str(), 0, {});
    if (v.IsString()) return Value::Int(int64_t(CodePointCount(v.s)));
    if (v.kind == Value::Kind::kList) return Value::Int(int64_t(v.list->size()));
    if (v.IsMapping()) return Value::Int(int64_t(v.dict->items.size()));
    if (v.IsUndefined()) return Value::Int(0);
    RuntimeFail("object of type '" + TypeName(v) + "' has no len()");
  }
  if (name == "upper" || name == "lower" || name == "capitalize" || name == "title") {
    a.Check(name.c_str(), 0, {});
    const std::string s = Str(v);
    if (name == "upper") return Value::Str(Upper(s, "upper"));
    if (name == "lower") return Value::Str(Lower(s, "lower"));
    return Value::Str(name == "title" ? TitleFilter(s) : Capitalize(s));
  }
  if (name == "default" || name == "d") {
    a.Check(name.c_str(), 2, {"default_value", "boolean"});
    const bool boolean = Truthy(arg(1, "boolean"));
    if (v.IsUndefined() || (boolean && !Truthy(v))) {
      const Value d = arg(0, "default_value");
      return d.IsUndefined() ? Value::Str("") : d;
    }
    return v;
  }
  if (name == "join") {
    a.Check("join", 2, {"d", "attribute"});
    const Value sep = arg(0, "d"), attr = arg(1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& item : r->Iterate(v)) {
      if (!first) out += sep.IsUndefined() ? "" : Str(sep);
      first = false;
      out += Str(attr.IsUndefined() ? item : AttrPath(r, item, Str(attr)));
      r->CheckSize(out.size());
    }
    return Value::Str(std::move(out));
  }
  if (name == "first" || name == "last") {
    a.Check(name.c_str(), 0, {});
    const List items = r->Iterate(v);
    if (items.empty()) return Value::Undefined("no " + name + " item, sequence was empty");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    a.Check("list", 0, {});
    return Value::MakeList(r->Iterate(v));
  }
  if (name == "reverse") {
    a.Check("reverse", 0, {});
    if (v.IsString()) {
      auto cps = Decode(v.s);
      std::reverse(cps.begin(), cps.end());
      return Value::Str(Encode(cps));
    }
    List items = r->Iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::MakeList(std::move(items));
  }
  if (name == "items") {
    a.Check("items", 0, {});
    return Items(v);
  }
  if (name == "string") {
    a.Check("string", 0, {});
    return Value::Str(Str(v));
  }
  if (name == "safe") return v;
  if (name == "escape" || name == "e") return Value::Str(Escape(Str(v)));
  if (name == "tojson") return ToJson(v, a);
  if (name == "replace") {
    a.Check("replace", 3, {"old", "new", "count"});
    const Value c = arg(2, "count");
    return Value::Str(Replace(Str(v), Str(arg(0, "old")), Str(arg(1, "new")),
                              c.kind == Value::Kind::kInt ? c.i : -1, r));
  }
  if (name == "int") {
    a.Check("int", 1, {"default"});
    return ToInt(v, arg(0, "default"));
  }
  if (name == "float") {
    a.Check("float", 1, {"default"});
    if (v.kind == Value::Kind::kFloat) return v;
    if (v.IsNumber()) return Value::Float(v.kind == Value::Kind::kBool ? double(v.b) : double(v.i));
    if (v.IsString()) {
      char* end = nullptr;
      const std::string t = Strip(v.s, Value::Undefined(), true, true);
      const double f = std::strtod(t.c_str(), &end);
      if (!t.empty() && end && *end == 0) return Value::Float(f);
    }
    const Value d = arg(0, "default");
    return d.IsUndefined() ? Value::Float(0.0) : d;
  }
  if (name == "abs") {
    if (v.kind == Value::Kind::kFloat) return Value::Float(std::fabs(v.f));
    if (v.kind == Value::Kind::kInt) return Value::Int(CheckedInt(v.i < 0 ? -__int128(v.i) : v.i));
    if (v.kind == Value::Kind::kBool) return Value::Int(v.b);
    RuntimeFail("bad operand type for abs(): '" + TypeName(v) + "'");
  }
  if (name == "attr") {
    a.Check("attr", 1, {});
    return r->GetAttr(v, NeedStr(arg(0, ""), "attr"));
  }
  if (name == "map") return Map(r, v, a);
  if (name == "select" || name == "reject") return SelectFamily(r, v, a, false, name == "select");
  if (name == "selectattr" || name == "rejectattr")
    return SelectFamily(r, v, a, true, name == "selectattr");
  Unsupported("the filter '" + name + "'");
}

bool ApplyTest(Renderer* r, const std::string& name, const Value& v, CallArgs& a) {
  (void)r;
  const Value x = a.Get(0, "");
  using K = Value::Kind;
  if (name == "defined") return !v.IsUndefined();
  if (name == "undefined") return v.IsUndefined();
  if (name == "none") return v.IsNone();
  if (name == "boolean") return v.kind == K::kBool;
  if (name == "true") return v.kind == K::kBool && v.b;
  if (name == "false") return v.kind == K::kBool && !v.b;
  if (name == "integer") return v.kind == K::kInt;
  if (name == "float") return v.kind == K::kFloat;
  if (name == "number") return v.IsNumber();
  if (name == "string") return v.IsString();
  if (name == "mapping") return v.kind == K::kDict;
  if (name == "iterable")
    return v.IsUndefined() || v.IsString() || v.kind == K::kList || v.kind == K::kDict;
  if (name == "sequence")
    return v.IsUndefined() || v.IsString() || v.kind == K::kList || v.kind == K::kDict;
  if (name == "callable") return v.kind == K::kCallable;
  if (name == "eq" || name == "equalto" || name == "==") return Equal(v, x);
  if (name == "ne" || name == "!=") return !Equal(v, x);
  if (name == "lt" || name == "lessthan" || name == "<") return Less(v, x);
  if (name == "gt" || name == "greaterthan" || name == ">") return Less(x, v);
  if (name == "le" || name == "<=") return !Less(x, v);
  if (name == "ge" || name == ">=") return !Less(v, x);
  if (name == "in") {
    if (x.IsString()) return v.IsString() && x.s.find(v.s) != std::string::npos;
    if (x.kind == K::kDict) return v.IsString() && x.dict->Find(v.s) != nullptr;
    if (x.kind == K::kList)
      return std::any_of(x.list->begin(), x.list->end(), [&](const Value& e) { return Equal(v, e); });
    RuntimeFail("the 'in' test needs a container");
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (v.kind != K::kInt && v.kind != K::kBool) RuntimeFail("the '" + name + "' test needs an integer");
    const int64_t n = v.kind == K::kBool ? v.b : v.i;
    if (name == "odd") return n % 2 != 0;
    if (name == "even") return n % 2 == 0;
    if (x.kind != K::kInt || x.i == 0) RuntimeFail("divisibleby needs a non-zero integer");
    return n % x.i == 0;
  }
  if (name == "lower" || name == "upper") {
    const std::string s = Str(v);
    return name == "lower" ? Lower(s, "the lower test") == s : Upper(s, "the upper test") == s;
  }
  if (name == "sameas") return Equal(v, x) && (v.IsNone() || v.kind == K::kBool || v.IsUndefined());
  Unsupported("the test '" + name + "'");
}

std::shared_ptr<Dict> BuiltinGlobals(Renderer* r) {
  auto g = std::make_shared<Dict>();
  g->Set("raise_exception", Value::Callable("raise_exception", [](CallArgs& a) -> Value {
    Fail(TemplateError::Kind::kRaised, Str(a.Get(0, "message")));
  }));
  g->Set("strftime_now", Value::Callable("strftime_now", [](CallArgs& a) {
    a.Check("strftime_now", 1, {});
    const std::string fmt = NeedStr(a.Get(0, ""), "strftime_now");
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[512];
    const size_t n = std::strftime(buf, sizeof(buf), fmt.c_str(), &tm);
    if (n == 0 && !fmt.empty()) Unsupported("strftime_now with this format");
    return Value::Str(std::string(buf, n));
  }));
  g->Set("range", Value::Callable("range", [r](CallArgs& a) {
    a.Check("range", 3, {});
    for (const Value& x : a.pos)
      if (x.kind != Value::Kind::kInt) RuntimeFail("range: arguments must be integers");
    int64_t start = 0, stop = 0, step = 1;
    if (a.pos.size() == 1) stop = a.pos[0].i;
    if (a.pos.size() >= 2) start = a.pos[0].i, stop = a.pos[1].i;
    if (a.pos.size() == 3) step = a.pos[2].i;
    if (a.pos.empty()) RuntimeFail("range expected at least 1 argument");
    if (step == 0) RuntimeFail("range() arg 3 must not be zero");
    const __int128 n = step > 0 ? (stop > start ? (__int128(stop) - start + step - 1) / step : 0)
                                : (start > stop ? (__int128(start) - stop - step - 1) / -step : 0);
    if (n > 100000) Fail(TemplateError::Kind::kLimit, "range too big (Jinja's sandbox allows 100000)");
    r->Step(int64_t(n));
    List out;
    for (int64_t k = 0; k < int64_t(n); ++k) out.push_back(Value::Int(start + k * step));
    return Value::MakeList(std::move(out));
  }));
  auto make_dict = [](CallArgs& a, const char* what) {
    auto d = std::make_shared<Dict>();
    if (a.pos.size() > 1) RuntimeFail(std::string(what) + " takes at most one positional argument");
    if (!a.pos.empty()) {
      if (!a.pos[0].IsMapping()) Unsupported(std::string(what) + " from something other than a mapping");
      for (const auto& [k, v] : a.pos[0].dict->items) d->Set(k, v);
    }
    for (const auto& [k, v] : a.kw) d->Set(k, v);
    return d;
  };
  g->Set("namespace", Value::Callable("namespace", [make_dict](CallArgs& a) {
    Value v;
    v.kind = Value::Kind::kNamespace;
    v.dict = make_dict(a, "namespace");
    return v;
  }));
  g->Set("dict", Value::Callable("dict", [make_dict](CallArgs& a) {
    return Value::MakeDict(make_dict(a, "dict"));
  }));
  for (const char* name : {"lipsum", "cycler", "joiner"})
    g->Set(name, Value::Callable(name, [name = std::string(name)](CallArgs&) -> Value {
      Unsupported("the global '" + name + "'");
    }));
  return g;
}

}  // namespace kvstream::frontend::jinja
