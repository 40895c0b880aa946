// A fixed set of worker threads for data-parallel loops. ParallelFor splits [0, n) into
// contiguous chunks, one per worker (the caller runs one), and returns when all are done.
// Concurrent ParallelFor calls from different threads are serialized. fn must not call
// ParallelFor on the same pool.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvstream::model {

class ThreadPool {
 public:
  // num_threads <= 0: hardware concurrency.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  int size() const { return size_; }
  void ParallelFor(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn);

 private:
  void Worker(int index);
  int size_;
  std::vector<std::thread> threads_;
  std::mutex call_mu_;  // one ParallelFor at a time
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int chunks_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace kvstream::model
