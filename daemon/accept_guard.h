// A bound on the connections a daemon accepts, below its descriptor limit.
//
// gRPC 1.51 (Debian 12) has no connection limit, and its listener stops accepting for good when
// accept4() fails with EMFILE. InstallAcceptGuard() raises the soft RLIMIT_NOFILE to the hard
// limit and, from then on, every accept4() of the process (gRPC's listeners call it; UCX's use
// accept()) passes through a guard:
//  - a connection whose descriptor number is >= the bound is closed at once (descriptors are
//    allocated lowest first, so that number means every lower one is in use: at least `bound`
//    descriptors are open); the guard goes on accepting until the backlog is empty and never
//    reports the refusal to gRPC;
//  - EMFILE/ENFILE (descriptors used elsewhere) is answered by accepting and closing one
//    connection with a spare descriptor kept for that, and reported to gRPC as EAGAIN.
// So the listener keeps serving through a flood of connections and takes new ones as soon as
// old ones close. Refusals are counted (AcceptGuardRefused) and logged now and then.
#pragma once

#include <cstdint>

namespace kvstream::daemon {

// `max_open_fds` 0: the (raised) limit less 256. Returns the bound in force.
int InstallAcceptGuard(int max_open_fds);
uint64_t AcceptGuardRefused();

}  // namespace kvstream::daemon
