// What a kvstream binary is: `--version` of every program prints VersionText(). Its own target
// (kvstream_version), linked by the programs alone, so a new commit relinks only them.
#pragma once

#include <string>

namespace kvstream {

// "<program> <version> (commit <hash>[-dirty])", then "build: ..." (build type, CUDA code or
// CPU-only, transports, fault injection, sanitizers) and "built against: ..." (the CUDA toolkit,
// UCX, gRPC and protobuf versions the build was configured with; "-" for a part not built).
// The commit is read from git at build time, or KVSTREAM_GIT_COMMIT given to CMake (a source
// tree without .git, e.g. a container build), else "unknown". Each line ends in '\n'.
std::string VersionText(const std::string& program);

// The commit alone, as in VersionText.
const char* BuildCommit();

// When "--version" is one of argv[1..]: prints VersionText(program) to stdout and returns true
// (the program then exits 0).
bool PrintVersionIfAsked(int argc, char** argv, const std::string& program);

}  // namespace kvstream
