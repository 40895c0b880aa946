#include "common/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

namespace kvstream {
namespace {

TEST(DTypeTest, F16RoundTripsEveryFiniteValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if (((h >> 10) & 0x1f) == 0x1f) continue;  // inf/nan
    float f = F16ToF32(static_cast<uint16_t>(h));
    ASSERT_EQ(F32ToF16(f), h) << "h=" << h;
  }
}

TEST(DTypeTest, F16Rounding) {
  EXPECT_EQ(F16ToF32(F32ToF16(1.0f)), 1.0f);
  EXPECT_EQ(F16ToF32(F32ToF16(65504.f)), 65504.f);
  EXPECT_TRUE(std::isinf(F16ToF32(F32ToF16(70000.f))));
  // 1 + 2^-11 is halfway between 1 and 1+2^-10: ties to even -> 1.
  EXPECT_EQ(F16ToF32(F32ToF16(1.0f + std::ldexp(1.f, -11))), 1.0f);
  EXPECT_EQ(F16ToF32(F32ToF16(1.0f + 3 * std::ldexp(1.f, -11))), 1.0f + std::ldexp(1.f, -9));
  EXPECT_EQ(F16ToF32(F32ToF16(std::ldexp(1.f, -24))), std::ldexp(1.f, -24));  // min subnormal
  EXPECT_EQ(F32ToF16(std::ldexp(1.f, -26)), 0);
  EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(NAN))));
}

TEST(DTypeTest, Bf16) {
  for (uint32_t h = 0; h < 0x10000; h += 7) {
    if (((h >> 7) & 0xff) == 0xff) continue;
    ASSERT_EQ(F32ToBf16(Bf16ToF32(static_cast<uint16_t>(h))), h);
  }
  EXPECT_EQ(Bf16ToF32(F32ToBf16(3.0f)), 3.0f);
}

TEST(DTypeTest, Parse) {
  DType t;
  EXPECT_TRUE(ParseDType("bfloat16", &t));
  EXPECT_EQ(t, DType::kBF16);
  EXPECT_FALSE(ParseDType("int8", &t));
}

}  // namespace
}  // namespace kvstream
