// Two network hosts on one machine, for tests: a network namespace joined to the test's own by a
// veth pair, set up with iproute2's `ip` (and `tc` to limit its rate). Names carry the process
// id, so tests running at once do not collide. Setup() says why it is impossible here (not root,
// no `ip`, no namespaces) instead of failing: the caller skips with that reason.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace kvstream::testing {

// Moves this process into the network namespace at `path` (e.g. VethPair::Path()) as `ip netns
// exec` does: also a mount namespace of its own with /sys mounted again, so that what reads
// /sys/class/net (UCX's device list among them) sees the namespace's devices, not the ones of
// the namespace /sys was mounted in. "" on success, else why not.
inline std::string EnterNetns(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "open " + path + ": " + std::strerror(errno);
  const int rc = setns(fd, CLONE_NEWNET);
  const int err = errno;
  close(fd);
  if (rc != 0) return "setns " + path + ": " + std::strerror(err);
  if (unshare(CLONE_NEWNS) != 0) return std::string("unshare(CLONE_NEWNS): ") + std::strerror(errno);
  if (mount("", "/", nullptr, MS_SLAVE | MS_REC, nullptr) != 0) {
    return std::string("making / a slave mount: ") + std::strerror(errno);
  }
  umount2("/sys", MNT_DETACH);  // not mounted is fine
  if (mount("sysfs", "/sys", "sysfs", 0, nullptr) != 0) {
    return std::string("mounting /sys: ") + std::strerror(errno);
  }
  return "";
}

class VethPair {
 public:
  // `tag`: a short prefix of the names (the namespace "<tag>-<pid>", the devices "<tag>i/o<n>").
  explicit VethPair(const std::string& tag, int subnet_base = 10) {
    const std::string n = std::to_string(getpid() % 1000000);
    ns = tag + "-" + std::to_string(getpid());
    inner = tag.substr(0, 3) + "i" + n;  // inside the namespace
    outer = tag.substr(0, 3) + "o" + n;  // in the test's namespace
    const int subnet = subnet_base + getpid() % 200;
    inner_ip = "10.211." + std::to_string(subnet) + ".1";
    outer_ip = "10.211." + std::to_string(subnet) + ".2";
  }
  ~VethPair() {
    if (up_) TearDown();
  }
  VethPair(const VethPair&) = delete;
  VethPair& operator=(const VethPair&) = delete;

  static int Sh(const std::string& cmd) {
    return std::system((cmd + " >/dev/null 2>&1").c_str());
  }

  // Empty on success, else why the namespace cannot be made here.
  std::string SetUp() {
    if (geteuid() != 0) return "not root (network namespaces need CAP_SYS_ADMIN)";
    if (Sh("ip -V") != 0) return "iproute2 'ip' not found";
    TearDown();
    if (Sh("ip netns add " + ns) != 0) {
      return "'ip netns add' failed (no CAP_SYS_ADMIN or no netns support)";
    }
    up_ = true;
    const std::string in = In();
    const std::vector<std::string> cmds = {
        "ip link add " + outer + " type veth peer name " + inner,
        "ip link set " + inner + " netns " + ns,
        "ip addr add " + outer_ip + "/24 dev " + outer,
        "ip link set " + outer + " up",
        in + "ip addr add " + inner_ip + "/24 dev " + inner,
        in + "ip link set " + inner + " up",
        in + "ip link set lo up",
    };
    for (const auto& c : cmds) {
      if (Sh(c) != 0) {
        TearDown();
        return "network setup step failed: " + c;
      }
    }
    return "";
  }

  void TearDown() {
    Sh("ip link del " + outer);
    Sh("ip netns del " + ns);
    up_ = false;
  }

  // Limits both directions to `rate` (tc's syntax, e.g. "25gbit") with a token bucket; "" when
  // done, else why not (no `tc`, or the kernel lacks the tbf qdisc).
  std::string LimitRate(const std::string& rate) {
    if (Sh("tc -V") != 0) return "iproute2 'tc' not found";
    for (const std::string& dev_cmd : {"tc qdisc replace dev " + outer, In() + "tc qdisc replace dev " + inner}) {
      if (Sh(dev_cmd + " root tbf rate " + rate + " burst 4mb latency 100ms") != 0) {
        return "'" + dev_cmd + " root tbf rate " + rate + "' failed (no tbf qdisc in this kernel?)";
      }
    }
    return "";
  }

  // The prefix that runs a command inside the namespace, and the path of the namespace (for
  // setns: what `ip netns add` made).
  std::string In() const { return "ip netns exec " + ns + " "; }
  std::string Path() const { return "/run/netns/" + ns; }

  std::string ns, inner, outer, inner_ip, outer_ip;

 private:
  bool up_ = false;
};

}  // namespace kvstream::testing
