#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "textgen/kernels/half.h"
#include "textgen/kernels/rms_norm.h"

namespace textgen::kernels {
namespace {

TEST(RmsNormReferenceTest, MatchesHandComputedF32) {
  // x = [3, 4]: mean(x^2) = 12.5, rms = 3.5355...
  std::vector<float> x{3.0f, 4.0f}, w{1.0f, 2.0f}, out(2);
  RmsNormParams p{.input = x.data(),
                  .output = out.data(),
                  .weight = w.data(),
                  .numTokens = 1,
                  .hiddenSize = 2,
                  .eps = 0.0f};
  ASSERT_TRUE(rmsNormReference(p).ok());
  EXPECT_NEAR(out[0], 3.0 / std::sqrt(12.5), 1e-6);
  EXPECT_NEAR(out[1], 2.0 * 4.0 / std::sqrt(12.5), 1e-6);
}

TEST(RmsNormReferenceTest, ResidualAddIsStoredAndNormalised) {
  std::vector<float> x{1.0f, 2.0f, 0.5f, -1.0f}, r{2.0f, 2.0f, 0.5f, 1.0f}, w{1.0f, 1.0f};
  std::vector<float> out(4), rOut(4);
  RmsNormParams p{.input = x.data(),
                  .residual = r.data(),
                  .residualOut = rOut.data(),
                  .output = out.data(),
                  .weight = w.data(),
                  .numTokens = 2,
                  .hiddenSize = 2,
                  .eps = 0.0f};
  ASSERT_TRUE(rmsNormReference(p).ok());
  EXPECT_EQ(rOut, (std::vector<float>{3.0f, 4.0f, 1.0f, 0.0f}));
  EXPECT_NEAR(out[0], 3.0 / std::sqrt(12.5), 1e-6);
  EXPECT_NEAR(out[2], 1.0 / std::sqrt(0.5), 1e-6);
  EXPECT_EQ(out[3], 0.0f);
}

TEST(RmsNormReferenceTest, InPlaceEqualsOutOfPlace) {
  std::vector<float> x{0.3f, -1.2f, 2.5f, 0.7f, 1.1f, -0.4f},
      r{1.0f, 0.5f, -0.5f, 2.0f, 0.0f, 3.0f};
  std::vector<float> w{0.9f, 1.1f, 1.3f};
  std::vector<float> out(6), rOut(6);
  RmsNormParams p{.input = x.data(),
                  .residual = r.data(),
                  .residualOut = rOut.data(),
                  .output = out.data(),
                  .weight = w.data(),
                  .numTokens = 2,
                  .hiddenSize = 3};
  ASSERT_TRUE(rmsNormReference(p).ok());
  std::vector<float> xi = x, ri = r;
  p.input = xi.data();
  p.output = xi.data();
  p.residual = ri.data();
  p.residualOut = ri.data();
  ASSERT_TRUE(rmsNormReference(p).ok());
  EXPECT_EQ(xi, out);
  EXPECT_EQ(ri, rOut);
}

TEST(RmsNormReferenceTest, Bf16RoundsSumAndNormalisedValue) {
  // 1 + 2^-8 is not representable in bf16: the stored sum must be rounded (ties to even -> 1).
  std::vector<uint16_t> x{floatToBf16(1.0f)}, r{floatToBf16(std::ldexp(1.0f, -8))};
  std::vector<uint16_t> w{floatToBf16(3.0f)}, out(1), rOut(1);
  RmsNormParams p{.input = x.data(),
                  .residual = r.data(),
                  .residualOut = rOut.data(),
                  .output = out.data(),
                  .weight = w.data(),
                  .numTokens = 1,
                  .hiddenSize = 1,
                  .eps = 0.0f,
                  .dtype = DType::kBF16};
  ASSERT_TRUE(rmsNormReference(p).ok());
  EXPECT_EQ(bf16ToFloat(rOut[0]), 1.0f);
  EXPECT_EQ(bf16ToFloat(out[0]), 3.0f);
}

TEST(RmsNormReferenceTest, RejectsBadParams) {
  std::vector<float> buf(8);
  RmsNormParams ok{.input = buf.data(),
                   .output = buf.data(),
                   .weight = buf.data(),
                   .numTokens = 2,
                   .hiddenSize = 4};
  EXPECT_TRUE(validateRmsNorm(ok).ok());

  RmsNormParams p = ok;
  p.hiddenSize = 0;
  EXPECT_EQ(rmsNormReference(p).code(), StatusCode::kInvalidArgument);
  p = ok;
  p.weight = nullptr;
  EXPECT_EQ(rmsNormReference(p).message(), "rms_norm: weight is null");
  p = ok;
  p.residual = buf.data();  // residualOut missing
  EXPECT_EQ(rmsNormReference(p).message(),
            "rms_norm: residual and residualOut must be set together");
  p = ok;
  p.eps = -1.0f;
  EXPECT_FALSE(rmsNormReference(p).ok());
  p = ok;
  p.numTokens = 0;
  p.input = nullptr;  // nothing to do: no pointer is touched
  EXPECT_TRUE(rmsNormReference(p).ok());
}

}  // namespace
}  // namespace textgen::kernels
