// LayerTracker: the decode side's view of which layers of which request have landed.
//
// Signals arrive from the transport's notification thread (and from prefill's progress stream);
// the decode forward waits on them per layer (wait_for_layer).
//
// Guarantees:
//  - A signal (request, layer) counts only for a request between Begin() and Finish(), and only
//    if the layer is in range. Anything else (unknown, finished or failed request, bad layer) is
//    ignored and counted in ignored_signals(): it can never mark a recycled block as landed,
//    because request ids are never reused by the decode instance that chose them.
//  - Fail(request, status) makes every current and later WaitForLayer of that request return
//    `status`; later signals for it are ignored.
//  - WaitForLayer never blocks past its deadline (kTimeout naming the request and layer).
//  - Thread-safe; OnLanded never blocks on a waiter (it may be called from a transport thread).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "common/time.h"

namespace kvstream::connector {

class LayerTracker {
 public:
  // kAlreadyExists if the request is tracked; kInvalidArgument if num_layers <= 0.
  Status Begin(uint64_t request_id, int num_layers);
  void OnLanded(uint64_t request_id, int layer);
  // Marks every layer landed (e.g. the load's final confirmation).
  void OnAllLanded(uint64_t request_id);
  void Fail(uint64_t request_id, const Status& status);
  // OK once the layer landed; the failure status; kTimeout at the deadline; kNotFound if the
  // request is not tracked.
  Status WaitForLayer(uint64_t request_id, int layer, Deadline deadline);
  // Stops tracking; later signals are ignored.
  void Finish(uint64_t request_id);

  bool IsLanded(uint64_t request_id, int layer) const;
  // Every layer of a tracked, not failed request has landed.
  bool AllLanded(uint64_t request_id) const;
  // No WaitForLayer of this request would block: every layer landed, or it failed, or it is
  // not tracked.
  bool Settled(uint64_t request_id) const;
  size_t active() const;
  uint64_t ignored_signals() const;

 private:
  struct Entry {
    std::vector<bool> landed;
    Status failure;
  };
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<uint64_t, Entry> entries_;
  uint64_t ignored_ = 0;
};

}  // namespace kvstream::connector
