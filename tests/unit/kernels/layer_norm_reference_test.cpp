// layerNormReference against a double-precision evaluation of the formula in layer_norm.h, its
// rounding contract in bf16/f16, the residual add, in-place use and bad params.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "textgen/kernels/half.h"
#include "textgen/kernels/layer_norm.h"

namespace textgen::kernels {
namespace {

// torch.nn.functional.layer_norm in double: biased variance, affine, optional bias.
std::vector<double> layerNormDouble(const std::vector<float>& x, const std::vector<float>& w,
                                    const std::vector<float>* b, int64_t h, double eps) {
  std::vector<double> out(x.size());
  for (size_t row = 0; row < x.size(); row += h) {
    double mean = 0.0, var = 0.0;
    for (int64_t i = 0; i < h; ++i) mean += x[row + i];
    mean /= static_cast<double>(h);
    for (int64_t i = 0; i < h; ++i) var += (x[row + i] - mean) * (x[row + i] - mean);
    var /= static_cast<double>(h);
    for (int64_t i = 0; i < h; ++i) {
      out[row + i] = (x[row + i] - mean) / std::sqrt(var + eps) * w[i] + (b ? (*b)[i] : 0.0);
    }
  }
  return out;
}

std::vector<float> randomVector(size_t n, std::mt19937& rng, float mean, float stddev) {
  std::normal_distribution<float> d(mean, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(LayerNormReferenceTest, MatchesDoubleFormulaF32) {
  std::mt19937 rng(42);
  for (int64_t h : {1, 2, 7, 64, 1000, 4096}) {
    for (bool withBias : {false, true}) {
      SCOPED_TRACE("hidden " + std::to_string(h) + (withBias ? " bias" : ""));
      const int64_t tokens = 3;
      // A large mean: the variance must not come from E[x^2] - mean^2.
      auto x = randomVector(tokens * h, rng, 100.0f, 2.0f);
      auto w = randomVector(h, rng, 1.0f, 0.3f), b = randomVector(h, rng, 0.0f, 0.5f);
      std::vector<float> out(x.size());
      LayerNormParams p{.input = x.data(),
                        .output = out.data(),
                        .weight = w.data(),
                        .bias = withBias ? b.data() : nullptr,
                        .numTokens = tokens,
                        .hiddenSize = h,
                        .eps = 1e-5f};
      ASSERT_TRUE(layerNormReference(p).ok());
      const auto want = layerNormDouble(x, w, withBias ? &b : nullptr, h, 1e-5);
      for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], want[i], 2e-5) << i;
    }
  }
}

TEST(LayerNormReferenceTest, HandComputed) {
  // x = [1, 3]: mean 2, var 1; normalised [-1, 1].
  std::vector<float> x{1.0f, 3.0f}, w{2.0f, 3.0f}, b{0.5f, -0.5f}, out(2);
  LayerNormParams p{.input = x.data(),
                    .output = out.data(),
                    .weight = w.data(),
                    .bias = b.data(),
                    .numTokens = 1,
                    .hiddenSize = 2,
                    .eps = 0.0f};
  ASSERT_TRUE(layerNormReference(p).ok());
  EXPECT_EQ(out, (std::vector<float>{-1.5f, 2.5f}));
  p.bias = nullptr;
  ASSERT_TRUE(layerNormReference(p).ok());
  EXPECT_EQ(out, (std::vector<float>{-2.0f, 3.0f}));
}

TEST(LayerNormReferenceTest, ConstantRowGivesBias) {
  std::vector<float> x{5.0f, 5.0f, 5.0f}, w{1.0f, 2.0f, 3.0f}, b{0.25f, 0.5f, 0.75f}, out(3);
  LayerNormParams p{.input = x.data(),
                    .output = out.data(),
                    .weight = w.data(),
                    .bias = b.data(),
                    .numTokens = 1,
                    .hiddenSize = 3};
  ASSERT_TRUE(layerNormReference(p).ok());
  EXPECT_EQ(out, b);
}

TEST(LayerNormReferenceTest, ResidualAddIsStoredAndNormalised) {
  std::vector<float> x{1.0f, 2.0f, 0.5f, -1.0f}, r{0.0f, 2.0f, 0.5f, 3.0f}, w{1.0f, 1.0f};
  std::vector<float> out(4), rOut(4);
  LayerNormParams p{.input = x.data(),
                    .residual = r.data(),
                    .residualOut = rOut.data(),
                    .output = out.data(),
                    .weight = w.data(),
                    .numTokens = 2,
                    .hiddenSize = 2,
                    .eps = 0.0f};
  ASSERT_TRUE(layerNormReference(p).ok());
  EXPECT_EQ(rOut, (std::vector<float>{1.0f, 4.0f, 1.0f, 2.0f}));
  EXPECT_EQ(out, (std::vector<float>{-1.0f, 1.0f, -1.0f, 1.0f}));
}

TEST(LayerNormReferenceTest, InPlaceEqualsOutOfPlace) {
  std::mt19937 rng(3);
  const int64_t h = 5, tokens = 4;
  auto x = randomVector(tokens * h, rng, 0.0f, 1.0f), r = randomVector(tokens * h, rng, 0.0f, 1.0f);
  auto w = randomVector(h, rng, 1.0f, 0.2f), b = randomVector(h, rng, 0.0f, 0.2f);
  std::vector<float> out(x.size()), rOut(x.size());
  LayerNormParams p{.input = x.data(),
                    .residual = r.data(),
                    .residualOut = rOut.data(),
                    .output = out.data(),
                    .weight = w.data(),
                    .bias = b.data(),
                    .numTokens = tokens,
                    .hiddenSize = h};
  ASSERT_TRUE(layerNormReference(p).ok());
  std::vector<float> xi = x, ri = r;
  p.input = p.output = xi.data();
  p.residual = p.residualOut = ri.data();
  ASSERT_TRUE(layerNormReference(p).ok());
  EXPECT_EQ(xi, out);
  EXPECT_EQ(ri, rOut);
}

// x = [-1, 1] has mean 0 and variance 1, so the normalised value is n = 1 / sqrt(1 + eps); with
// weight 3 the output is round(3n) (torch's layer_norm), not round(3 * round(n)) (LlamaRMSNorm's
// order). The eps values are picked so the two differ in the dtype.
struct RoundOnceCase {
  DType dtype;
  float eps;
  float roundedOnce;   // round(3n)
  float roundedTwice;  // round(3 * round(n))
};

TEST(LayerNormReferenceTest, HalfPrecisionRoundsOnceAtTheEnd) {
  const RoundOnceCase cases[] = {
      {DType::kBF16, std::ldexp(1.0f, -6), 2.984375f, 2.96875f},
      {DType::kF16, std::ldexp(1.0f, -9), 2.998046875f, 2.99609375f},
  };
  for (const RoundOnceCase& c : cases) {
    SCOPED_TRACE(dtypeName(c.dtype));
    const bool bf = c.dtype == DType::kBF16;
    auto enc = [&](float v) { return bf ? floatToBf16(v) : floatToF16(v); };
    auto dec = [&](uint16_t v) { return bf ? bf16ToFloat(v) : f16ToFloat(v); };
    std::vector<uint16_t> x{enc(-1.0f), enc(1.0f)}, w{enc(1.0f), enc(3.0f)}, out(2);
    LayerNormParams p{.input = x.data(),
                      .output = out.data(),
                      .weight = w.data(),
                      .numTokens = 1,
                      .hiddenSize = 2,
                      .eps = c.eps,
                      .dtype = c.dtype};
    ASSERT_TRUE(layerNormReference(p).ok());
    EXPECT_EQ(dec(out[1]), c.roundedOnce);
    EXPECT_NE(dec(out[1]), c.roundedTwice);
  }
}

TEST(LayerNormReferenceTest, Bf16ResidualSumIsRounded) {
  // 1 + 2^-8 is not representable in bf16: the stored sum rounds (ties to even) to 1.
  std::vector<uint16_t> x{floatToBf16(1.0f), floatToBf16(0.0f)};
  std::vector<uint16_t> r{floatToBf16(std::ldexp(1.0f, -8)), floatToBf16(0.0f)};
  std::vector<uint16_t> w{floatToBf16(1.0f), floatToBf16(1.0f)}, out(2), rOut(2);
  LayerNormParams p{.input = x.data(),
                    .residual = r.data(),
                    .residualOut = rOut.data(),
                    .output = out.data(),
                    .weight = w.data(),
                    .numTokens = 1,
                    .hiddenSize = 2,
                    .eps = 0.0f,
                    .dtype = DType::kBF16};
  ASSERT_TRUE(layerNormReference(p).ok());
  EXPECT_EQ(bf16ToFloat(rOut[0]), 1.0f);
  EXPECT_EQ(bf16ToFloat(out[0]), 1.0f);  // [1, 0]: mean 0.5, variance 0.25
  EXPECT_EQ(bf16ToFloat(out[1]), -1.0f);
}

TEST(LayerNormReferenceTest, RejectsBadParams) {
  std::vector<float> buf(8);
  LayerNormParams ok{.input = buf.data(),
                     .output = buf.data(),
                     .weight = buf.data(),
                     .numTokens = 2,
                     .hiddenSize = 4};
  EXPECT_TRUE(validateLayerNorm(ok).ok());

  LayerNormParams p = ok;
  p.hiddenSize = 0;
  EXPECT_EQ(layerNormReference(p).message(), "layer_norm: hiddenSize must be > 0");
  p = ok;
  p.numTokens = -1;
  EXPECT_EQ(layerNormReference(p).message(), "layer_norm: numTokens must be >= 0");
  p = ok;
  p.weight = nullptr;
  EXPECT_EQ(layerNormReference(p).message(), "layer_norm: weight is null");
  p = ok;
  p.input = nullptr;
  EXPECT_EQ(layerNormReference(p).message(), "layer_norm: input is null");
  p = ok;
  p.output = nullptr;
  EXPECT_EQ(layerNormReference(p).message(), "layer_norm: output is null");
  p = ok;
  p.residual = buf.data();  // residualOut missing
  EXPECT_EQ(layerNormReference(p).message(),
            "layer_norm: residual and residualOut must be set together");
  p = ok;
  p.eps = -1.0f;
  EXPECT_EQ(layerNormReference(p).message(), "layer_norm: eps must be >= 0");
  p = ok;
  p.eps = std::nanf("");
  EXPECT_EQ(layerNormReference(p).code(), StatusCode::kInvalidArgument);
  p = ok;
  p.numTokens = 0;
  p.input = nullptr;  // nothing to do: no pointer is touched
  EXPECT_TRUE(layerNormReference(p).ok());
}

}  // namespace
}  // namespace textgen::kernels
