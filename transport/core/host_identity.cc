#include "transport/core/host_identity.h"

#include <cstdio>
#include <fstream>
#include <random>

namespace kvstream::transport::core {

std::string HostIdentityFromBootId(const std::string& boot_id) {
  if (!boot_id.empty()) return boot_id.substr(0, 47);
  std::random_device rd;
  std::string id = "no-boot-id/";
  for (int i = 0; i < 4; ++i) {
    char hex[9];
    std::snprintf(hex, sizeof(hex), "%08x", static_cast<unsigned>(rd()));
    id += hex;
  }
  return id;
}

std::string HostIdentity() {
  static const std::string id = [] {
    std::ifstream f("/proc/sys/kernel/random/boot_id");
    std::string s;
    std::getline(f, s);
    return HostIdentityFromBootId(s);
  }();
  return id;
}

}  // namespace kvstream::transport::core
