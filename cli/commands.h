// kvstream subcommands. To add one: write cli/cmd_<name>.cc defining
//   int Run<Name>(std::span<const std::string> args)   (args: after the subcommand name)
// add it to cli/CMakeLists.txt, and add one line to KVSTREAM_CLI_COMMANDS below.
// Exit codes: 0 success, 1 the operation failed, 2 bad usage (flags).
#pragma once

#include <span>
#include <string>

#include "common/status.h"

// X(name, function, one-line summary)
#define KVSTREAM_CLI_COMMANDS(X)                                                          \
  X("generate", RunGenerate, "generate tokens in this process (prefill + decode)")        \
  X("make-checkpoint", RunMakeCheckpoint, "write a dummy-weight HF checkpoint directory") \
  X("tokenize", RunTokenize, "encode stdin's lines with a checkpoint's tokenizer (or --decode ids)") \
  X("presets", RunPresets, "list model presets with shapes and KV bytes per token")         \
  X("bench", RunBench, "benchmarks through the daemons: ttft (pipelined/non-pipelined/colocated), itl, serve (OpenAI HTTP)") \
  X("stats", RunStats, "what running daemons report: pool, requests, tokens, KV bytes moved") \
  X("kv-store", RunKvStore, "the shared KV tier on Redis: probe its servers, erase kvstream's keys")

namespace kvstream::cli {

#define KVSTREAM_CLI_DECLARE(name, fn, summary) int fn(std::span<const std::string> args);
KVSTREAM_CLI_COMMANDS(KVSTREAM_CLI_DECLARE)
#undef KVSTREAM_CLI_DECLARE

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

// Prints "kvstream <command>: <status>" to stderr; returns kExitUsage for kInvalidArgument
// from flag parsing (pass usage=true), else kExitFailed.
int ReportError(const std::string& command, const Status& status, bool usage);

}  // namespace kvstream::cli
