// IoPool: a bounded pool of threads for the slow tiers' reads (disk files, the shared store), so
// a request thread waits for them with a deadline instead of doing the I/O itself.
//
// Guarantees: at most `threads` jobs run at once; Submit refuses (false) rather than queue more
// than `max_queued` jobs, and after Stop; Stop (and the destructor) drops the queued jobs (never
// run) and joins the running ones. Thread-safe.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvstream::kvcache {

class IoPool {
 public:
  IoPool(int threads, size_t max_queued);
  ~IoPool();
  IoPool(const IoPool&) = delete;
  IoPool& operator=(const IoPool&) = delete;

  bool Submit(std::function<void()> job);
  void Stop();

 private:
  void Loop();
  const size_t max_queued_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::once_flag joined_;
  std::vector<std::thread> threads_;
};

}  // namespace kvstream::kvcache
