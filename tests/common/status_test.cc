#include "common/status.h"

#include <gtest/gtest.h>

namespace kvstream {
namespace {

Result<int> Half(int x) {
  if (x % 2) return InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

Status UseHalf(int x, int* out) {
  KV_ASSIGN_OR_RETURN(*out, Half(x));
  return OkStatus();
}

TEST(StatusTest, OkAndErrors) {
  EXPECT_TRUE(OkStatus().ok());
  Status s = Timeout("waiting for layer 3");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kTimeout);
  EXPECT_EQ(s.ToString(), "TIMEOUT: waiting for layer 3");
  EXPECT_EQ(s.WithContext("request 7").ToString(), "TIMEOUT: request 7: waiting for layer 3");
}

TEST(StatusTest, ResultPropagates) {
  int v = 0;
  EXPECT_TRUE(UseHalf(8, &v).ok());
  EXPECT_EQ(v, 4);
  Status s = UseHalf(3, &v);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(v, 4);  // output untouched on error
}

TEST(StatusTest, ResultFromOkStatusIsInternalError) {
  Result<int> r{OkStatus()};
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace kvstream
