// How a daemon stops: SIGTERM or SIGINT ends it in an orderly way; SIGPIPE never does.
//
// Guarantees:
//  - BlockTerminationSignals() blocks SIGTERM and SIGINT in the calling thread and in every
//    thread it creates afterwards, and ignores SIGPIPE (a peer closing a socket surfaces as an
//    error on the write). Call it first thing in main(), before any thread starts.
//  - WaitForTerminationSignal() blocks until SIGTERM or SIGINT arrives and returns its number.
//  - WaitForTerminationSignalFor(ms) likewise, but returns 0 once `ms` passed without one (a
//    draining daemon waits for its in-flight work this way and stops at once on a second signal).
#pragma once

#include <cstdint>

namespace kvstream::daemon {

void BlockTerminationSignals();
int WaitForTerminationSignal();
int WaitForTerminationSignalFor(int64_t timeout_ms);

}  // namespace kvstream::daemon
