// The receiving side of the two-process transport tests: registers a region, prints how to
// reach it, then checks each notified layer's bytes and reports them, until stdin closes.
// stdin: "ADMIT <hex ticket>" admits a writer's connection (Transport::Admit), answered
// "ADMITTED OK" (or the error).
//
//   transport_peer <backend> <ucx_tls or -> <region bytes> <chunk bytes> [alloc]
//   (alloc: the region comes from Transport::Allocate() instead of Register())
//   stdout: "READY <hex address> <region addr> <region length> <hex key>"
//           "NOTE <request_id> <layer> OK|BAD" per notification: layer l covers
//           [l*chunk, (l+1)*chunk) and holds pattern seed request_id + l.
#include <poll.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/transport/test_util.h"
#include "transport/transport.h"

using namespace kvstream;
using namespace kvstream::transport;

int main(int argc, char** argv) {
  if (argc != 5 && argc != 6) {
    std::fprintf(stderr, "usage: %s backend tls|- region_bytes chunk_bytes [alloc]\n", argv[0]);
    return 2;
  }
  std::string tls = argv[2];
  auto t = CreateTransport(test::Options(argv[1], tls == "-" ? "" : tls));
  if (!t.ok()) {
    std::fprintf(stderr, "peer: %s\n", t.status().ToString().c_str());
    return 1;
  }
  size_t size = std::strtoull(argv[3], nullptr, 10), chunk = std::strtoull(argv[4], nullptr, 10);
  bool alloc = argc == 6 && std::string(argv[5]) == "alloc";
  std::vector<uint8_t> backing(alloc ? 0 : size, 0);
  auto reg = alloc ? (*t)->Allocate(size) : (*t)->Register(MemoryRegion{backing.data(), size});
  if (!reg.ok()) {
    std::fprintf(stderr, "peer: %s\n", reg.status().ToString().c_str());
    return 1;
  }
  auto* mem = static_cast<uint8_t*>((*reg)->region().addr);
  std::memset(mem, 0, size);
  test::NotificationQueue notes;
  (*t)->SetNotificationSink([&](const Notification& n) { notes.Push(n); });
  std::printf("READY %s %llu %zu %s\n", test::ToHex((*t)->LocalAddress()).c_str(),
              static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(mem)), size,
              test::ToHex((*reg)->RemoteKey()).c_str());
  std::fflush(stdout);
  std::string input;
  for (;;) {
    Notification n;
    while (notes.Pop(&n, Clock::now())) {
      bool ok = n.layer >= 0 && (static_cast<size_t>(n.layer) + 1) * chunk <= size &&
                test::CheckPattern(mem + n.layer * chunk, chunk, n.request_id + n.layer);
      std::printf("NOTE %llu %d %s\n", static_cast<unsigned long long>(n.request_id), n.layer,
                  ok ? "OK" : "BAD");
      std::fflush(stdout);
    }
    pollfd p{0, POLLIN, 0};
    if (poll(&p, 1, 5) > 0) {
      char buf[256];
      const ssize_t got = read(0, buf, sizeof(buf));
      if (got <= 0) break;  // stdin closed: done
      input.append(buf, static_cast<size_t>(got));
      for (size_t nl; (nl = input.find('\n')) != std::string::npos; input.erase(0, nl + 1)) {
        const std::string line = input.substr(0, nl);
        if (line.rfind("ADMIT ", 0) != 0) continue;
        Status s = (*t)->Admit(test::FromHex(line.substr(6)));
        std::printf("ADMITTED %s\n", s.ok() ? "OK" : s.ToString().c_str());
        std::fflush(stdout);
      }
    }
  }
  (*t)->SetNotificationSink(nullptr);
  return 0;
}
