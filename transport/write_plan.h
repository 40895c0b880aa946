// Backend-side helpers shared by every transport backend (not part of the public API):
// validation of a WriteRequest against the local and remote regions, and coalescing of
// adjacent CopyOps into contiguous runs.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "transport/transport.h"

namespace kvstream::transport::internal {

struct Run {
  uint64_t local_offset = 0;
  uint64_t remote_offset = 0;
  uint64_t length = 0;
};

struct WritePlan {
  std::vector<Run> runs;  // in request order; zero-length ops dropped
  uint64_t bytes = 0;
};

// Checks every op against [0, local_length) and [0, remote_length) (overflow-safe) and merges
// an op into the previous run when it continues it on both sides. Ops are not reordered:
// overlapping destinations keep the caller's order.
Result<WritePlan> PlanWrite(const std::vector<CopyOp>& ops, uint64_t local_length,
                            uint64_t remote_length);

// Checks the parts of a request every backend checks the same way: a local registration is
// given and remote_region indexes `num_remote_regions`.
Status CheckRequestShape(const WriteRequest& request, size_t num_remote_regions);

}  // namespace kvstream::transport::internal

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>

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

class CompletionHandle final : public WriteHandle {
 public:
  explicit CompletionHandle(std::shared_ptr<WriteCompletion> c) : c_(std::move(c)) {}
  bool Done() const override { return c_->done(); }
  Status Wait(Deadline deadline) override { return c_->Wait(deadline); }
  uint64_t bytes() const override { return c_->bytes(); }
  uint64_t transfers() const override { return c_->transfers(); }
  bool Cancel() override {
    c_->RequestCancel();
    return true;
  }

 private:
  std::shared_ptr<WriteCompletion> c_;
};

}  // namespace kvstream::transport::internal
