// kvstream::Status and Result<T>: the one error type that crosses module boundaries.
//
// Guarantees:
//  - A Status is either OK or carries a code and a human-readable message naming what failed.
//  - Result<T> holds a value exactly when its status is OK; value() on an error aborts (a bug).
//  - Codes map 1:1 onto gRPC status codes in one place (connector/grpc_status.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace kvstream {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,    // the caller's input is malformed or out of range
  kNotFound,           // a named thing (tensor, request, file) does not exist
  kAlreadyExists,      // e.g. a request id that is already in flight
  kResourceExhausted,  // pool, memory or queue full
  kTimeout,            // a deadline passed
  kCanceled,           // the caller or a shutdown cancelled the operation
  kRemoteDisconnect,   // the peer went away (process died, link cut)
  kUnavailable,        // a service is not reachable or not ready yet; retrying may help
  kNotSupported,       // a backend lacks the operation; never faked
  kFailedPrecondition, // state does not allow the call (e.g. not connected, handshake mismatch)
  kDataLoss,           // truncated or corrupt data (files, transfers)
  kInternal,           // a bug or an unexpected error from a library
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "TIMEOUT: waiting for layer 3 of request 17"
  std::string ToString() const;
  // Prefixes context to the message, keeping the code: "loading model: <message>".
  Status WithContext(std::string_view context) const;
  void IgnoreError() const {}

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() { return Status(); }
inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
inline Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status Timeout(std::string m) { return {StatusCode::kTimeout, std::move(m)}; }
inline Status Canceled(std::string m) { return {StatusCode::kCanceled, std::move(m)}; }
inline Status RemoteDisconnect(std::string m) { return {StatusCode::kRemoteDisconnect, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status NotSupported(std::string m) { return {StatusCode::kNotSupported, std::move(m)}; }
inline Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  // (Initialised, not assigned: nvcc warns that an assignment's Status& result is discarded.)
  Result(Status status)  // NOLINT
      : status_(status.ok() ? Internal("Result constructed from an OK status without a value")
                            : std::move(status)) {}
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { CheckOk(); return *value_; }
  const T& value() const& { CheckOk(); return *value_; }
  T&& value() && { CheckOk(); return std::move(*value_); }
  T* operator->() { CheckOk(); return &*value_; }
  const T* operator->() const { CheckOk(); return &*value_; }
  T& operator*() & { CheckOk(); return *value_; }

 private:
  void CheckOk() const;
  Status status_;
  std::optional<T> value_;
};

[[noreturn]] void DieOnBadResultAccess(const Status& status);

template <typename T>
void Result<T>::CheckOk() const {
  if (!status_.ok()) DieOnBadResultAccess(status_);
}

}  // namespace kvstream

#define KV_CONCAT_INNER_(a, b) a##b
#define KV_CONCAT_(a, b) KV_CONCAT_INNER_(a, b)

#define KV_RETURN_IF_ERROR(expr)                     \
  do {                                               \
    ::kvstream::Status kv_status_ = (expr);          \
    if (!kv_status_.ok()) return kv_status_;         \
  } while (0)

#define KV_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr)    \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

#define KV_ASSIGN_OR_RETURN(lhs, expr) \
  KV_ASSIGN_OR_RETURN_IMPL_(KV_CONCAT_(kv_result_, __LINE__), lhs, expr)
