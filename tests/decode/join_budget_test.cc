#include "decode/join_budget.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace kvstream::decode {
namespace {

constexpr double GB = 1e9;

TEST(JoinBudget, NoTargetAdmitsEveryCandidate) {
  JoinBudget b(0, 15 * GB);
  b.Observe(0.010, 17 * GB);
  std::vector<double> c = {2 * GB, 2 * GB, 2 * GB};
  EXPECT_EQ(3u, b.Admit(17 * GB, c));
  EXPECT_EQ(0u, b.Admit(17 * GB, {}));
  EXPECT_FALSE(b.limited());
}

TEST(JoinBudget, BeforeAnyStepIsObservedNothingIsLimited) {
  JoinBudget b(0.012, 15 * GB);
  std::vector<double> c = {2 * GB, 2 * GB, 2 * GB, 2 * GB};
  EXPECT_EQ(4u, b.Admit(17 * GB, c));
}

TEST(JoinBudget, AdmitsThePrefixThatFitsTheTarget) {
  // 32 GB per step in 10 ms: 0.3125 ns per byte. Target 12 ms = 38.4 GB: 6.4 GB of joiners.
  JoinBudget b(0.012, 15 * GB);
  b.Observe(0.010, 17 * GB);
  EXPECT_NEAR(0.010 / (32 * GB), b.seconds_per_byte(), 1e-18);
  std::vector<double> c = {2 * GB, 2 * GB, 2 * GB, 2 * GB};
  EXPECT_EQ(3u, b.Admit(17 * GB, c));
  // Order is kept: a big first candidate that does not fit holds back the smaller one after it
  // (no overtaking) and waits; as nothing joined that step, it joins alone in the next one.
  std::vector<double> big_first = {10 * GB, 1 * GB};
  EXPECT_EQ(0u, b.Admit(17 * GB, big_first));
  EXPECT_EQ(1u, b.Admit(17 * GB, big_first));
}

TEST(JoinBudget, ProgressWhenTheBatchAloneIsOverTheTarget) {
  JoinBudget b(0.012, 15 * GB);
  b.Observe(0.015, 33 * GB);  // the running batch alone is 15 ms
  std::vector<double> c = {2 * GB, 2 * GB};
  // Nothing fits; one joins, then the next step none (the last one admitted), then one again.
  EXPECT_EQ(1u, b.Admit(33 * GB, c));
  EXPECT_EQ(0u, b.Admit(33 * GB, c));
  EXPECT_EQ(1u, b.Admit(33 * GB, c));
  // A step without candidates does not reset the alternation.
  EXPECT_EQ(0u, b.Admit(33 * GB, {}));
  EXPECT_EQ(0u, b.Admit(33 * GB, c));
}

TEST(JoinBudget, LearnsFromObservedSteps) {
  JoinBudget b(0.012, 15 * GB, /*ewma_weight=*/0.5);
  b.Observe(0.010, 17 * GB);
  const double first = b.seconds_per_byte();
  b.Observe(0.020, 17 * GB);  // contention: the same bytes took twice as long
  EXPECT_NEAR(first * 1.5, b.seconds_per_byte(), first * 1e-9);
  std::vector<double> c = {2 * GB};
  // 34 GB now predicts 15.9 ms > 12 ms: nothing fits; with no step before, progress admits
  // one, then the next step waits.
  EXPECT_EQ(1u, b.Admit(17 * GB, c));
  EXPECT_EQ(0u, b.Admit(17 * GB, c));
}

TEST(JoinBudget, IgnoresBadSamples) {
  JoinBudget b(0.012, 15 * GB);
  b.Observe(0, 17 * GB);
  b.Observe(-1, 17 * GB);
  b.Observe(std::numeric_limits<double>::quiet_NaN(), 17 * GB);
  b.Observe(0.01, std::numeric_limits<double>::infinity());
  EXPECT_EQ(0, b.seconds_per_byte());
  b.Observe(0.010, 17 * GB);
  EXPECT_GT(b.seconds_per_byte(), 0);
}

TEST(JoinBudget, BadTargetMeansNoLimit) {
  JoinBudget b(std::numeric_limits<double>::quiet_NaN(), 15 * GB);
  EXPECT_FALSE(b.limited());
  JoinBudget n(-1, 15 * GB);
  EXPECT_FALSE(n.limited());
}

}  // namespace
}  // namespace kvstream::decode
