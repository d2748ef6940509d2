// clampReference (MPT's clip_qkv): values past the limit become the limit rounded to the dtype,
// others are unchanged, NaN passes through, the row stride leaves the gaps alone; bad params are
// refused.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "textgen/kernels/clamp.h"
#include "textgen/kernels/half.h"

namespace textgen::kernels {
namespace {

TEST(ClampReference, ClampsIntoTheLimitAndKeepsTheRest) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  // Two rows of 3, stride 4: the 4th column of each row is a gap the op must not touch.
  std::vector<float> x = {-3.0f, 1.5f, 2.5f, 99.0f, nan, -inf, 2.0f, -99.0f};
  ASSERT_TRUE(
      clampReference({.x = x.data(), .rows = 2, .cols = 3, .rowStride = 4, .limit = 2.0f}).ok());
  EXPECT_EQ(x[0], -2.0f);
  EXPECT_EQ(x[1], 1.5f);
  EXPECT_EQ(x[2], 2.0f);
  EXPECT_EQ(x[3], 99.0f);
  EXPECT_TRUE(std::isnan(x[4]));
  EXPECT_EQ(x[5], -2.0f);
  EXPECT_EQ(x[6], 2.0f);
  EXPECT_EQ(x[7], -99.0f);
}

TEST(ClampReference, HalfPrecisionStoresTheRoundedLimit) {
  for (DType dt : {DType::kF16, DType::kBF16}) {
    const auto enc = [dt](float v) { return dt == DType::kF16 ? floatToF16(v) : floatToBf16(v); };
    const auto dec = [dt](uint16_t v) {
      return dt == DType::kF16 ? f16ToFloat(v) : bf16ToFloat(v);
    };
    std::vector<uint16_t> x = {enc(5.0f), enc(-5.0f), enc(0.25f)};
    const float limit = 0.3f;  // not representable in either dtype
    ASSERT_TRUE(
        clampReference(
            {.x = x.data(), .rows = 1, .cols = 3, .rowStride = 3, .limit = limit, .dtype = dt})
            .ok());
    EXPECT_EQ(dec(x[0]), dec(enc(limit))) << dtypeName(dt);
    EXPECT_EQ(dec(x[1]), dec(enc(-limit))) << dtypeName(dt);
    EXPECT_EQ(dec(x[2]), dec(enc(0.25f))) << dtypeName(dt);
  }
}

TEST(ClampReference, RefusesBadParams) {
  std::vector<float> x(4);
  EXPECT_FALSE(
      clampReference({.x = x.data(), .rows = 1, .cols = 4, .rowStride = 3, .limit = 1}).ok());
  EXPECT_FALSE(
      clampReference({.x = x.data(), .rows = 1, .cols = 4, .rowStride = 4, .limit = 0}).ok());
  EXPECT_FALSE(
      clampReference({.x = x.data(), .rows = 1, .cols = 4, .rowStride = 4, .limit = -1}).ok());
  EXPECT_FALSE(clampReference({.x = x.data(),
                               .rows = 1,
                               .cols = 4,
                               .rowStride = 4,
                               .limit = std::numeric_limits<float>::infinity()})
                   .ok());
  EXPECT_FALSE(
      clampReference({.x = nullptr, .rows = 1, .cols = 4, .rowStride = 4, .limit = 1}).ok());
  EXPECT_TRUE(
      clampReference({.x = nullptr, .rows = 0, .cols = 4, .rowStride = 4, .limit = 1}).ok());
}

}  // namespace
}  // namespace textgen::kernels
