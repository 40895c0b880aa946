#include "common/version.h"

#include <cstdio>
#include <cstring>

namespace kvstream {

std::string VersionText(const std::string& program) {
  return program + " " KVSTREAM_VERSION_STRING " (commit " + BuildCommit() + ")\n" +
         "build: " KVSTREAM_BUILD_OPTIONS "\n" + "built against: " KVSTREAM_BUILT_AGAINST "\n";
}

bool PrintVersionIfAsked(int argc, char** argv, const std::string& program) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--version") == 0) {
      std::fputs(VersionText(program).c_str(), stdout);
      return true;
    }
  }
  return false;
}

}  // namespace kvstream
