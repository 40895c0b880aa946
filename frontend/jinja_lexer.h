// Jinja template source -> tokens (frontend/jinja_lexer.cc says what it follows). Internal to
// frontend/.
#pragma once

#include <string>
#include <vector>

#include "frontend/jinja_value.h"

namespace kvstream::frontend::jinja {

struct Token {
  enum Kind { kData, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat,
              kOp, kEof };
  Kind kind;
  std::string text;  // kData: the text after whitespace control; kString: the decoded value
  int line = 1;
};

// Throws TemplateError (kSyntax: unterminated tag, comment or string, unbalanced brackets, a
// stray character; kUnsupported: {% raw %}, \N{} escapes, prefixed integer literals).
std::vector<Token> Tokenize(const std::string& source);

}  // namespace kvstream::frontend::jinja
