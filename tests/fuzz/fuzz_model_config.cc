// Fuzzes model::ConfigFromHfJson (a checkpoint's config.json). A config it accepts must be
// usable: its derived sizes computable without overflow, and written back by ConfigToHfJson it
// must read the same (same hash).
#include <cstdint>
#include <string>

#include "tests/fuzz/fuzz_util.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvstream::model;
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto config = ConfigFromHfJson(text);
  if (!config.ok()) return 0;
  const ModelConfig& c = *config;
  if (!c.Validate().ok()) kvstream::fuzz::Fail("accepted config fails Validate()");
  (void)c.group_size();
  (void)c.q_dim();
  (void)c.kv_dim();
  (void)c.kv_bytes_per_token();
  (void)c.decode_step_weight_bytes();
  auto back = ConfigFromHfJson(ConfigToHfJson(c));
  if (!back.ok()) kvstream::fuzz::Fail("written config refused: " + back.status().ToString());
  if (back->hash() != c.hash()) kvstream::fuzz::Fail("written config reads back different");
  return 0;
}
