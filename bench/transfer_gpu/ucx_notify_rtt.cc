// ucx_notify_rtt: round trip of one UCX notification (a data-less Write with notify) between two
// UCX transports of this process, each with its own worker and progress thread: A notifies B,
// B's sink notifies A back. The host-staged GPU path's per-chunk control messages (the chunk's
// announcement, the slot's credit) each take one such one-way trip, so this bounds how deep its
// pipeline must be. No GPU needed.
//
//   ucx_notify_rtt [--iters=2000] [--tls=...]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "common/time.h"
#include "transport/ucx/ucx_transport.h"

using namespace kvstream;
using namespace kvstream::transport;

int main(int argc, char** argv) {
  int iters = 2000;
  std::string tls;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--iters=", 0) == 0) iters = std::max(10, std::atoi(a.c_str() + 8));
    if (a.rfind("--tls=", 0) == 0) tls = a.substr(6);
  }
  TransportOptions o;
  o.backend = "ucx";
  o.ucx.tls = tls;
  o.ucx.admit_any = true;  // both ends connect to each other; a benchmark admits all
  auto a = ucx::CreateUcxTransport(o);
  auto b = ucx::CreateUcxTransport(o);
  if (!a.ok() || !b.ok()) {
    std::fprintf(stderr, "ucx_notify_rtt: %s\n", (a.ok() ? b.status() : a.status()).ToString().c_str());
    return 1;
  }
  std::vector<char> ma(4096), mb(4096);
  auto ra = (*a)->Register({ma.data(), ma.size()});
  auto rb = (*b)->Register({mb.data(), mb.size()});
  if (!ra.ok() || !rb.ok()) return 1;
  PeerDescriptor da{(*a)->LocalAddress(), {{uint64_t(uintptr_t(ma.data())), ma.size(), (*ra)->RemoteKey()}}, ""};
  PeerDescriptor db{(*b)->LocalAddress(), {{uint64_t(uintptr_t(mb.data())), mb.size(), (*rb)->RemoteKey()}}, ""};
  auto ab = (*a)->Connect(db);
  auto ba = (*b)->Connect(da);
  if (!ab.ok() || !ba.ok()) {
    std::fprintf(stderr, "ucx_notify_rtt: connect: %s\n", (ab.ok() ? ba.status() : ab.status()).ToString().c_str());
    return 1;
  }
  std::atomic<int> got{0};
  (*b)->SetNotificationSink([&](const Notification& n) {
    WriteRequest w;
    w.local = rb->get();
    w.notify = true;
    w.notification = n;
    (void)(*ba)->Write(w);  // the handle may go: the write still completes
  });
  (*a)->SetNotificationSink([&](const Notification&) { got++; });
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    const int before = got.load();
    const auto s = Clock::now();
    WriteRequest w;
    w.local = ra->get();
    w.notify = true;
    w.notification = {1, 1, 0};
    auto h = (*ab)->Write(w);
    if (!h.ok()) return 1;
    const auto deadline = DeadlineAfterMs(2000);
    while (got.load() == before && !Expired(deadline)) std::this_thread::yield();
    if (got.load() == before) {
      std::fprintf(stderr, "ucx_notify_rtt: no answer within 2 s\n");
      return 1;
    }
    t.push_back(SecondsSince(s) * 1e6);
  }
  std::sort(t.begin(), t.end());
  std::printf("{\"bench\":\"ucx_notify_rtt\",\"iters\":%d,\"rtt_us_p50\":%.1f,\"rtt_us_p90\":%.1f,\"rtt_us_p99\":%.1f}\n",
              iters, t[t.size() / 2], t[t.size() * 9 / 10], t[t.size() * 99 / 100]);
  std::fflush(stdout);
  (*a)->SetNotificationSink(nullptr);
  (*b)->SetNotificationSink(nullptr);
  return 0;
}
