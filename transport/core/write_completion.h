// Completion of one write, shared by every backend: the backend completes a WriteCompletion
// once; CompletionHandle is the WriteHandle the caller gets (not part of the public API).
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>

#include "common/status.h"
#include "common/time.h"
#include "transport/transport.h"

namespace kvstream::transport::internal {

// Completion state of one write, shared by the backend (which completes it once) and the
// WriteHandle (which waits on it).
class WriteCompletion {
 public:
  WriteCompletion(uint64_t bytes, uint64_t transfers) : bytes_(bytes), transfers_(transfers) {}
  // The first call decides the outcome; later calls are ignored.
  void Complete(Status status);
  bool done() const;
  Status Wait(Deadline deadline);
  uint64_t bytes() const { return bytes_; }
  uint64_t transfers() const { return transfers_; }
  void RequestCancel() { cancel_.store(true); }
  bool cancel_requested() const { return cancel_.load(); }

 private:
  std::atomic<bool> cancel_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status status_;
  const uint64_t bytes_;
  const uint64_t transfers_;
};

// Cancel() marks the completion (the backend looks at cancel_requested()) and then calls
// `on_cancel`, if given, so that a backend thread asleep until its next event wakes up to see it.
class CompletionHandle final : public WriteHandle {
 public:
  explicit CompletionHandle(std::shared_ptr<WriteCompletion> c,
                            std::function<void()> on_cancel = nullptr)
      : c_(std::move(c)), on_cancel_(std::move(on_cancel)) {}
  bool Done() const override { return c_->done(); }
  Status Wait(Deadline deadline) override { return c_->Wait(deadline); }
  uint64_t bytes() const override { return c_->bytes(); }
  uint64_t transfers() const override { return c_->transfers(); }
  bool Cancel() override {
    c_->RequestCancel();
    if (on_cancel_) on_cancel_();
    return true;
  }

 private:
  std::shared_ptr<WriteCompletion> c_;
  std::function<void()> on_cancel_;
};

}  // namespace kvstream::transport::internal
