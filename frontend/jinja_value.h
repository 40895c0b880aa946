// The values a Jinja template computes with, as Python's Jinja2 has them: undefined, None, bool,
// int, float, str (UTF-8), list / tuple, dict (insertion-ordered, string keys), namespace and
// callables. Conversions follow Python: Str() is str(), Repr() is repr(), Json() is HF
// transformers' tojson filter (json.dumps with ensure_ascii=False by default).
//
// Internal to frontend/ (the chat template renderer, frontend/chat_template.h). Errors are thrown
// as TemplateError and turned into a Status at that API; nothing here aborts.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace kvstream::frontend::jinja {

// kind: what the caller did wrong. kSyntax / kRuntime: the template or its input (HTTP 400);
// kUnsupported: a construct this engine does not implement (named in the message); kLimit: a
// bound on work or size was reached; kRaised: the template's own raise_exception(message).
class TemplateError : public std::runtime_error {
 public:
  enum class Kind { kSyntax, kRuntime, kUnsupported, kLimit, kRaised };
  TemplateError(Kind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};
[[noreturn]] void Fail(TemplateError::Kind kind, const std::string& what);
[[noreturn]] inline void Unsupported(const std::string& what) {
  Fail(TemplateError::Kind::kUnsupported, "unsupported: " + what);
}
[[noreturn]] inline void RuntimeFail(const std::string& what) {
  Fail(TemplateError::Kind::kRuntime, what);
}

struct Value;
struct Dict;
struct CallArgs;
using List = std::vector<Value>;
using Function = std::function<Value(CallArgs&)>;

struct Value {
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace,
                    kCallable };
  Kind kind = Kind::kUndefined;
  bool b = false;
  bool tuple = false;
  int depth = 0;  // kList: 1 + the deepest item's depth (a kDict / kNamespace keeps it in Dict)  // a kList that Python would hold as a tuple (repr with parentheses)
  int64_t i = 0;
  double f = 0;
  std::string s;  // kString; for kUndefined the hint ("'x' is undefined"); kCallable its name
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;  // kDict and kNamespace (a namespace is a mutable dict)
  std::shared_ptr<Function> fn;

  static Value Undefined(std::string hint = {});
  static Value None();
  static Value Bool(bool v);
  static Value Int(int64_t v);
  static Value Float(double v);
  static Value Str(std::string v);
  static Value MakeList(List items, bool is_tuple = false);
  static Value MakeDict(std::shared_ptr<Dict> d);
  static Value Callable(std::string name, Function fn);

  bool IsUndefined() const { return kind == Kind::kUndefined; }
  bool IsNone() const { return kind == Kind::kNone; }
  bool IsString() const { return kind == Kind::kString; }
  bool IsNumber() const { return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool; }
  bool IsMapping() const { return kind == Kind::kDict || kind == Kind::kNamespace; }
};

// Values nest at most this deep (lists, dicts, namespaces): comparing, printing and freeing them
// recurse through the nesting.
constexpr int kMaxValueDepth = 200;
int DepthOf(const Value& v);

struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  int depth = 1;  // 1 + the deepest value ever set (never lowered)
  const Value* Find(const std::string& key) const;
  void Set(const std::string& key, Value v);
};

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  // The argument at position `index` or named `name`; undefined when absent.
  Value Get(size_t index, const char* name) const;
  // Fails unless every positional index < max_pos and every keyword is in `names`.
  void Check(const char* what, size_t max_pos, std::initializer_list<const char*> names) const;
};

bool Truthy(const Value& v);
std::string TypeName(const Value& v);   // Python's: 'str', 'int', 'dict', ...
std::string Str(const Value& v);        // str(v); undefined is ""
std::string Repr(const Value& v);       // repr(v)
std::string FloatRepr(double v);        // repr(float): shortest round trip, Python's layout
// json.dumps(v, ensure_ascii, indent (< 0: none), separators, sort_keys), as HF's tojson.
struct JsonStyle {
  bool ensure_ascii = false;
  int indent = -1;
  std::string item_sep, key_sep;  // empty: Python's defaults for the indent
  bool sort_keys = false;
};
std::string Json(const Value& v, const JsonStyle& style);
bool Equal(const Value& a, const Value& b);  // Python ==
// Python <, for numbers and strings (code point order); other kinds fail.
bool Less(const Value& a, const Value& b);

Value FromJson(const nlohmann::json& j);
Value FromJson(const nlohmann::ordered_json& j);  // keeps the objects' key order

// Code points of UTF-8 text (invalid bytes decode as U+FFFD) and back.
std::vector<uint32_t> Decode(const std::string& s);
std::string Encode(const std::vector<uint32_t>& cps);
size_t CodePointCount(const std::string& s);
bool IsPySpace(uint32_t cp);  // Python's str.isspace for one code point

}  // namespace kvstream::frontend::jinja
