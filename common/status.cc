#include "common/status.h"

#include <cstdio>
#include <cstdlib>

namespace kvstream {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kAlreadyExists: return "ALREADY_EXISTS";
    case StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case StatusCode::kTimeout: return "TIMEOUT";
    case StatusCode::kCanceled: return "CANCELED";
    case StatusCode::kRemoteDisconnect: return "REMOTE_DISCONNECT";
    case StatusCode::kUnavailable: return "UNAVAILABLE";
    case StatusCode::kNotSupported: return "NOT_SUPPORTED";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kDataLoss: return "DATA_LOSS";
    case StatusCode::kInternal: return "INTERNAL";
  }
  return "UNKNOWN";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(StatusCodeName(code_));
  s += ": ";
  s += message_;
  return s;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  return Status(code_, std::string(context) + ": " + message_);
}

void DieOnBadResultAccess(const Status& status) {
  std::fprintf(stderr, "kvstream: value() of an error Result: %s\n", status.ToString().c_str());
  std::abort();
}

}  // namespace kvstream
