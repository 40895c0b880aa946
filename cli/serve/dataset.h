// The workloads of `kvstream bench serve` (docs/benchmarks.md) and the request bodies built
// from them. Every workload is a list of conversations; a single-prompt dataset is conversations
// of one turn. Deterministic from the seed.
//  - random: prompts of input_len and answers of output_len tokens, each drawn uniformly from
//    [floor(len * (1 - range_ratio)), ceil(len * (1 + range_ratio))] as vLLM's random dataset
//    (answers at least 1). Prompts as token ids ((offset + i + j) % vocab, vLLM's scheme) or as
//    text of common English words (about one token per word; the server's usage is counted).
//  - jsonl: one {"prompt": string or [ids], "max_tokens": n} per line (max_tokens optional).
//  - multiturn: N conversations x T turns; one system prompt of S tokens shared by all; turn t's
//    prompt = turn t-1's prompt + its answer + a new user message (random lengths as above).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace kvstream::cli::serve {

struct Message {
  std::string text;          // text prompts
  std::vector<int32_t> ids;  // token-id prompts
};

struct Turn {
  Message user;
  int max_tokens = 0;
};

struct Conversation {
  bool ids = false;  // prompts as token ids (else text)
  Message system;    // shared prefix (empty for single-prompt datasets)
  std::vector<Turn> turns;
};

struct DatasetOptions {
  std::string kind = "random";  // random | jsonl | multiturn
  std::string path;             // jsonl
  int num_prompts = 1000;
  int input_len = 1024, output_len = 128;
  double range_ratio = 0;
  bool ids = false;             // random/multiturn prompts as token ids
  int vocab_size = 0;           // required with ids
  int conversations = 16, turns = 4, system_len = 512;  // multiturn
  uint64_t seed = 0;
};
Result<std::vector<Conversation>> MakeDataset(const DatasetOptions& o);

struct BodyOptions {
  bool chat = false;  // /v1/chat/completions (messages) instead of /v1/completions (prompt)
  std::string model;
  double temperature = 0;
  bool ignore_eos = false;
  std::string load_mode;  // pipelined | non-pipelined | local; empty: the daemon's default
  nlohmann::json extra = nlohmann::json::object();  // merged into every body last
};

// The completions prompt of a conversation's turn: the system prompt, each earlier turn's user
// message and answer, then this turn's user message (ids and text both built; c.ids says which
// is used). *prompt_len: the ids' count, or the text's words (an estimate of its tokens).
Message TurnPrompt(const Conversation& c, size_t turn, const std::vector<Message>& answers, int* prompt_len);

// The body of a conversation's turn `turn` given the answers of its earlier turns (a text
// answer is appended as text; with ids, its token ids, asked for with vLLM's return_token_ids).
// Always streamed with stream_options.include_usage. *prompt_len: the prompt's tokens when
// known exactly (ids), else an estimate (words).
std::string RequestBody(const Conversation& c, size_t turn, const std::vector<Message>& answers,
                        const BodyOptions& o, int* prompt_len);

}  // namespace kvstream::cli::serve
