#include "connector/grpc_status.h"

#include <string_view>

namespace kvstream::connector {
namespace {
constexpr std::string_view kDisconnectPrefix = "remote disconnect: ";
}

grpc::StatusCode ToGrpcCode(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return grpc::StatusCode::OK;
    case StatusCode::kInvalidArgument: return grpc::StatusCode::INVALID_ARGUMENT;
    case StatusCode::kNotFound: return grpc::StatusCode::NOT_FOUND;
    case StatusCode::kAlreadyExists: return grpc::StatusCode::ALREADY_EXISTS;
    case StatusCode::kResourceExhausted: return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case StatusCode::kTimeout: return grpc::StatusCode::DEADLINE_EXCEEDED;
    case StatusCode::kCanceled: return grpc::StatusCode::CANCELLED;
    case StatusCode::kRemoteDisconnect: return grpc::StatusCode::UNAVAILABLE;
    case StatusCode::kUnavailable: return grpc::StatusCode::UNAVAILABLE;
    case StatusCode::kNotSupported: return grpc::StatusCode::UNIMPLEMENTED;
    case StatusCode::kFailedPrecondition: return grpc::StatusCode::FAILED_PRECONDITION;
    case StatusCode::kDataLoss: return grpc::StatusCode::DATA_LOSS;
    case StatusCode::kInternal: return grpc::StatusCode::INTERNAL;
  }
  return grpc::StatusCode::UNKNOWN;
}

StatusCode FromGrpcCode(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return StatusCode::kOk;
    case grpc::StatusCode::INVALID_ARGUMENT: return StatusCode::kInvalidArgument;
    case grpc::StatusCode::OUT_OF_RANGE: return StatusCode::kInvalidArgument;
    case grpc::StatusCode::NOT_FOUND: return StatusCode::kNotFound;
    case grpc::StatusCode::ALREADY_EXISTS: return StatusCode::kAlreadyExists;
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return StatusCode::kResourceExhausted;
    case grpc::StatusCode::DEADLINE_EXCEEDED: return StatusCode::kTimeout;
    case grpc::StatusCode::CANCELLED: return StatusCode::kCanceled;
    case grpc::StatusCode::ABORTED: return StatusCode::kCanceled;
    case grpc::StatusCode::UNAVAILABLE: return StatusCode::kUnavailable;
    case grpc::StatusCode::UNIMPLEMENTED: return StatusCode::kNotSupported;
    case grpc::StatusCode::FAILED_PRECONDITION: return StatusCode::kFailedPrecondition;
    case grpc::StatusCode::DATA_LOSS: return StatusCode::kDataLoss;
    case grpc::StatusCode::PERMISSION_DENIED: return StatusCode::kFailedPrecondition;
    case grpc::StatusCode::UNAUTHENTICATED: return StatusCode::kFailedPrecondition;
    default: return StatusCode::kInternal;
  }
}

grpc::Status ToGrpc(const Status& status) {
  if (status.ok()) return grpc::Status::OK;
  std::string message = status.message();
  if (status.code() == StatusCode::kRemoteDisconnect) message.insert(0, kDisconnectPrefix);
  return grpc::Status(ToGrpcCode(status.code()), message);
}

Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return OkStatus();
  std::string message = status.error_message();
  StatusCode code = FromGrpcCode(status.error_code());
  if (code == StatusCode::kUnavailable && message.rfind(kDisconnectPrefix, 0) == 0) {
    code = StatusCode::kRemoteDisconnect;
    message.erase(0, kDisconnectPrefix.size());
  }
  if (message.empty()) message = "gRPC status " + std::to_string(int(status.error_code()));
  return Status(code, message);
}

std::chrono::system_clock::time_point ToGrpcDeadline(Deadline deadline) {
  auto remaining = deadline - Clock::now();
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(remaining);
}

Deadline FromGrpcDeadline(std::chrono::system_clock::time_point deadline) {
  auto remaining = deadline - std::chrono::system_clock::now();
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(remaining);
}

Deadline ServerDeadline(const grpc::ServerContext& context, Deadline cap) {
  auto d = context.deadline();
  // gRPC reports "no deadline" as a time point far in the future.
  if (d >= std::chrono::system_clock::now() + std::chrono::hours(24 * 365)) return cap;
  Deadline converted = FromGrpcDeadline(d);
  return converted < cap ? converted : cap;
}

std::string HostOfGrpcPeer(const std::string& peer) {
  if (peer.rfind("ipv4:", 0) == 0) {
    const std::string rest = peer.substr(5);
    return rest.substr(0, rest.rfind(':'));
  }
  if (peer.rfind("ipv6:[", 0) == 0) {
    const size_t close = peer.find(']');
    return close == std::string::npos ? "" : peer.substr(6, close - 6);
  }
  return "";
}

}  // namespace kvstream::connector
