// Helpers shared by the transport tests: backend configurations, patterns, a notification
// collector, hex for passing blobs between processes.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include "common/time.h"
#include "transport/transport.h"

namespace kvstream::transport::test {

struct BackendConfig {
  std::string label;  // test name suffix
  TransportOptions options;
};
inline void PrintTo(const BackendConfig& c, std::ostream* os) { *os << c.label; }

// UCX tests run on loopback only: the sandboxes this runs in (gVisor) advertise network
// addresses that are not always reachable.
inline TransportOptions Options(std::string backend, std::string tls = "") {
  TransportOptions o;
  o.backend = std::move(backend);
  o.ucx.tls = std::move(tls);
  if (o.backend == "ucx") o.ucx.net_devices = "lo";
  return o;
}

// Every configuration this build can run: fake always; ucx over TCP, with shared memory
// (same-host copies) and with UCX's own pick.
inline std::vector<BackendConfig> AllConfigs() {
  std::vector<BackendConfig> out;
  auto built = AvailableBackends();
  auto has = [&](const std::string& b) { return std::find(built.begin(), built.end(), b) != built.end(); };
  if (has("fake")) out.push_back({"fake", Options("fake")});
  if (has("ucx")) {
    out.push_back({"ucx_tcp", Options("ucx", "tcp")});
    // Same-host copies with process_vm_writev, notifications over TCP.
    out.push_back({"ucx_sm", Options("ucx", "sm,tcp")});
    out.push_back({"ucx_default", Options("ucx")});
  }
  return out;
}

// Connects `writer` to `peer` and has the receiver admit the connection (what a daemon's
// handshake does: Endpoint::AdmissionTicket() back to Transport::Admit()).
inline Result<std::unique_ptr<Endpoint>> ConnectAdmitted(Transport& writer, Transport& receiver,
                                                        const PeerDescriptor& peer) {
  auto ep = writer.Connect(peer);
  if (!ep.ok()) return ep;
  if (std::string t = (*ep)->AdmissionTicket(); !t.empty()) {
    Status s = receiver.Admit(t);
    if (!s.ok()) return s;
  }
  return ep;
}

inline uint8_t PatternByte(uint64_t seed, uint64_t i) {
  uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<uint8_t>(x ^ (x >> 17));
}
inline void FillPattern(uint8_t* p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; ++i) p[i] = PatternByte(seed, i);
}
inline bool CheckPattern(const uint8_t* p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != PatternByte(seed, i)) return false;
  }
  return true;
}

class NotificationQueue {
 public:
  void Push(const Notification& n) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      q_.push_back(n);
    }
    cv_.notify_all();
  }
  // False when none arrived by the deadline.
  bool Pop(Notification* out, Deadline deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_until(lock, deadline, [&] { return !q_.empty(); })) return false;
    *out = q_.front();
    q_.pop_front();
    return true;
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return q_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Notification> q_;
};

inline std::string ToHex(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string out;
  out.reserve(s.size() * 2);
  for (unsigned char c : s) {
    out.push_back(d[c >> 4]);
    out.push_back(d[c & 15]);
  }
  return out;
}
inline std::string FromHex(const std::string& h) {
  auto v = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<char>(v(h[i]) * 16 + v(h[i + 1])));
  return out;
}

}  // namespace kvstream::transport::test
