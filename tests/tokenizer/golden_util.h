// Loading the tokenizer goldens of tests/tokenizer/data (one folder per family).
#pragma once

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvstream::tokenizer::testing {

inline const std::vector<std::string>& Families() {
  static const std::vector<std::string> f = {"llama3", "qwen2", "llama2", "mistral", "sp_bpe", "sp_unigram"};
  return f;
}

inline std::string DataDir() { return KVSTREAM_TOKENIZER_DATA; }

inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::vector<std::string> Corpus() {
  std::vector<std::string> lines;
  std::ifstream in(DataDir() + "/corpus.jsonl");
  for (std::string l; std::getline(in, l);) {
    if (!l.empty()) lines.push_back(nlohmann::json::parse(l).get<std::string>());
  }
  return lines;
}

inline nlohmann::json Golden(const std::string& family) {
  return nlohmann::json::parse(ReadAll(DataDir() + "/" + family + "/golden.json"));
}

}  // namespace kvstream::tokenizer::testing
