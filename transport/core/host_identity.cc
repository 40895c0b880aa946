#include "transport/core/host_identity.h"

#include <fstream>

namespace kvstream::transport::core {

std::string HostIdentity() {
  static const std::string id = [] {
    std::ifstream f("/proc/sys/kernel/random/boot_id");
    std::string s;
    std::getline(f, s);
    if (s.empty()) s = "unknown-boot-id";
    return s;
  }();
  return id;
}

}  // namespace kvstream::transport::core
