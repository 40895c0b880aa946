// The one mapping between kvstream::Status and grpc::Status, used by every daemon and client.
//
// Guarantees:
//  - ToGrpc(FromGrpc(s)) keeps the code for every code kvstream emits; messages pass unchanged.
//  - kTimeout <-> DEADLINE_EXCEEDED, kCanceled <-> CANCELLED, kRemoteDisconnect -> UNAVAILABLE
//    with the message prefixed "remote disconnect: " (so it maps back to kRemoteDisconnect).
//  - Deadlines: ToGrpcDeadline / FromGrpcDeadline convert between common/time.h's steady-clock
//    Deadline and the wall-clock deadline gRPC carries, so a server can propagate the remaining
//    budget of an incoming call onto the calls it makes.
#pragma once

#include <chrono>

#include <grpcpp/grpcpp.h>

#include "common/status.h"
#include "common/time.h"

namespace kvstream::connector {

grpc::Status ToGrpc(const Status& status);
Status FromGrpc(const grpc::Status& status);
grpc::StatusCode ToGrpcCode(StatusCode code);
StatusCode FromGrpcCode(grpc::StatusCode code);

std::chrono::system_clock::time_point ToGrpcDeadline(Deadline deadline);
Deadline FromGrpcDeadline(std::chrono::system_clock::time_point deadline);
// The incoming call's deadline, capped at `cap` (an infinite client deadline becomes `cap`).
Deadline ServerDeadline(const grpc::ServerContext& context, Deadline cap);

// The IP address (without port or brackets) of a gRPC peer string ("ipv4:1.2.3.4:5",
// "ipv6:[::1]:5"); empty for any other ("unix:...").
std::string HostOfGrpcPeer(const std::string& peer);

}  // namespace kvstream::connector
