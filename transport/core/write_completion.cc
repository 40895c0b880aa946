#include "transport/core/write_completion.h"

#include <string>

namespace kvstream::transport::internal {

void WriteCompletion::Complete(Status status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    done_ = true;
    status_ = std::move(status);
  }
  cv_.notify_all();
}

bool WriteCompletion::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

Status WriteCompletion::Wait(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_until(lock, deadline, [this] { return done_; })) {
    return Timeout("write of " + std::to_string(bytes_) +
                   " bytes not complete by the deadline (it may still be in flight)");
  }
  return status_;
}

}  // namespace kvstream::transport::internal
