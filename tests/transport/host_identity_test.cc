// core::HostIdentity: a same-host shortcut (cuda_ipc's keys, nccl's one-GPU check) is taken only
// with a peer that shows the same identity, so an unreadable boot id must never make two hosts
// look alike.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "transport/core/host_identity.h"

namespace kvstream::transport::core {
namespace {

TEST(HostIdentity, IsTheBootIdWhereItCanBeRead) {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string boot;
  if (!std::getline(f, boot) || boot.empty()) GTEST_SKIP() << "no boot id on this machine";
  EXPECT_EQ(HostIdentity(), boot);
  EXPECT_EQ(HostIdentity(), HostIdentity());
}

TEST(HostIdentity, AnUnreadableBootIdMatchesNoOtherProcess) {
  const std::string a = HostIdentityFromBootId("");
  const std::string b = HostIdentityFromBootId("");
  EXPECT_NE(a, b);
  EXPECT_EQ(a.rfind("no-boot-id/", 0), 0u) << a;
  EXPECT_EQ(a.size(), 11u + 32u);
  EXPECT_LE(a.size(), 47u);
}

TEST(HostIdentity, ABootIdIsKeptAsItIsWithinTheWireKeysSize) {
  EXPECT_EQ(HostIdentityFromBootId("2f1c9a4e-0000-4bbb-8ccc-1234567890ab"),
            "2f1c9a4e-0000-4bbb-8ccc-1234567890ab");
  EXPECT_EQ(HostIdentityFromBootId(std::string(60, 'x')).size(), 47u);
}

}  // namespace
}  // namespace kvstream::transport::core
