// Fuzzes daemon::ParseDaemonConfig: a --config JSON file, or (first byte odd) newline-separated
// command-line arguments. A configuration it accepts must print as JSON that parses.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/daemon_config.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvstream::daemon;
  if (size == 0) return 0;
  const bool as_args = data[0] & 1;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  std::vector<std::string> args = {"kvstream-fuzz"};
  std::string role = (data[0] & 2) ? "decode" : "prefill";
  kvstream::fuzz::MemFile file(as_args ? std::string_view() : std::string_view(body));
  if (as_args) {
    size_t start = 0;
    while (start <= body.size()) {
      size_t end = body.find('\n', start);
      if (end == std::string::npos) end = body.size();
      args.push_back(body.substr(start, end - start));
      // A --config path of the fuzzer's choosing could name a device that never ends.
      if (args.back().find("config") != std::string::npos) return 0;
      start = end + 1;
    }
  } else {
    args.push_back("--config=" + file.path());
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  auto config = ParseDaemonConfig(static_cast<int>(args.size()), argv.data(), role);
  if (!config.ok()) return 0;
  const std::string json = config->ToJson();
  if (nlohmann::json::parse(json, nullptr, false).is_discarded())
    kvstream::fuzz::Fail("ToJson() is not JSON: " + json);
  (void)SplitPeers(config->peer);
  return 0;
}
