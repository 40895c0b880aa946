#include "daemon/signals.h"

#include <pthread.h>

#include <cerrno>
#include <csignal>
#include <ctime>

#include "common/time.h"

namespace kvstream::daemon {
namespace {

sigset_t TerminationSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}
}  // namespace

void BlockTerminationSignals() {
  sigset_t set = TerminationSet();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  // A peer closing a socket must surface as an error on the write, not kill the daemon.
  std::signal(SIGPIPE, SIG_IGN);
}

int WaitForTerminationSignal() {
  sigset_t set = TerminationSet();
  int sig = 0;
  while (sigwait(&set, &sig) != 0) {
  }
  return sig;
}

int WaitForTerminationSignalFor(int64_t timeout_ms) {
  sigset_t set = TerminationSet();
  const Deadline deadline = DeadlineAfterMs(timeout_ms < 0 ? 0 : timeout_ms);
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - Clock::now());
    if (left.count() <= 0) return 0;
    timespec ts{static_cast<time_t>(left.count() / 1000000000),
                static_cast<long>(left.count() % 1000000000)};
    const int sig = sigtimedwait(&set, nullptr, &ts);
    if (sig > 0) return sig;
    if (errno == EAGAIN) return 0;  // EINTR: wait for the rest
  }
}

}  // namespace kvstream::daemon
