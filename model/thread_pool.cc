#include "model/thread_pool.h"

#include <algorithm>

namespace kvstream::model {

ThreadPool::ThreadPool(int num_threads) {
  size_ = num_threads > 0 ? num_threads : std::max(1u, std::thread::hardware_concurrency());
  for (int i = 1; i < size_; ++i) threads_.emplace_back([this, i] { Worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

namespace {
void RunChunk(const std::function<void(int64_t, int64_t)>& fn, int64_t n, int chunks, int i) {
  int64_t per = (n + chunks - 1) / chunks;
  int64_t b = per * i, e = std::min(n, b + per);
  if (b < e) fn(b, e);
}
}  // namespace

void ThreadPool::Worker(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t)>* fn;
    int64_t n;
    int chunks;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      fn = fn_;
      n = n_;
      chunks = chunks_;
    }
    if (index < chunks) RunChunk(*fn, n, chunks, index);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int chunks = static_cast<int>(std::min<int64_t>(n, size_));
  if (chunks == 1) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call(call_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    chunks_ = chunks;
    pending_ = size_ - 1;
    ++generation_;
  }
  start_cv_.notify_all();
  RunChunk(fn, n, chunks, 0);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
}

}  // namespace kvstream::model
