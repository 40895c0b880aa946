// Command-line flags for kvstream subcommands: "--name value" or "--name=value"; boolean
// flags take no value. Unknown flags, missing values and stray positional arguments are
// errors naming the flag. Shared helpers turn the model flags into a ModelSpec so every
// subcommand (local or remote generate, bench) reads them the same way.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/backend.h"

namespace kvstream::cli {

struct FlagSpec {
  std::string name;           // without the leading "--"
  bool takes_value = true;
  std::string help;
  std::string default_value;  // shown in help; returned by Get when absent
};

class Flags {
 public:
  // "--help" / "-h" is always accepted and sets help().
  static Result<Flags> Parse(std::span<const std::string> args, const std::vector<FlagSpec>& specs);
  bool help() const { return help_; }
  bool Has(const std::string& name) const { return values_.count(name) != 0; }
  std::string Get(const std::string& name) const;
  Result<int64_t> GetInt(const std::string& name, int64_t min, int64_t max) const;
  Result<DType> GetDType(const std::string& name) const;

 private:
  std::map<std::string, std::string> values_;
  std::map<std::string, std::string> defaults_;
  bool help_ = false;
};

std::string FlagsHelp(const std::vector<FlagSpec>& specs);

// The model flags: --model --layers --seed --weight-dtype --kv-dtype.
std::vector<FlagSpec> ModelFlagSpecs();
// Weight dtype defaults to f16 for presets and to config.json's torch_dtype for a checkpoint
// directory; KV dtype defaults to the weight dtype when that is 16-bit, else f16.
Result<model::ModelSpec> ModelSpecFromFlags(const Flags& flags);
// The backend flags: --backend --device --threads.
std::vector<FlagSpec> BackendFlagSpecs();
Result<model::BackendOptions> BackendOptionsFromFlags(const Flags& flags);
// "1,2,3" -> {1, 2, 3}; each id in [0, vocab) when vocab > 0.
Result<std::vector<int32_t>> ParseTokenList(const std::string& text);
// Prompt tokens from --prompt-tokens or --prompt-len N (deterministic ids from the seed).
std::vector<FlagSpec> PromptFlagSpecs();
Result<std::vector<int32_t>> PromptFromFlags(const Flags& flags, int vocab_size, uint64_t seed);

}  // namespace kvstream::cli
