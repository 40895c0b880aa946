// tokenizer_encode: single-thread encode rate of kvstream's tokenizer over a text file's lines
// (bench/tokenizer_vs_reference.sh runs it beside Hugging Face tokenizers on the same file and tokenizer).
//   tokenizer_encode TOKENIZER_PATH TEXT_FILE [SECONDS] [lines|whole]
// lines (default): each line is one text; whole: the file (less its last newline) is one text.
// Prints one JSON line: bytes, lines, tokens, seconds, MB/s, and a checksum of the ids (the
// reference side prints the same one, so the two encoded the same thing).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: tokenizer_encode TOKENIZER_PATH TEXT_FILE [SECONDS]\n");
    return 2;
  }
  const double min_seconds = argc > 3 ? std::atof(argv[3]) : 3.0;
  const bool whole = argc > 4 && std::string(argv[4]) == "whole";
  auto tok = kvstream::tokenizer::Tokenizer::Load(argv[1]);
  if (!tok.ok()) {
    std::fprintf(stderr, "tokenizer_encode: %s\n", tok.status().ToString().c_str());
    return 1;
  }
  std::vector<std::string> lines;
  size_t bytes = 0;
  std::ifstream in(argv[2], std::ios::binary);
  for (std::string l; std::getline(in, l);) {
    bytes += l.size();
    lines.push_back(std::move(l));
  }
  if (whole) {
    std::string all;
    for (size_t i = 0; i < lines.size(); ++i) all += (i ? "\n" : "") + lines[i];
    bytes = all.size();
    lines.assign(1, std::move(all));
  }
  // One untimed pass (the reference library also caches words), then whole passes until
  // min_seconds; the rate is the best pass's.
  using Clock = std::chrono::steady_clock;
  uint64_t checksum = 0, tokens = 0;
  double best = 1e30, total = 0;
  int passes = 0;
  for (int pass = -1; pass < 1 || total < min_seconds; ++pass) {
    const auto t0 = Clock::now();
    uint64_t sum = 0, n = 0;
    for (const auto& l : lines) {
      auto ids = (*tok)->Encode(l, false);
      if (!ids.ok()) {
        std::fprintf(stderr, "tokenizer_encode: %s\n", ids.status().ToString().c_str());
        return 1;
      }
      for (const int32_t id : *ids) sum = sum * 1000003 + static_cast<uint64_t>(id);
      n += ids->size();
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    checksum = sum;
    tokens = n;
    if (pass < 0) continue;
    total += s;
    ++passes;
    if (s < best) best = s;
  }
  std::printf("{\"impl\": \"kvstream\", \"mode\": \"%s\", \"bytes\": %zu, \"lines\": %zu, \"tokens\": %llu, \"passes\": %d, "
              "\"best_s\": %.6f, \"mb_per_s\": %.3f, \"checksum\": \"%llu\"}\n",
              whole ? "whole" : "lines", bytes, lines.size(), static_cast<unsigned long long>(tokens), passes, best,
              bytes / best / 1e6, static_cast<unsigned long long>(checksum));
  return 0;
}
