// kvstream: one binary, subcommands listed in cli/commands.h.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "common/version.h"

namespace kvstream::cli {

int ReportError(const std::string& command, const Status& status, bool usage) {
  std::cerr << "kvstream " << command << ": " << status.ToString() << "\n";
  if (usage) std::cerr << "run 'kvstream " << command << " --help' for its flags\n";
  return usage ? kExitUsage : kExitFailed;
}

namespace {

struct Command {
  const char* name;
  int (*run)(std::span<const std::string>);
  const char* summary;
};

#define KVSTREAM_CLI_ENTRY(name, fn, summary) Command{name, &fn, summary},
const Command kCommands[] = {KVSTREAM_CLI_COMMANDS(KVSTREAM_CLI_ENTRY)};
#undef KVSTREAM_CLI_ENTRY

void Usage(std::ostream& os) {
  os << "usage: kvstream <command> [flags]   (kvstream <command> --help for its flags)\n"
        "       kvstream --version             (version, commit, build options, library versions)\n\n"
        "commands:\n";
  for (const auto& c : kCommands) {
    std::string n = c.name;
    os << "  " << n << std::string(n.size() < 18 ? 18 - n.size() : 1, ' ') << c.summary << "\n";
  }
}

}  // namespace
}  // namespace kvstream::cli

int main(int argc, char** argv) {
  using namespace kvstream::cli;
  if (argc < 2) {
    Usage(std::cerr);
    return kExitUsage;
  }
  const std::string cmd = argv[1];
  if (cmd == "--version" || cmd == "version") {
    std::fputs(kvstream::VersionText("kvstream").c_str(), stdout);
    return kExitOk;
  }
  if (cmd == "help" || cmd == "--help" || cmd == "-h") {
    Usage(std::cout);
    return kExitOk;
  }
  std::vector<std::string> args(argv + 2, argv + argc);
  for (const auto& c : kCommands)
    if (cmd == c.name) return c.run(args);
  std::cerr << "kvstream: unknown command '" << cmd << "'\n\n";
  Usage(std::cerr);
  return kExitUsage;
}
