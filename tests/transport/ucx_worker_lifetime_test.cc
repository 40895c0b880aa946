// The UCX worker is destroyed wherever its last reference is dropped, its own threads included:
// a callback on the progress thread or a copy on the copier can hold the last one (a data
// message landing holds its region, which holds the worker) when the transport and the
// registration are gone. Before the fix the worker joined the thread it ran on there and the
// process aborted ("Resource deadlock avoided"; seen in ucx_admission_test under load).
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <thread>

#include "transport/ucx/ucx_worker.h"

namespace kvstream::transport::ucx {
namespace {

UcxOptions TcpOptions() {
  UcxOptions o;
  o.tls = "tcp";
  return o;
}

// Drops `worker` (the test's reference) while a task posted with `post` holds another, then lets
// the task finish: its reference is the last, dropped on the worker's own thread.
template <class PostFn>
void LastReferenceOnInternalThread(std::shared_ptr<UcxWorker> worker, PostFn post) {
  std::promise<void> go;
  std::shared_future<void> started = go.get_future().share();
  std::promise<void> done;
  std::future<void> finished = done.get_future();
  std::weak_ptr<UcxWorker> watch = worker;
  post(*worker, [keep = worker, started]() mutable {
    started.wait();
    keep.reset();  // the last reference, on this thread
  });
  worker.reset();
  ASSERT_FALSE(watch.expired());
  go.set_value();
  // The worker goes away (on another thread); the process keeps running.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!watch.expired() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(watch.expired());
}

TEST(UcxWorkerLifetime, LastReferenceDroppedOnTheProgressThread) {
  for (int i = 0; i < 3; ++i) {
    auto w = UcxWorker::Create(TcpOptions());
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    LastReferenceOnInternalThread(std::move(*w), [](UcxWorker& worker, std::function<void()> fn) {
      worker.Post(std::move(fn));
    });
  }
}

TEST(UcxWorkerLifetime, LastReferenceDroppedOnTheCopier) {
  auto w = UcxWorker::Create(TcpOptions());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  LastReferenceOnInternalThread(std::move(*w), [](UcxWorker& worker, std::function<void()> fn) {
    worker.copier().Post(std::move(fn));
  });
}

}  // namespace
}  // namespace kvstream::transport::ucx
