// Client side of the daemons for the kvstream CLI (built with KVSTREAM_WITH_DAEMONS).
//   kvstream generate --decode HOST:PORT ...   generation through a decode daemon
//   kvstream bench ttft --decode ... --prefill ...   TTFT/ITL benchmark (see cmd_bench.cc)
#pragma once

#include <span>
#include <string>

namespace kvstream::cli {

// True when args ask for remote generation (a --decode flag).
bool WantsRemoteGenerate(std::span<const std::string> args);
int RunRemoteGenerate(std::span<const std::string> args);

}  // namespace kvstream::cli
