#include "connector/layer_tracker.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace kvstream::connector {
namespace {

TEST(LayerTracker, LandedLayerWakesWaiter) {
  LayerTracker t;
  ASSERT_TRUE(t.Begin(7, 4).ok());
  std::thread signaller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    t.OnLanded(7, 2);
  });
  EXPECT_TRUE(t.WaitForLayer(7, 2, DeadlineAfterMs(5000)).ok());
  signaller.join();
  EXPECT_TRUE(t.IsLanded(7, 2));
  EXPECT_FALSE(t.IsLanded(7, 1));
}

TEST(LayerTracker, WaitTimesOutAtDeadline) {
  LayerTracker t;
  ASSERT_TRUE(t.Begin(1, 2).ok());
  auto start = Clock::now();
  Status s = t.WaitForLayer(1, 0, DeadlineAfterMs(50));
  EXPECT_EQ(s.code(), StatusCode::kTimeout);
  EXPECT_NE(s.message().find("layer 0"), std::string::npos);
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(45));
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(2000));
}

TEST(LayerTracker, FailWakesWaitersWithTheStatus) {
  LayerTracker t;
  ASSERT_TRUE(t.Begin(3, 2).ok());
  std::thread failer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    t.Fail(3, RemoteDisconnect("prefill died"));
  });
  Status s = t.WaitForLayer(3, 1, DeadlineAfterMs(5000));
  failer.join();
  EXPECT_EQ(s.code(), StatusCode::kRemoteDisconnect);
  EXPECT_EQ(s.message(), "prefill died");
  // A signal after the failure is ignored.
  t.OnLanded(3, 1);
  EXPECT_FALSE(t.IsLanded(3, 1));
  EXPECT_EQ(t.ignored_signals(), 1u);
}

TEST(LayerTracker, StaleAndUnknownSignalsAreIgnored) {
  LayerTracker t;
  t.OnLanded(99, 0);  // never begun
  ASSERT_TRUE(t.Begin(5, 2).ok());
  t.OnLanded(5, 2);   // out of range
  t.OnLanded(5, -1);
  t.Finish(5);
  t.OnLanded(5, 0);   // finished
  EXPECT_EQ(t.ignored_signals(), 4u);
  EXPECT_EQ(t.active(), 0u);
  // A new request never sees an old one's signals.
  ASSERT_TRUE(t.Begin(6, 2).ok());
  EXPECT_FALSE(t.IsLanded(6, 0));
  EXPECT_EQ(t.WaitForLayer(6, 0, DeadlineAfterMs(10)).code(), StatusCode::kTimeout);
}

TEST(LayerTracker, FinishWakesWaiterWithNotFound) {
  LayerTracker t;
  ASSERT_TRUE(t.Begin(8, 1).ok());
  std::thread finisher([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    t.Finish(8);
  });
  EXPECT_EQ(t.WaitForLayer(8, 0, DeadlineAfterMs(5000)).code(), StatusCode::kNotFound);
  finisher.join();
}

TEST(LayerTracker, BeginTwiceAndAllLanded) {
  LayerTracker t;
  ASSERT_TRUE(t.Begin(9, 3).ok());
  EXPECT_EQ(t.Begin(9, 3).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(t.Begin(10, 0).code(), StatusCode::kInvalidArgument);
  t.OnAllLanded(9);
  for (int l = 0; l < 3; ++l) EXPECT_TRUE(t.WaitForLayer(9, l, Clock::now()).ok());
  EXPECT_EQ(t.WaitForLayer(9, 3, Clock::now()).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvstream::connector
