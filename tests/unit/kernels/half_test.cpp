#include "textgen/kernels/half.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace textgen::kernels {
namespace {

TEST(HalfTest, F16RoundTripsEveryValue) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    const float f = f16ToFloat(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16ToFloat(floatToF16(f)))) << std::hex << bits;
      continue;
    }
    EXPECT_EQ(floatToF16(f), h) << std::hex << bits;
  }
}

TEST(HalfTest, F16KnownValues) {
  EXPECT_EQ(floatToF16(1.0f), 0x3c00);
  EXPECT_EQ(floatToF16(-2.0f), 0xc000);
  EXPECT_EQ(floatToF16(65504.0f), 0x7bff);               // largest finite
  EXPECT_EQ(floatToF16(65519.0f), 0x7bff);               // below the rounding midpoint
  EXPECT_EQ(floatToF16(65520.0f), 0x7c00);               // midpoint, ties to even -> Inf
  EXPECT_EQ(floatToF16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(floatToF16(std::ldexp(1.0f, -25)), 0x0000);  // half of it: ties to even -> 0
  EXPECT_EQ(floatToF16(std::ldexp(1.5f, -25)), 0x0001);  // above the midpoint
  EXPECT_EQ(floatToF16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 units: ties to even -> 2
  EXPECT_EQ(floatToF16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(floatToF16(-0.0f), 0x8000);
  EXPECT_EQ(floatToF16(std::numeric_limits<float>::infinity()), 0x7c00);
  // 1 + 2^-11 is the midpoint between 1 and the next f16: ties to even keeps 1.
  EXPECT_EQ(floatToF16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(floatToF16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
}

TEST(HalfTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(floatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16ToFloat(0x3f80), 1.0f);
  // 1 + 2^-8 is the midpoint between 1 and 1 + 2^-7: ties to even keeps 1.
  EXPECT_EQ(floatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(floatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(floatToBf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);
  EXPECT_EQ(floatToBf16(std::numeric_limits<float>::max()), 0x7f80);  // overflow to Inf
  EXPECT_TRUE(std::isnan(bf16ToFloat(floatToBf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(HalfTest, Bf16RoundTripsEveryValue) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const float f = bf16ToFloat(static_cast<uint16_t>(bits));
    if (std::isnan(f)) continue;
    EXPECT_EQ(floatToBf16(f), bits) << std::hex << bits;
  }
}

}  // namespace
}  // namespace textgen::kernels
