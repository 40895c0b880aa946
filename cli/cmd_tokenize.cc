// kvstream tokenize: encode standard input's lines with a checkpoint's tokenizer (or decode them).
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <iostream>
#include <string>

#include "cli/commands.h"
#include "cli/flags.h"
#include "tokenizer/tokenizer.h"

namespace kvstream::cli {

namespace {

std::vector<FlagSpec> TokenizeSpecs() {
  return {
      {"tokenizer", true, "a checkpoint folder, a tokenizer.json or a tokenizer.model", ""},
      {"decode", false, "read lines of space-separated ids and print their text", ""},
      {"no-special-tokens", false, "encode without the special tokens the template adds (BOS); decode skipping special tokens", ""},
  };
}

Result<std::vector<int32_t>> ParseIds(const std::string& line) {
  std::vector<int32_t> ids;
  const char* p = line.c_str();
  while (*p != '\0') {
    while (*p == ' ' || *p == '\t' || *p == '\r') ++p;
    if (*p == '\0') break;
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(p, &end, 10);
    if (end == p || errno != 0 || v < INT32_MIN || v > INT32_MAX || (*end != '\0' && *end != ' ' && *end != '\t' && *end != '\r')) {
      return InvalidArgument("'" + line + "' is not a list of token ids separated by spaces");
    }
    ids.push_back(static_cast<int32_t>(v));
    p = end;
  }
  return ids;
}

}  // namespace

int RunTokenize(std::span<const std::string> args) {
  const auto specs = TokenizeSpecs();
  auto flags = Flags::Parse(args, specs);
  if (!flags.ok()) return ReportError("tokenize", flags.status(), true);
  if (flags->help()) {
    std::cout << "usage: kvstream tokenize --tokenizer PATH [--decode] < lines\n"
                 "Prints each input line's token ids, space-separated, one output line per input line;\n"
                 "with --decode, reads ids and prints the text (docs/tokenizers.md).\n\n"
              << FlagsHelp(specs);
    return kExitOk;
  }
  if (!flags->Has("tokenizer")) return ReportError("tokenize", InvalidArgument("--tokenizer is required"), true);
  auto tok = tokenizer::Tokenizer::Load(flags->Get("tokenizer"));
  if (!tok.ok()) return ReportError("tokenize", tok.status(), false);
  const bool decode = flags->Has("decode");
  const bool special = !flags->Has("no-special-tokens");
  std::ios::sync_with_stdio(false);
  std::string line, out;
  for (int64_t n = 1; std::getline(std::cin, line); ++n) {
    out.clear();
    if (decode) {
      auto ids = ParseIds(line);
      if (!ids.ok()) return ReportError("tokenize", ids.status().WithContext("line " + std::to_string(n)), false);
      auto text = (*tok)->Decode(*ids, !special);
      if (!text.ok()) return ReportError("tokenize", text.status().WithContext("line " + std::to_string(n)), false);
      out = std::move(*text);
    } else {
      auto ids = (*tok)->Encode(line, special);
      if (!ids.ok()) return ReportError("tokenize", ids.status().WithContext("line " + std::to_string(n)), false);
      for (size_t i = 0; i < ids->size(); ++i) {
        if (i) out.push_back(' ');
        out += std::to_string((*ids)[i]);
      }
    }
    out.push_back('\n');
    std::cout << out;
  }
  std::cout.flush();
  return std::cout ? kExitOk : kExitFailed;
}

}  // namespace kvstream::cli
