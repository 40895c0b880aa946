// The defaults a checkpoint's generation_config.json gives a request: its end-of-sequence ids,
// which end generation unless the request says otherwise. The file is input from whoever
// wrote the checkpoint: anything malformed is an error naming the key, never a crash.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace kvstream::model {

inline constexpr size_t kMaxGenerationConfigBytes = 1 << 20;
inline constexpr size_t kMaxEosTokens = 64;

struct GenerationDefaults {
  std::vector<int32_t> eos_token_ids;  // distinct, each in [0, vocab_size)
};

// From the text of a generation_config.json: "eos_token_id" as an integer, a list of integers
// (at most kMaxEosTokens) or null/absent (no default stop tokens). kInvalidArgument for text
// that is not a JSON object, over kMaxGenerationConfigBytes, or an eos_token_id of another
// type or outside [0, vocab_size). Other keys are ignored (they are a client's defaults).
Result<GenerationDefaults> GenerationDefaultsFromJson(const std::string& text, int vocab_size);

// `model` is a checkpoint directory: its generation_config.json (none: empty defaults); a
// preset name (not a directory): empty defaults.
Result<GenerationDefaults> LoadGenerationDefaults(const std::string& model, int vocab_size);

}  // namespace kvstream::model
