#include "frontend/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

namespace kvstream::frontend::jinja {

void Fail(TemplateError::Kind kind, const std::string& what) { throw TemplateError(kind, what); }

Value Value::Undefined(std::string hint) {
  Value v;
  v.s = std::move(hint);
  return v;
}
Value Value::None() {
  Value v;
  v.kind = Kind::kNone;
  return v;
}
Value Value::Bool(bool x) {
  Value v;
  v.kind = Kind::kBool;
  v.b = x;
  return v;
}
Value Value::Int(int64_t x) {
  Value v;
  v.kind = Kind::kInt;
  v.i = x;
  return v;
}
Value Value::Float(double x) {
  Value v;
  v.kind = Kind::kFloat;
  v.f = x;
  return v;
}
Value Value::Str(std::string x) {
  Value v;
  v.kind = Kind::kString;
  v.s = std::move(x);
  return v;
}
int DepthOf(const Value& v) {
  if (v.kind == Value::Kind::kList) return v.depth;
  if (v.IsMapping()) return v.dict->depth;
  return 0;
}

namespace {
void CheckDepth(const Value& v) {
  if (DepthOf(v) >= kMaxValueDepth)
    Fail(TemplateError::Kind::kLimit,
         "values nested deeper than " + std::to_string(kMaxValueDepth));
}
}  // namespace

Value Value::MakeList(List items, bool is_tuple) {
  Value v;
  v.kind = Kind::kList;
  v.tuple = is_tuple;
  v.depth = 1;
  for (const Value& x : items) {
    CheckDepth(x);
    v.depth = std::max(v.depth, DepthOf(x) + 1);
  }
  v.list = std::make_shared<List>(std::move(items));
  return v;
}
Value Value::MakeDict(std::shared_ptr<Dict> d) {
  Value v;
  v.kind = Kind::kDict;
  v.dict = std::move(d);
  return v;
}
Value Value::Callable(std::string name, Function fn) {
  Value v;
  v.kind = Kind::kCallable;
  v.s = std::move(name);
  v.fn = std::make_shared<Function>(std::move(fn));
  return v;
}

const Value* Dict::Find(const std::string& key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Dict::Set(const std::string& key, Value v) {
  CheckDepth(v);
  depth = std::max(depth, DepthOf(v) + 1);
  for (auto& [k, old] : items)
    if (k == key) {
      old = std::move(v);
      return;
    }
  items.emplace_back(key, std::move(v));
}

Value CallArgs::Get(size_t index, const char* name) const {
  if (index < pos.size()) return pos[index];
  for (const auto& [k, v] : kw)
    if (k == name) return v;
  return Value::Undefined();
}

void CallArgs::Check(const char* what, size_t max_pos, std::initializer_list<const char*> names)
    const {
  if (pos.size() > max_pos)
    RuntimeFail(std::string(what) + ": takes at most " + std::to_string(max_pos) +
                " positional arguments (" + std::to_string(pos.size()) + " given)");
  for (const auto& [k, v] : kw) {
    bool known = false;
    for (const char* n : names) known = known || k == n;
    if (!known) Unsupported(std::string(what) + ": keyword argument '" + k + "'");
  }
}

bool Truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return false;
    case Value::Kind::kBool: return v.b;
    case Value::Kind::kInt: return v.i != 0;
    case Value::Kind::kFloat: return v.f != 0;
    case Value::Kind::kString: return !v.s.empty();
    case Value::Kind::kList: return !v.list->empty();
    case Value::Kind::kDict: return !v.dict->items.empty();
    default: return true;
  }
}

std::string TypeName(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return "Undefined";
    case Value::Kind::kNone: return "NoneType";
    case Value::Kind::kBool: return "bool";
    case Value::Kind::kInt: return "int";
    case Value::Kind::kFloat: return "float";
    case Value::Kind::kString: return "str";
    case Value::Kind::kList: return v.tuple ? "tuple" : "list";
    case Value::Kind::kDict: return "dict";
    case Value::Kind::kNamespace: return "Namespace";
    case Value::Kind::kCallable: return "function";
  }
  return "?";
}

std::string FloatRepr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), x, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // shortest round trip: [-]d[.ddd]e[+-]XX
  const size_t e = sci.find('e');
  const int exp = std::stoi(sci.substr(e + 1));
  std::string mant = sci.substr(0, e);
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out = neg ? "-" : "";
  if (exp < -4 || exp >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + eb;
  }
  if (exp < 0) return out + "0." + std::string(size_t(-exp - 1), '0') + digits;
  if (digits.size() <= size_t(exp) + 1)
    return out + digits + std::string(size_t(exp) + 1 - digits.size(), '0') + ".0";
  return out + digits.substr(0, size_t(exp) + 1) + "." + digits.substr(size_t(exp) + 1);
}

std::vector<uint32_t> Decode(const std::string& s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
    uint32_t cp = n == 0 ? c : n == 1 ? (c & 0x1f) : n == 2 ? (c & 0x0f) : (c & 0x07);
    bool ok = n >= 0;
    for (int k = 1; ok && k <= n; ++k) {
      if (i + size_t(k) >= s.size() || (static_cast<unsigned char>(s[i + k]) >> 6) != 2) {
        ok = false;
        break;
      }
      cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    }
    if (!ok) {
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += size_t(n) + 1;
  }
  return out;
}

std::string Encode(const std::vector<uint32_t>& cps) {
  std::string out;
  out.reserve(cps.size());
  for (uint32_t cp : cps) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += char(0xE0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3f));
      out += char(0x80 | (cp & 0x3f));
    } else {
      out += char(0xF0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3f));
      out += char(0x80 | ((cp >> 6) & 0x3f));
      out += char(0x80 | (cp & 0x3f));
    }
  }
  return out;
}

size_t CodePointCount(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c >> 6) != 2;
  return n;
}

bool IsPySpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

namespace {

void AppendHex(std::string* out, const char* fmt, uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof(b), fmt, v);
  *out += b;
}

std::string StrRepr(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (uint32_t cp : Decode(s)) {
    if (cp == uint32_t(q) || cp == '\\') {
      out += '\\';
      out += char(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || cp == 0x7f || (cp >= 0x80 && cp <= 0xa0) || cp == 0xad) {
      AppendHex(&out, "\\x%02x", cp);
    } else if (cp == 0x2028 || cp == 0x2029 || (cp >= 0xd800 && cp <= 0xdfff)) {
      AppendHex(&out, "\\u%04x", cp);
    } else {
      out += Encode({cp});
    }
  }
  return out + q;
}

std::string JsonString(const std::string& s, bool ensure_ascii) {
  std::string out = "\"";
  for (uint32_t cp : Decode(s)) {
    switch (cp) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (cp < 0x20 || (ensure_ascii && cp >= 0x7f && cp < 0x10000)) {
      AppendHex(&out, "\\u%04x", cp);
    } else if (ensure_ascii && cp >= 0x10000) {
      const uint32_t v = cp - 0x10000;
      AppendHex(&out, "\\u%04x", 0xd800 + (v >> 10));
      AppendHex(&out, "\\u%04x", 0xdc00 + (v & 0x3ff));
    } else {
      out += Encode({cp});
    }
  }
  return out + "\"";
}

void JsonInto(const Value& v, const JsonStyle& st, int depth, std::string* out) {
  if (depth > 256) Fail(TemplateError::Kind::kLimit, "tojson: nesting deeper than 256");
  const bool pretty = st.indent >= 0;
  const std::string item_sep = !st.item_sep.empty() ? st.item_sep : pretty ? "," : ", ";
  const std::string key_sep = !st.key_sep.empty() ? st.key_sep : ": ";
  auto newline = [&](int level) {
    if (pretty) *out += "\n" + std::string(size_t(st.indent) * size_t(level), ' ');
  };
  switch (v.kind) {
    case Value::Kind::kNone: *out += "null"; return;
    case Value::Kind::kBool: *out += v.b ? "true" : "false"; return;
    case Value::Kind::kInt: *out += std::to_string(v.i); return;
    case Value::Kind::kFloat:
      if (std::isnan(v.f)) *out += "NaN";
      else if (std::isinf(v.f)) *out += v.f > 0 ? "Infinity" : "-Infinity";
      else *out += FloatRepr(v.f);
      return;
    case Value::Kind::kString: *out += JsonString(v.s, st.ensure_ascii); return;
    case Value::Kind::kList: {
      if (v.list->empty()) {
        *out += "[]";
        return;
      }
      *out += "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) *out += item_sep;
        newline(depth + 1);
        JsonInto((*v.list)[k], st, depth + 1, out);
      }
      newline(depth);
      *out += "]";
      return;
    }
    case Value::Kind::kDict: {
      if (v.dict->items.empty()) {
        *out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (st.sort_keys)
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      *out += "{";
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) *out += item_sep;
        newline(depth + 1);
        *out += JsonString(items[k]->first, st.ensure_ascii) + key_sep;
        JsonInto(items[k]->second, st, depth + 1, out);
      }
      newline(depth);
      *out += "}";
      return;
    }
    default:
      RuntimeFail("tojson: Object of type " + TypeName(v) + " is not JSON serializable");
  }
}

void ReprInto(const Value& v, int depth, std::string* out) {
  if (depth > 256) Fail(TemplateError::Kind::kLimit, "str(): nesting deeper than 256");
  switch (v.kind) {
    case Value::Kind::kString: *out += StrRepr(v.s); return;
    case Value::Kind::kList: {
      *out += v.tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) *out += ", ";
        ReprInto((*v.list)[k], depth + 1, out);
      }
      if (v.tuple && v.list->size() == 1) *out += ",";
      *out += v.tuple ? ")" : "]";
      return;
    }
    case Value::Kind::kDict: {
      *out += "{";
      for (size_t k = 0; k < v.dict->items.size(); ++k) {
        if (k) *out += ", ";
        *out += StrRepr(v.dict->items[k].first) + ": ";
        ReprInto(v.dict->items[k].second, depth + 1, out);
      }
      *out += "}";
      return;
    }
    case Value::Kind::kNamespace: Unsupported("str() of a namespace");
    case Value::Kind::kCallable: Unsupported("str() of a function ('" + v.s + "')");
    case Value::Kind::kUndefined: return;
    default: *out += Str(v);
  }
}

template <typename J>
Value FromJsonT(const J& j, int depth) {
  if (depth > 256) Fail(TemplateError::Kind::kLimit, "input JSON nested deeper than 256");
  if (j.is_null()) return Value::None();
  if (j.is_boolean()) return Value::Bool(j.template get<bool>());
  if (j.is_number_unsigned()) {
    const uint64_t u = j.template get<uint64_t>();
    if (u > uint64_t(INT64_MAX)) Unsupported("an integer beyond 64 bits in the input");
    return Value::Int(int64_t(u));
  }
  if (j.is_number_integer()) return Value::Int(j.template get<int64_t>());
  if (j.is_number_float()) return Value::Float(j.template get<double>());
  if (j.is_string()) return Value::Str(j.template get<std::string>());
  if (j.is_array()) {
    List items;
    for (const auto& e : j) items.push_back(FromJsonT(e, depth + 1));
    return Value::MakeList(std::move(items));
  }
  if (j.is_object()) {
    auto d = std::make_shared<Dict>();
    for (auto it = j.begin(); it != j.end(); ++it) d->Set(it.key(), FromJsonT(it.value(), depth + 1));
    return Value::MakeDict(std::move(d));
  }
  Unsupported("binary JSON values");
}

}  // namespace

std::string Str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return "";
    case Value::Kind::kNone: return "None";
    case Value::Kind::kBool: return v.b ? "True" : "False";
    case Value::Kind::kInt: return std::to_string(v.i);
    case Value::Kind::kFloat: return FloatRepr(v.f);
    case Value::Kind::kString: return v.s;
    default: {
      std::string out;
      ReprInto(v, 0, &out);
      return out;
    }
  }
}

std::string Repr(const Value& v) {
  std::string out;
  ReprInto(v, 0, &out);
  return out;
}

std::string Json(const Value& v, const JsonStyle& style) {
  std::string out;
  JsonInto(v, style, 0, &out);
  return out;
}

namespace {
bool NumEq(const Value& a, const Value& b) {
  if (a.kind == Value::Kind::kFloat || b.kind == Value::Kind::kFloat) {
    auto d = [](const Value& x) {
      return x.kind == Value::Kind::kFloat ? x.f : x.kind == Value::Kind::kBool ? double(x.b)
                                                                                 : double(x.i);
    };
    return d(a) == d(b);
  }
  auto n = [](const Value& x) { return x.kind == Value::Kind::kBool ? int64_t(x.b) : x.i; };
  return n(a) == n(b);
}
}  // namespace

bool Equal(const Value& a, const Value& b) {
  if (a.IsNumber() && b.IsNumber()) return NumEq(a, b);
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return true;
    case Value::Kind::kString: return a.s == b.s;
    case Value::Kind::kList: {
      if (a.tuple != b.tuple || a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!Equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    }
    case Value::Kind::kDict: {
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* o = b.dict->Find(k);
        if (o == nullptr || !Equal(v, *o)) return false;
      }
      return true;
    }
    case Value::Kind::kNamespace: return a.dict == b.dict;
    case Value::Kind::kCallable: return a.fn == b.fn;
    default: return false;
  }
}

bool Less(const Value& a, const Value& b) {
  if (a.IsNumber() && b.IsNumber()) {
    auto d = [](const Value& x) {
      return x.kind == Value::Kind::kFloat ? x.f : x.kind == Value::Kind::kBool ? double(x.b)
                                                                                 : double(x.i);
    };
    if (a.kind != Value::Kind::kFloat && b.kind != Value::Kind::kFloat) {
      auto n = [](const Value& x) { return x.kind == Value::Kind::kBool ? int64_t(x.b) : x.i; };
      return n(a) < n(b);
    }
    return d(a) < d(b);
  }
  if (a.IsString() && b.IsString()) return a.s < b.s;  // UTF-8 byte order = code point order
  if (a.kind == Value::Kind::kList && b.kind == Value::Kind::kList && a.tuple == b.tuple) {
    const size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      if (!Equal((*a.list)[k], (*b.list)[k])) return Less((*a.list)[k], (*b.list)[k]);
    }
    return a.list->size() < b.list->size();
  }
  RuntimeFail("'<' not supported between instances of '" + TypeName(a) + "' and '" +
              TypeName(b) + "'");
}

Value FromJson(const nlohmann::json& j) { return FromJsonT(j, 0); }
Value FromJson(const nlohmann::ordered_json& j) { return FromJsonT(j, 0); }

}  // namespace kvstream::frontend::jinja
