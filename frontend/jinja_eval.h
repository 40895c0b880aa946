// Renders a parsed template (frontend/jinja_parser.h) with Jinja2's semantics as HF's
// ImmutableSandboxedEnvironment has them: a for loop's body is a scope of its own (assignments in
// it do not outlive the iteration; namespace() objects carry state out), missing attributes and
// items are undefined (printing as ""), using an undefined value where a value is needed is an
// error, lists and dicts are immutable. Work and output are bounded (RenderLimits): a template
// that loops forever or grows without end fails with a kLimit TemplateError.
//
// Internal to frontend/ (frontend/chat_template.h is the API).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "frontend/jinja_parser.h"
#include "frontend/jinja_value.h"

namespace kvstream::frontend::jinja {

struct RenderLimits {
  size_t max_output_bytes = 8u << 20;  // also the largest string a template may build
  int64_t max_steps = 2'000'000;       // loop iterations + expressions evaluated + calls
  int max_call_depth = 32;             // nested macro calls
};

class Renderer {
 public:
  // `globals`: the render variables (messages, bos_token, ...), looked up after the template's
  // own assignments and before the built-in globals (range, namespace, dict, raise_exception,
  // strftime_now).
  Renderer(const Body& body, std::shared_ptr<Dict> globals, RenderLimits limits);
  // The output; throws TemplateError.
  std::string Render();

  // Used by the built-ins (frontend/jinja_builtins.cc).
  Value GetAttr(const Value& obj, const std::string& name);
  Value GetItem(const Value& obj, const Value& key);
  Value Call(const Value& fn, CallArgs& args);
  Value Filter(const std::string& name, const Value& v, CallArgs& args);
  bool Test(const std::string& name, const Value& v, CallArgs& args);
  List Iterate(const Value& v);
  void Step(int64_t n = 1);
  void CheckSize(size_t bytes) const;

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  Flow Exec(const Body& body, std::string* out);
  Flow ExecStmt(const Stmt& s, std::string* out);
  void ExecFor(const Stmt& s, std::string* out);
  void Assign(const std::vector<std::string>& targets, const Value& v, int line);
  Value Eval(const Expr& e);
  Value EvalBinary(const std::string& op, const Value& a, const Value& b, int line);
  Value Slice(const Value& v, const Value& start, const Value& stop, const Value& step);
  Value Lookup(const std::string& name);
  Value MakeMacro(const Stmt& s);
  void Append(std::string* out, const std::string& text);

  const Body& body_;
  std::shared_ptr<Dict> globals_;
  std::shared_ptr<Dict> builtins_;
  RenderLimits limits_;
  std::vector<std::shared_ptr<Dict>> scopes_;  // [0] = the template's top level
  int64_t steps_ = 0;
  int call_depth_ = 0;
};

// The built-in globals (range, namespace, dict, raise_exception, strftime_now).
std::shared_ptr<Dict> BuiltinGlobals(Renderer* r);
// A method of a str / dict value (strip, split, items, get, ...); undefined when there is none.
Value Method(Renderer* r, const Value& obj, const std::string& name);
Value ApplyFilter(Renderer* r, const std::string& name, const Value& v, CallArgs& args);
bool ApplyTest(Renderer* r, const std::string& name, const Value& v, CallArgs& args);
// Python's int arithmetic with overflow as an error.
int64_t CheckedInt(__int128 v);

}  // namespace kvstream::frontend::jinja
