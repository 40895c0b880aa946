// How a daemon stops: SIGTERM or SIGINT ends it in an orderly way; SIGPIPE never does.
//
// Guarantees:
//  - BlockTerminationSignals() blocks SIGTERM and SIGINT in the calling thread and in every
//    thread it creates afterwards, and ignores SIGPIPE (a peer closing a socket surfaces as an
//    error on the write). Call it first thing in main(), before any thread starts.
//  - WaitForTerminationSignal() blocks until SIGTERM or SIGINT arrives and returns its number.
#pragma once

namespace kvstream::daemon {

void BlockTerminationSignals();
int WaitForTerminationSignal();

}  // namespace kvstream::daemon
