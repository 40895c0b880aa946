#include "model/generation_config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace kvstream::model {

namespace fs = std::filesystem;
using json = nlohmann::json;

Result<GenerationDefaults> GenerationDefaultsFromJson(const std::string& text, int vocab_size) {
  if (text.size() > kMaxGenerationConfigBytes)
    return InvalidArgument("generation_config.json: over " +
                           std::to_string(kMaxGenerationConfigBytes) + " bytes");
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return InvalidArgument("generation_config.json: not a JSON object");
  GenerationDefaults d;
  auto it = j.find("eos_token_id");
  if (it == j.end() || it->is_null()) return d;
  auto add = [&](const json& v) -> Status {
    if (!v.is_number_integer())
      return InvalidArgument("generation_config.json: 'eos_token_id' must be an integer or a "
                             "list of integers, got " + v.dump().substr(0, 64));
    const int64_t id = v.get<int64_t>();
    if (id < 0 || id >= vocab_size)
      return InvalidArgument("generation_config.json: eos_token_id " + std::to_string(id) +
                             " outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
    if (std::find(d.eos_token_ids.begin(), d.eos_token_ids.end(), id) == d.eos_token_ids.end())
      d.eos_token_ids.push_back(int32_t(id));
    return OkStatus();
  };
  if (it->is_array()) {
    if (it->size() > kMaxEosTokens)
      return InvalidArgument("generation_config.json: 'eos_token_id' has " +
                             std::to_string(it->size()) + " entries (at most " +
                             std::to_string(kMaxEosTokens) + ")");
    for (const json& v : *it) KV_RETURN_IF_ERROR(add(v));
  } else {
    KV_RETURN_IF_ERROR(add(*it));
  }
  return d;
}

Result<GenerationDefaults> LoadGenerationDefaults(const std::string& model, int vocab_size) {
  std::error_code ec;
  if (!fs::is_directory(model, ec)) return GenerationDefaults{};
  const fs::path path = fs::path(model) / "generation_config.json";
  if (!fs::exists(path, ec)) return GenerationDefaults{};
  if (!fs::is_regular_file(path, ec))
    return InvalidArgument(path.string() + ": not a regular file");
  const auto size = fs::file_size(path, ec);
  if (ec) return InvalidArgument(path.string() + ": " + ec.message());
  if (size > kMaxGenerationConfigBytes)
    return InvalidArgument(path.string() + ": over " + std::to_string(kMaxGenerationConfigBytes) +
                           " bytes");
  std::ifstream f(path, std::ios::binary);
  if (!f) return InvalidArgument(path.string() + ": cannot be read");
  std::stringstream ss;
  ss << f.rdbuf();
  auto d = GenerationDefaultsFromJson(ss.str(), vocab_size);
  if (!d.ok()) return d.status().WithContext(path.string());
  return d;
}

}  // namespace kvstream::model
