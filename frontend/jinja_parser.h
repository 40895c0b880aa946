// A Jinja template parsed as Hugging Face transformers compiles chat templates: Jinja2 with
// trim_blocks and lstrip_blocks, keep_trailing_newline off, the loopcontrols extension (break,
// continue) and {% generation %} (rendered as its body). Parse() reads the whole grammar that
// chat templates use; a tag or syntax outside it is a TemplateError naming it, never skipped.
//
// Internal to frontend/ (frontend/chat_template.h is the API).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "frontend/jinja_value.h"

namespace kvstream::frontend::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Expr {
  enum class Kind {
    kLiteral,   // value
    kName,      // name
    kList,      // args (tuple: value.tuple)
    kDict,      // kw_exprs: (key expr, value expr) pairs in args, alternating
    kAttr,      // args[0].name
    kItem,      // args[0][args[1]]
    kSlice,     // args[0][args[1]:args[2]:args[3]] (null = omitted)
    kCall,      // args[0](args[1..], kwargs)
    kFilter,    // args[0] | name(args[1..], kwargs)
    kTest,      // args[0] is [not] name(args[1..])
    kUnary,     // name: "-", "+", "not"
    kBinary,    // name: + - * / // % ** ~ == != < > <= >= in notin; args[0], args[1]
    kAnd,
    kOr,
    kCond,      // args[1] if args[0] else args[2] (args[2] null: undefined)
  };
  Kind kind;
  int line = 0;
  int height = 1;  // 1 + the tallest argument's height
  std::string name;
  bool negated = false;  // kTest: "is not"
  Value value;           // kLiteral; kList: value.tuple
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Stmt {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // exprs[i] -> bodies[i]; a trailing else body when bodies.size() > exprs.size()
    kFor,       // targets in exprs[0] [if exprs[1]]: bodies[0], else bodies[1]
    kSet,       // targets = exprs[0]; or attr set: targets[0] . attr = exprs[0]
    kSetBlock,  // targets[0] = rendered bodies[0]
    kMacro,     // name(params = exprs defaults): bodies[0]
    kBreak,
    kContinue,
    kBlock,     // bodies[0] rendered as is ({% generation %})
  };
  Kind kind;
  int line = 0;
  std::string text;                  // kText; kMacro: name; kSet with attr: the attribute
  std::vector<std::string> targets;  // kFor / kSet / kSetBlock names; kMacro parameters
  std::vector<ExprPtr> exprs;        // kMacro: one default per parameter (null: none)
  std::vector<Body> bodies;
};

struct ParseLimits {
  size_t max_source_bytes = 1 << 20;
  int max_depth = 64;     // nested expressions and blocks
  int max_height = 256;   // an expression tree's height (chains of + or | grow it too)
};

// The template's statements; throws TemplateError (kSyntax or kUnsupported, with the line).
Body Parse(const std::string& source, const ParseLimits& limits = {});

}  // namespace kvstream::frontend::jinja
