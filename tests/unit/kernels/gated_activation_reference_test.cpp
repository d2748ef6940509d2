// The gated activations' CPU reference against the textbook formulas in double precision, in
// every dtype (act rounded to the dtype before the multiply, as PyTorch's act_fn(gate) * up).
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "textgen/kernels/gated_activation.h"
#include "textgen/kernels/half.h"

namespace textgen::kernels {
namespace {

constexpr Activation kActivations[] = {Activation::kSilu, Activation::kGelu, Activation::kGeluTanh,
                                       Activation::kRelu};

double activate(Activation a, double x) {
  switch (a) {
    case Activation::kSilu: return x / (1.0 + std::exp(-x));
    case Activation::kGelu: return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case Activation::kGeluTanh: {
      const double c = std::sqrt(2.0 / std::numbers::pi);
      return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
    }
    case Activation::kRelu: return x > 0.0 ? x : 0.0;
  }
  return 0.0;
}

float roundTo(DType dt, float v) {
  switch (dt) {
    case DType::kF32: return v;
    case DType::kF16: return f16ToFloat(floatToF16(v));
    case DType::kBF16: return bf16ToFloat(floatToBf16(v));
  }
  return v;
}

// Values as stored in `dt`, in its encoding.
std::vector<uint16_t> encodeHalf(DType dt, const std::vector<float>& v) {
  std::vector<uint16_t> out;
  for (float x : v) out.push_back(dt == DType::kF16 ? floatToF16(x) : floatToBf16(x));
  return out;
}

float decodeHalf(DType dt, uint16_t v) {
  return dt == DType::kF16 ? f16ToFloat(v) : bf16ToFloat(v);
}

TEST(GatedActivationReferenceTest, MatchesTheFormulasInDoublePrecision) {
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 3.0f);
  const int64_t rows = 5, n = 37;
  std::vector<float> gateUp(rows * 2 * n);
  for (float& x : gateUp) x = d(rng);
  gateUp[0] = 0.0f;  // act(0) = 0 for every activation
  gateUp[1] = -20.0f;
  gateUp[2] = 20.0f;
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (float& x : gateUp) x = roundTo(dt, x);  // exact in the dtype
    for (Activation a : kActivations) {
      SCOPED_TRACE(std::string(toString(a)) + " " + std::string(dtypeName(dt)));
      std::vector<float> got(rows * n);
      std::vector<uint16_t> inHalf =
          dt == DType::kF32 ? std::vector<uint16_t>{} : encodeHalf(dt, gateUp);
      std::vector<uint16_t> outHalf(rows * n);
      const GatedActivationParams p{
          .gateUp = dt == DType::kF32 ? static_cast<const void*>(gateUp.data()) : inHalf.data(),
          .out = dt == DType::kF32 ? static_cast<void*>(got.data()) : outHalf.data(),
          .rows = rows,
          .n = n,
          .dtype = dt,
          .activation = a};
      ASSERT_TRUE(gatedActivationReference(p).ok());
      if (dt != DType::kF32)
        for (size_t i = 0; i < got.size(); ++i) got[i] = decodeHalf(dt, outHalf[i]);
      // float32 math inside: a few float ulps before the dtype's own rounding (twice: act, out).
      const double eps = dt == DType::kF32 ? 1e-6 : dt == DType::kF16 ? 2.0 / 1024 : 2.0 / 128;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t i = 0; i < n; ++i) {
          const double g = gateUp[r * 2 * n + i], u = gateUp[r * 2 * n + n + i];
          const double act = activate(a, g);
          const double want = act * u;
          const double tol = eps * (std::fabs(act) + 1e-30) * std::fabs(u) + 1e-6 * std::fabs(u);
          ASSERT_NEAR(got[r * n + i], want, tol) << "row " << r << " i " << i << " gate " << g;
        }
      }
    }
  }
}

// The gelu variants and relu at points where they are known exactly or differ from each other.
TEST(GatedActivationReferenceTest, TellsTheActivationsApart) {
  const std::vector<float> gateUp = {-1.0f, 1.0f, 2.0f, 1.0f, 1.0f, 1.0f};  // [1, 2n], n = 3
  std::vector<float> out(3);
  auto run = [&](Activation a) {
    EXPECT_TRUE(
        gatedActivationReference(
            {.gateUp = gateUp.data(), .out = out.data(), .rows = 1, .n = 3, .activation = a})
            .ok());
    return out;
  };
  EXPECT_EQ(run(Activation::kRelu), (std::vector<float>{0.0f, 1.0f, 2.0f}));
  const auto gelu = run(Activation::kGelu), tanh = run(Activation::kGeluTanh);
  EXPECT_NEAR(gelu[1], 0.8413447460685429, 1e-6);  // Phi(1)
  EXPECT_NEAR(tanh[1], 0.8411919906082768, 1e-6);
  EXPECT_NE(gelu[1], tanh[1]);
  EXPECT_NEAR(run(Activation::kSilu)[0], -1.0 / (1.0 + std::exp(1.0)), 1e-7);
}

// SiLU is the same arithmetic as before the op took an activation: bit for bit.
TEST(GatedActivationReferenceTest, SiluIsUnchanged) {
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 4.0f);
  const int64_t n = 64;
  std::vector<float> gateUp(2 * n), out(n);
  for (float& x : gateUp) x = d(rng);
  ASSERT_TRUE(
      gatedActivationReference({.gateUp = gateUp.data(), .out = out.data(), .rows = 1, .n = n})
          .ok());
  for (int64_t i = 0; i < n; ++i) {
    const float g = gateUp[i];
    EXPECT_EQ(out[i], (g / (1.0f + std::exp(-g))) * gateUp[n + i]);
  }
}

// Not gated: act(x) alone over [rows, n], rounded once to the dtype, in place.
TEST(GatedActivationReferenceTest, NotGatedIsTheActivationAloneInPlace) {
  std::mt19937 rng(11);
  std::normal_distribution<float> d(0.0f, 3.0f);
  const int64_t rows = 3, n = 29;
  std::vector<float> x(rows * n);
  for (float& v : x) v = d(rng);
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (Activation a : kActivations) {
      SCOPED_TRACE(std::string(toString(a)) + " " + std::string(dtypeName(dt)));
      std::vector<float> in(x.size());
      for (size_t i = 0; i < x.size(); ++i) in[i] = roundTo(dt, x[i]);
      std::vector<float> got = in;
      std::vector<uint16_t> half = dt == DType::kF32 ? std::vector<uint16_t>{} : encodeHalf(dt, in);
      void* buf = dt == DType::kF32 ? static_cast<void*>(got.data()) : half.data();
      ASSERT_TRUE(gatedActivationReference({.gateUp = buf,
                                            .out = buf,
                                            .rows = rows,
                                            .n = n,
                                            .dtype = dt,
                                            .activation = a,
                                            .gated = false})
                      .ok());
      if (dt != DType::kF32)
        for (size_t i = 0; i < got.size(); ++i) got[i] = decodeHalf(dt, half[i]);
      const double eps = dt == DType::kF32 ? 1e-6 : dt == DType::kF16 ? 1.0 / 1024 : 1.0 / 128;
      for (size_t i = 0; i < in.size(); ++i) {
        const double want = activate(a, in[i]);
        ASSERT_NEAR(got[i], want, eps * std::fabs(want) + 1e-6) << "i " << i << " x " << in[i];
      }
    }
  }
}

// Not gated with a residual (Medusa's residual blocks): residual + act(x), act rounded to the dtype
// before the add and the sum rounded again, as PyTorch's x + act(linear(x)); in place over either.
TEST(GatedActivationReferenceTest, ResidualAddsTheRoundedActivation) {
  std::mt19937 rng(12);
  std::normal_distribution<float> d(0.0f, 3.0f);
  const int64_t rows = 3, n = 17;
  std::vector<float> x(rows * n), res(rows * n);
  for (float& v : x) v = d(rng);
  for (float& v : res) v = d(rng);
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (bool intoResidual : {false, true}) {
      SCOPED_TRACE(std::string(dtypeName(dt)) + (intoResidual ? " into the residual" : ""));
      std::vector<float> in(x.size()), r(res.size());
      for (size_t i = 0; i < x.size(); ++i) {
        in[i] = roundTo(dt, x[i]);
        r[i] = roundTo(dt, res[i]);
      }
      std::vector<float> gotX = in, gotR = r;
      std::vector<uint16_t> halfX, halfR;
      void* bx = gotX.data();
      void* br = gotR.data();
      if (dt != DType::kF32) {
        halfX = encodeHalf(dt, in);
        halfR = encodeHalf(dt, r);
        bx = halfX.data();
        br = halfR.data();
      }
      ASSERT_TRUE(gatedActivationReference({.gateUp = bx,
                                            .out = intoResidual ? br : bx,
                                            .rows = rows,
                                            .n = n,
                                            .dtype = dt,
                                            .activation = Activation::kSilu,
                                            .gated = false,
                                            .residual = br})
                      .ok());
      std::vector<float> got = intoResidual ? gotR : gotX;
      if (dt != DType::kF32) {
        const std::vector<uint16_t>& h = intoResidual ? halfR : halfX;
        for (size_t i = 0; i < got.size(); ++i) got[i] = decodeHalf(dt, h[i]);
      }
      for (size_t i = 0; i < in.size(); ++i) {
        const float act = roundTo(dt, static_cast<float>(activate(Activation::kSilu, in[i])));
        const float want = roundTo(dt, r[i] + act);
        const double eps = dt == DType::kF32 ? 1e-6 : dt == DType::kF16 ? 1.0 / 1024 : 1.0 / 128;
        ASSERT_NEAR(got[i], want, eps * std::fabs(want) + 1e-6) << "i " << i;
      }
    }
  }
  // A residual is for the activation alone.
  std::vector<float> buf(8);
  EXPECT_FALSE(
      gatedActivationReference(
          {.gateUp = buf.data(), .out = buf.data(), .rows = 1, .n = 2, .residual = buf.data()})
          .ok());
}

TEST(GatedActivationReferenceTest, RefusesBadParams) {
  std::vector<float> buf(8);
  EXPECT_FALSE(
      gatedActivationReference({.gateUp = buf.data(), .out = buf.data(), .rows = 1, .n = 0}).ok());
  EXPECT_FALSE(
      gatedActivationReference({.gateUp = nullptr, .out = buf.data(), .rows = 1, .n = 2}).ok());
  EXPECT_FALSE(gatedActivationReference({.gateUp = buf.data(),
                                         .out = buf.data(),
                                         .rows = 1,
                                         .n = 2,
                                         .activation = static_cast<Activation>(42)})
                   .ok());
}

}  // namespace
}  // namespace textgen::kernels
