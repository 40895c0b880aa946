// decode/admission.h: first come first served, the queue bound, the deadline, Close().
#include "decode/admission.h"

#include <gtest/gtest.h>

#include <future>
#include <thread>

namespace kvstream::decode {
namespace {

TEST(Admission, TakesFreeBlocksAtOnce) {
  model::BlockAllocator alloc(8);
  Admission a(&alloc, 4);
  auto ids = a.Acquire(5, DeadlineAfterMs(0), nullptr);
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  EXPECT_EQ(ids->size(), 5u);
  EXPECT_EQ(alloc.free_count(), 3);
}

TEST(Admission, FirstInLineGetsBlocksBeforeSmallerLaterOnes) {
  model::BlockAllocator alloc(8);
  Admission a(&alloc, 4);
  auto h1 = a.Acquire(3, DeadlineAfterMs(0), nullptr);
  auto h2 = a.Acquire(3, DeadlineAfterMs(0), nullptr);  // 2 left
  ASSERT_TRUE(h1.ok() && h2.ok());
  auto large = std::async(std::launch::async, [&] { return a.Acquire(5, DeadlineAfterMs(5000), nullptr); });
  while (a.waiting() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // Would fit in the 2 free blocks at once; it came second, so it waits.
  auto small = std::async(std::launch::async, [&] { return a.Acquire(1, DeadlineAfterMs(5000), nullptr); });
  while (a.waiting() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(small.wait_for(std::chrono::milliseconds(30)), std::future_status::timeout);
  EXPECT_EQ(alloc.free_count(), 2);
  // 5 free: exactly the large one's; the small one still waits.
  ASSERT_TRUE(alloc.Release(*h1).ok());
  auto l = large.get();
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(small.wait_for(std::chrono::milliseconds(30)), std::future_status::timeout);
  ASSERT_TRUE(alloc.Release(*h2).ok());
  auto s = small.get();
  EXPECT_TRUE(s.ok()) << s.status().ToString();
}

TEST(Admission, FullQueueDeadlineCancelAndClose) {
  model::BlockAllocator alloc(4);
  Admission a(&alloc, 1);
  auto held = a.Acquire(4, DeadlineAfterMs(0), nullptr);
  ASSERT_TRUE(held.ok());
  // Deadline: RESOURCE_EXHAUSTED naming the pool.
  auto late = a.Acquire(1, DeadlineAfterMs(20), nullptr);
  EXPECT_EQ(late.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(late.status().message().find("KV pool full"), std::string::npos);
  // One waits; the next finds the queue full at once.
  auto waiter = std::async(std::launch::async, [&] { return a.Acquire(1, DeadlineAfterMs(5000), nullptr); });
  while (a.waiting() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto full = a.Acquire(1, DeadlineAfterMs(5000), nullptr);
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(full.status().message().find("admission queue full"), std::string::npos);
  // Close: the waiter and every later call get UNAVAILABLE.
  a.Close("draining");
  EXPECT_EQ(waiter.get().status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(a.Acquire(1, DeadlineAfterMs(0), nullptr).status().code(), StatusCode::kUnavailable);
  // Cancelled while waiting.
  Admission b(&alloc, 2);
  auto cancelled = b.Acquire(1, DeadlineAfterMs(5000), [] { return true; });
  EXPECT_EQ(cancelled.status().code(), StatusCode::kCanceled);
  EXPECT_EQ(b.waiting(), 0);
}

}  // namespace
}  // namespace kvstream::decode
