// The runtime layout of quantized linear layers (issue 16; textgen/kernels/quant_gemm.h): the CPU
// reference against dense GEMMs on weights and activations dequantized by hand here; the fp8
// conversions; the load-time quantizers (bitsandbytes nf4/fp4, LLM.int8 / EETQ int8, fp8) on small
// tensors checked by hand; pack() / takeColumns() / stackOutputs() on act-order tensors; a
// quantized Linear through the CPU backend; and a model loaded under each --quantize format
// against its dense run. Expected values are written from the formats' definitions, not from the
// code under test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "loader/quantized_tensor.h"
#include "textgen/kernels/fp8.h"
#include "textgen/kernels/quant_gemm.h"
#include "textgen/runtime/backend.h"
#include "textgen/runtime/model.h"
#include "textgen/tokenizer/tokenizer.h"

namespace textgen::runtime {
namespace {

using kernels::ActQuant;
using kernels::DType;
using kernels::QuantCode;
using kernels::QuantGemmParams;
using kernels::QuantWeight;

// bitsandbytes' published code tables (csrc/kernels.cu), written out here.
constexpr float kNf4[16] = {-1.0f,
                            -0.6961928009986877f,
                            -0.5250730514526367f,
                            -0.39491748809814453f,
                            -0.28444138169288635f,
                            -0.18477343022823334f,
                            -0.09105003625154495f,
                            0.0f,
                            0.07958029955625534f,
                            0.16093020141124725f,
                            0.24611230194568634f,
                            0.33791524171829224f,
                            0.44070982933044434f,
                            0.5626170039176941f,
                            0.7229568362236023f,
                            1.0f};
constexpr float kFp4[16] = {0.0f,      1.0f / 192, 2.0f / 3,  1.0f,        1.0f / 3,  0.5f,
                            1.0f / 6,  0.25f,      -0.0f,     -1.0f / 192, -2.0f / 3, -1.0f,
                            -1.0f / 3, -0.5f,      -1.0f / 6, -0.25f};

// y[r, o] = sum_i x[r, i] * w[o, i], in double.
std::vector<float> denseGemm(const std::vector<float>& x, const std::vector<float>& w, int64_t rows,
                             int64_t in, int64_t out) {
  std::vector<float> y(static_cast<size_t>(rows * out));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double acc = 0;
      for (int64_t i = 0; i < in; ++i) acc += double(x[r * in + i]) * w[o * in + i];
      y[r * out + o] = static_cast<float>(acc);
    }
  return y;
}

// 4-bit codes packed two per byte, column 2k in the low nibble.
std::vector<uint8_t> pack4(const std::vector<uint8_t>& codes, int64_t out, int64_t in) {
  std::vector<uint8_t> p(static_cast<size_t>(out * in / 2), 0);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t j = 0; j < in; ++j)
      p[o * in / 2 + j / 2] |= static_cast<uint8_t>(codes[o * in + j] << (4 * (j % 2)));
  return p;
}

// quantGemmReference's y against the dense GEMM of the expected activations and weights.
void expectGemm(const QuantWeight& w, const std::vector<float>& x, int64_t rows, int64_t in,
                int64_t out, const std::vector<float>& wantW, const std::vector<float>& wantX) {
  std::vector<float> dense(static_cast<size_t>(out * in));
  ASSERT_TRUE(kernels::dequantizeWeightReference(w, out, in, dense.data()).ok());
  for (size_t k = 0; k < dense.size(); ++k) EXPECT_FLOAT_EQ(dense[k], wantW[k]) << "weight " << k;
  std::vector<float> y(static_cast<size_t>(rows * out));
  QuantGemmParams p{.x = x.data(), .w = w, .y = y.data(), .rows = rows, .in = in, .out = out};
  std::vector<float> xq(x.size());
  ASSERT_TRUE(kernels::quantizeActivationsReference(p, xq.data()).ok());
  for (size_t k = 0; k < xq.size(); ++k) EXPECT_FLOAT_EQ(xq[k], wantX[k]) << "activation " << k;
  ASSERT_TRUE(kernels::quantGemmReference(p).ok());
  const std::vector<float> want = denseGemm(wantX, wantW, rows, in, out);
  for (size_t k = 0; k < y.size(); ++k)
    EXPECT_NEAR(y[k], want[k], 1e-5f * (1 + std::fabs(want[k]))) << "y " << k;
}

TEST(QuantGemmReference, Uint4WithZerosAndGroups) {
  // [out 2, in 4], groups of 2: deq = (q - zero) * scale.
  const std::vector<uint8_t> codes = {0, 15, 7, 8, 3, 4, 12, 1};
  const std::vector<float> scales = {0.5f, 2.0f, 0.25f, 1.0f};
  const std::vector<uint8_t> zeros = {8, 7, 0, 15};
  const auto packed = pack4(codes, 2, 4);
  EXPECT_EQ(packed[0], 0xF0);  // column 1 in the high nibble
  QuantWeight w{.code = QuantCode::kUint4,
                .packed = packed.data(),
                .scales = scales.data(),
                .zeros = zeros.data(),
                .groupSize = 2};
  const std::vector<float> wantW = {(0 - 8) * 0.5f,   (15 - 8) * 0.5f, (7 - 7) * 2.0f,
                                    (8 - 7) * 2.0f,   3 * 0.25f,       4 * 0.25f,
                                    (12 - 15) * 1.0f, -14.0f};
  const std::vector<float> x = {1, 2, 3, 4, -1, 0.5f, 0, 2};
  expectGemm(w, x, 2, 4, 2, wantW, x);
}

TEST(QuantGemmReference, Uint8SignedAsOffset) {
  // A signed int8 weight is stored q + 128 with zero point 128 (LLM.int8 and EETQ weights).
  const std::vector<uint8_t> codes = {128 + 127, 128 - 127, 128, 128 + 5, 128 - 64, 128 + 1};
  const std::vector<float> scales = {1.0f / 127, 0.5f};
  const std::vector<uint8_t> zeros = {128, 128};
  QuantWeight w{.code = QuantCode::kUint8,
                .packed = codes.data(),
                .scales = scales.data(),
                .zeros = zeros.data(),
                .groupSize = 3};
  const std::vector<float> wantW = {1.0f, -1.0f, 0.0f, 2.5f, -32.0f, 0.5f};
  const std::vector<float> x = {0.5f, -2, 3};
  expectGemm(w, x, 1, 3, 2, wantW, x);
}

TEST(QuantGemmReference, Nf4AndFp4TablesAreBitsandbytes) {
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(kernels::kNf4Table[c], kNf4[c]) << "nf4 code " << c;
    EXPECT_FLOAT_EQ(kernels::kFp4Table[c], kFp4[c]) << "fp4 code " << c;
  }
  // [out 2, in 16], one group per output: every code once per row.
  for (QuantCode code : {QuantCode::kNf4, QuantCode::kFp4}) {
    SCOPED_TRACE(std::string(kernels::toString(code)));
    std::vector<uint8_t> codes(32);
    for (int j = 0; j < 16; ++j) codes[j] = static_cast<uint8_t>(j), codes[16 + j] = 15 - j;
    const auto packed = pack4(codes, 2, 16);
    const std::vector<float> scales = {2.0f, 0.125f};
    QuantWeight w{.code = code, .packed = packed.data(), .scales = scales.data(), .groupSize = 16};
    const float* table = code == QuantCode::kNf4 ? kNf4 : kFp4;
    std::vector<float> wantW(32), x(48);
    for (int j = 0; j < 16; ++j) wantW[j] = table[j] * 2.0f, wantW[16 + j] = table[15 - j] * 0.125f;
    for (size_t k = 0; k < x.size(); ++k) x[k] = static_cast<float>(k % 7) - 3.0f;
    expectGemm(w, x, 3, 16, 2, wantW, x);
  }
}

TEST(QuantGemmReference, PermutationPlacesColumns) {
  // Column j holds input perm[j]; groups run over columns.
  const std::vector<uint8_t> codes = {1, 2, 3, 4};  // [out 1, in 4], zero 0
  const std::vector<float> scales = {1.0f, 10.0f};
  const std::vector<uint8_t> zeros = {0, 0};
  const std::vector<int32_t> perm = {2, 0, 3, 1};
  QuantWeight w{.code = QuantCode::kUint8,
                .packed = codes.data(),
                .scales = scales.data(),
                .zeros = zeros.data(),
                .groupSize = 2,
                .perm = perm.data()};
  // input 2 <- 1 * 1, input 0 <- 2 * 1, input 3 <- 3 * 10, input 1 <- 4 * 10
  expectGemm(w, {1, 2, 3, 4}, 1, 4, 1, {2, 40, 1, 30}, {1, 2, 3, 4});
  const std::vector<int32_t> bad = {0, 1, 2, 4};
  w.perm = bad.data();
  std::vector<float> dense(4);
  EXPECT_FALSE(kernels::dequantizeWeightReference(w, 1, 4, dense.data()).ok());
}

TEST(QuantGemmReference, LlmInt8OutlierColumnsAndRowScales) {
  // int8 weights [out 2, in 4] (identity-like), activations [2, 4] with one outlier (7 >= 6).
  const std::vector<uint8_t> codes = {128 + 127, 128,       128,       128 + 64,
                                      128,       128 + 127, 128 - 127, 128};
  const std::vector<float> scales = {1.0f / 127, 2.0f / 127};
  const std::vector<uint8_t> zeros = {128, 128};
  QuantWeight w{.code = QuantCode::kUint8,
                .packed = codes.data(),
                .scales = scales.data(),
                .zeros = zeros.data(),
                .groupSize = 4,
                .act = ActQuant::kLlmInt8};
  const std::vector<float> wantW = {1, 0, 0, 64.0f / 127, 0, 2, -2, 0};
  const std::vector<float> x = {1.0f, 7.0f, -0.5f, 0.25f,  // row 0: column 1 an outlier
                                2.0f, 0.1f, -1.0f, 0.3f};  // row 1: column 1 kept in full too
  // Row scales: absmax over non-outlier elements (row 0: 1.0, row 1: 2.0; 0.1 counts though its
  // column is an outlier column); x' = rint(x * 127 / a) * a / 127, ties to even.
  const std::vector<float> wantX = {1.0f, 7.0f, -64.0f / 127,     32.0f / 127,
                                    2.0f, 0.1f, -64.0f * 2 / 127, 19.0f * 2 / 127};
  expectGemm(w, x, 2, 4, 2, wantW, wantX);

  // The threshold itself is an outlier (|x| >= 6), and a row whose only non-zero is an outlier
  // has scale 0: its other elements become 0.
  const std::vector<float> x2 = {-6.0f, 0.0f, 0.0f, 0.0f, 3.0f, 0.5f, 1.5f, -0.75f};
  const std::vector<float> want2 = {
      -6.0f, 0, 0, 0, 3.0f, 21.0f * 3 / 127, 64.0f * 3 / 127, -32.0f * 3 / 127};
  // Row 1: 0.5 * 127 / 3 = 21.17 -> 21; 1.5 * 127 / 3 = 63.5 -> 64 (even); -31.75 -> -32.
  expectGemm(w, x2, 2, 4, 2, wantW, want2);
}

TEST(QuantGemmReference, Fp8WeightsAndActivations) {
  // e4m3 codes: 0x38 = 1, 0x7e = 448, 0x01 = 2^-9, 0xb0 = -0.5; per-output scales.
  const std::vector<uint8_t> codes = {0x38, 0x7e, 0x01, 0xb0};
  const std::vector<float> scales = {0.5f, 1.0f / 448};
  QuantWeight w{
      .code = QuantCode::kFp8E4M3, .packed = codes.data(), .scales = scales.data(), .groupSize = 2};
  const std::vector<float> wantW = {0.5f, 224.0f, std::ldexp(1.0f, -9) / 448, -0.5f / 448};
  const std::vector<float> x = {1.0f, -3.5f, 0.3f, 7.0f};
  expectGemm(w, x, 2, 2, 2, wantW, x);  // kNone: activations as they are

  // Dynamic: s = absmax / 448 = 7 / 448 = 1/64; x / s = 64, -224, 19.2 -> 20 (spacing 2), 448.
  w.act = ActQuant::kFp8;
  expectGemm(w, x, 2, 2, 2, wantW, {1.0f, -3.5f, 20.0f / 64, 7.0f});
  // Static scale 0.5: 0.3 / 0.5 = 0.6 -> 0.625 (spacing 1/16); 300 / 0.5 saturates at 448.
  const float half = 0.5f;
  w.inputScale = &half;
  expectGemm(w, {1.0f, -3.5f, 0.3f, 300.0f}, 2, 2, 2, wantW, {1.0f, -3.5f, 0.3125f, 224.0f});
  // All zeros: scale 1, zeros stay zeros.
  w.inputScale = nullptr;
  expectGemm(w, {0, 0, 0, 0}, 2, 2, 2, wantW, {0, 0, 0, 0});
  // fp8 activations need fp8 weights.
  QuantWeight bad = w;
  bad.code = QuantCode::kUint8;
  std::vector<uint8_t> z = {0, 0};
  bad.zeros = z.data();
  EXPECT_FALSE(kernels::validateQuantGemm(
                   {.x = x.data(), .w = bad, .y = nullptr, .rows = 0, .in = 2, .out = 2})
                   .ok());
}

// ---- fp8.h --------------------------------------------------------------------------------------

TEST(Fp8, E4M3EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    const float f = kernels::fp8E4M3ToFloat(code);
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(f)) << c;
      EXPECT_EQ(kernels::floatToFp8E4M3(f), 0x7f);
      continue;
    }
    EXPECT_EQ(kernels::floatToFp8E4M3(f), code) << "code " << c << " value " << f;
  }
}

TEST(Fp8, E5M2EveryFiniteCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    const float f = kernels::fp8E5M2ToFloat(code);
    if ((c & 0x7c) == 0x7c) {  // exponent all ones: infinities (mantissa 0) and NaNs
      EXPECT_EQ(std::isinf(f), (c & 3) == 0) << c;
      EXPECT_EQ(std::isnan(f), (c & 3) != 0) << c;
      continue;
    }
    EXPECT_EQ(kernels::floatToFp8E5M2(f), code) << "code " << c << " value " << f;
  }
}

TEST(Fp8, E4M3KnownValues) {
  using kernels::floatToFp8E4M3;
  EXPECT_EQ(floatToFp8E4M3(448.0f), 0x7e);
  EXPECT_EQ(kernels::fp8E4M3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(kernels::kFp8E4M3Max, 448.0f);
  EXPECT_EQ(floatToFp8E4M3(0.5f), 0x30);  // 2^-1: biased exponent 6
  EXPECT_EQ(floatToFp8E4M3(1.0f), 0x38);
  EXPECT_EQ(floatToFp8E4M3(-2.0f), 0xc0);
  EXPECT_EQ(floatToFp8E4M3(0.0f), 0x00);
  EXPECT_EQ(floatToFp8E4M3(-0.0f), 0x80);
  // Subnormals: m * 2^-9.
  EXPECT_EQ(floatToFp8E4M3(std::ldexp(1.0f, -9)), 0x01);
  EXPECT_EQ(floatToFp8E4M3(std::ldexp(7.0f, -9)), 0x07);
  EXPECT_EQ(floatToFp8E4M3(std::ldexp(1.0f, -6)), 0x08);  // the smallest normal
  EXPECT_EQ(kernels::fp8E4M3ToFloat(0x03), std::ldexp(3.0f, -9));
  // Ties to even: 1.0625 between 1 (0x38) and 1.125 (0x39) -> 0x38; 1.1875 -> 1.25 (0x3a).
  EXPECT_EQ(floatToFp8E4M3(1.0625f), 0x38);
  EXPECT_EQ(floatToFp8E4M3(1.1875f), 0x3a);
  EXPECT_EQ(floatToFp8E4M3(std::nextafter(1.0625f, 2.0f)), 0x39);
  // Subnormal ties: 2^-10 -> 0, 3 * 2^-10 -> 2 * 2^-9.
  EXPECT_EQ(floatToFp8E4M3(std::ldexp(1.0f, -10)), 0x00);
  EXPECT_EQ(floatToFp8E4M3(std::ldexp(3.0f, -10)), 0x02);
  EXPECT_EQ(floatToFp8E4M3(std::ldexp(1.0f, -12)), 0x00);
  // Saturation: beyond 448 (480 would be the next step), infinities, huge values.
  EXPECT_EQ(floatToFp8E4M3(449.0f), 0x7e);
  EXPECT_EQ(floatToFp8E4M3(464.0f), 0x7e);
  EXPECT_EQ(floatToFp8E4M3(1e30f), 0x7e);
  EXPECT_EQ(floatToFp8E4M3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(floatToFp8E4M3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(floatToFp8E4M3(-1000.0f), 0xfe);
  // NaN.
  EXPECT_EQ(floatToFp8E4M3(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_TRUE(std::isnan(kernels::fp8E4M3ToFloat(0xff)));
}

TEST(Fp8, E5M2KnownValues) {
  using kernels::floatToFp8E5M2;
  EXPECT_EQ(floatToFp8E5M2(57344.0f), 0x7b);
  EXPECT_EQ(kernels::fp8E5M2ToFloat(0x7b), kernels::kFp8E5M2Max);
  EXPECT_EQ(floatToFp8E5M2(1.0f), 0x3c);
  EXPECT_EQ(floatToFp8E5M2(0.5f), 0x38);
  EXPECT_EQ(floatToFp8E5M2(std::ldexp(1.0f, -16)), 0x01);  // the smallest subnormal
  EXPECT_EQ(floatToFp8E5M2(1.125f), 0x3c);                 // tie between 1 and 1.25 -> even
  EXPECT_EQ(floatToFp8E5M2(1.375f), 0x3e);                 // tie between 1.25 and 1.5 -> 1.5
  EXPECT_EQ(floatToFp8E5M2(1e9f), 0x7b);                   // saturating, not infinity
  EXPECT_EQ(floatToFp8E5M2(-std::numeric_limits<float>::infinity()), 0xfb);
  EXPECT_TRUE(std::isnan(kernels::fp8E5M2ToFloat(floatToFp8E5M2(NAN))));
  EXPECT_EQ(kernels::fp8E5M2ToFloat(0xfc), -std::numeric_limits<float>::infinity());
}

// ---- load-time quantizers -----------------------------------------------------------------------

TEST(QuantizeBnb4, Nf4NearestCodeAndAbsmax) {
  std::vector<float> w(64, 0.0f);  // one block of 64, absmax 2
  w[0] = 2.0f;                     // 1 -> code 15
  w[1] = -2.0f;                    // -1 -> code 0
  w[2] = 0.0f;                     // 0 -> code 7
  w[3] = 1.0f;                     // 0.5: below the midpoint of 0.4407 and 0.5626 -> 12
  w[4] = 1.02f;                    // 0.51: above it -> 13
  w[5] = -0.1f;                    // -0.05: between -0.0911 and 0: midpoint -0.0455 -> 6
  auto q = quantizeBnb4(w.data(), 1, 64, QuantCode::kNf4);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->groupSize, 64);
  EXPECT_EQ(q->groups, 1);
  ASSERT_EQ(q->scales.size(), 1u);
  EXPECT_EQ(q->scales[0], 2.0f);
  EXPECT_EQ(q->codes[0], 15);
  EXPECT_EQ(q->codes[1], 0);
  EXPECT_EQ(q->codes[2], 7);
  EXPECT_EQ(q->codes[3], 12);
  EXPECT_EQ(q->codes[4], 13);
  EXPECT_EQ(q->codes[5], 6);
  const Tensor d = dequantize(*q, DType::kF32);
  EXPECT_FLOAT_EQ(d.f32()[3], kNf4[12] * 2.0f);
  EXPECT_TRUE(validate(*q, "nf4").ok());
}

TEST(QuantizeBnb4, Fp4Codes) {
  // x = w / absmax (absmax 1): 1 -> 3, -1 -> 11, 0.3 -> 1/3 (4), 0.2 -> 1/6 (6), 0.001 -> 0,
  // 0.004 -> 1/192 (1), -0.45 -> -0.5 (13), 0.6 -> 2/3 (2).
  const std::vector<float> w = {1.0f, -1.0f, 0.3f, 0.2f, 0.001f, 0.004f, -0.45f, 0.6f};
  auto q = quantizeBnb4(w.data(), 1, 8, QuantCode::kFp4);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->groupSize, 8);  // 64 does not divide 8: the largest even divisor below it
  EXPECT_EQ(q->codes, (std::vector<uint8_t>{3, 11, 4, 6, 0, 1, 13, 2}));
}

TEST(QuantizeBnb4, EveryValueTakesTheNearestCode) {
  // bitsandbytes' decision thresholds are the midpoints of each table: the dequantized value is
  // the nearest table value to w / absmax.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> w(4 * 64);
  for (float& v : w) v = u(rng) * u(rng);
  for (QuantCode code : {QuantCode::kNf4, QuantCode::kFp4}) {
    auto q = quantizeBnb4(w.data(), 4, 64, code);
    ASSERT_TRUE(q.ok());
    const float* table = code == QuantCode::kNf4 ? kNf4 : kFp4;
    for (int64_t k = 0; k < 4 * 64; ++k) {
      const float amax = q->scales[k / 64];
      const float x = w[k] / amax;
      float best = 2;
      for (int c = 0; c < 16; ++c) best = std::min(best, std::fabs(table[c] - x));
      EXPECT_LE(std::fabs(table[q->codes[k]] - x), best + 1e-6f)
          << kernels::toString(code) << " value " << k;
    }
  }
}

TEST(QuantizeBnb4, BlocksAndBadShapes) {
  std::vector<float> w(2 * 96, 0.5f);
  auto q = quantizeBnb4(w.data(), 2, 96, QuantCode::kNf4);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->groupSize, 48);  // 64 does not divide 96; 48 is the largest even divisor below
  EXPECT_EQ(q->groups, 2);
  // An all-zero block: scale 0, value 0.
  std::vector<float> zero(64, 0.0f);
  for (QuantCode code : {QuantCode::kNf4, QuantCode::kFp4}) {
    auto z = quantizeBnb4(zero.data(), 1, 64, code);
    ASSERT_TRUE(z.ok());
    const Tensor d = dequantize(*z, DType::kF32);
    for (int64_t k = 0; k < 64; ++k) EXPECT_EQ(d.f32()[k], 0.0f);
  }
  auto odd = quantizeBnb4(w.data(), 1, 5, QuantCode::kNf4);
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("odd"), std::string::npos) << odd.status();
}

TEST(QuantizeInt8Rowwise, SymmetricPerOutput) {
  const std::vector<float> w = {0.5f, -1.0f, 0.25f, 0.0f,   // absmax 1
                                0.0f, 0.0f,  0.0f,  0.0f};  // all zero
  for (ActQuant act : {ActQuant::kLlmInt8, ActQuant::kNone}) {
    const QuantizedTensor q = quantizeInt8Rowwise(w.data(), 2, 4, act);
    EXPECT_EQ(q.code, QuantCode::kUint8);
    EXPECT_EQ(q.act, act);
    EXPECT_EQ(q.groups, 1);
    EXPECT_EQ(q.zeros, (std::vector<uint8_t>{128, 128}));
    EXPECT_FLOAT_EQ(q.scales[0], 1.0f / 127);
    EXPECT_EQ(q.scales[1], 0.0f);
    // 63.5 -> 64 (ties to even), -127, 31.75 -> 32, 0; stored + 128.
    EXPECT_EQ(q.codes, (std::vector<uint8_t>{192, 1, 160, 128, 128, 128, 128, 128}));
    EXPECT_TRUE(validate(q, "int8").ok());
  }
}

// A checkpoint is input: NaN and infinite weights must not reach an undefined float-to-int
// conversion (UBSan in the sanitizer stage); their codes are 0 / the format's NaN, the other
// rows unharmed.
TEST(QuantizeNonFinite, WeightsGiveDefinedCodes) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> w(2 * 64, 0.25f);
  w[3] = nan;
  w[5] = inf;
  w[64] = 1.0f;
  const QuantizedTensor i8 = quantizeInt8Rowwise(w.data(), 2, 64, ActQuant::kNone);
  ASSERT_EQ(i8.codes.size(), w.size());
  EXPECT_EQ(i8.codes[3], 128);         // NaN -> 0
  EXPECT_EQ(i8.codes[64], 128 + 127);  // row 1 unharmed: 1.0 is its absmax
  EXPECT_FLOAT_EQ(i8.scales[1], 1.0f / 127.0f);
  auto nf4 = quantizeBnb4(w.data(), 2, 64, kernels::QuantCode::kNf4);
  ASSERT_TRUE(nf4.ok()) << nf4.status();
  EXPECT_EQ(nf4->codes[64], 15);  // row 1: 1.0 / absmax 1.0 is the top code
  const QuantizedTensor f8 = quantizeFp8PerTensor(w.data(), 2, 64);
  EXPECT_EQ(f8.codes.size(), w.size());
}

TEST(QuantizeFp8PerTensor, OneScaleAsTgi) {
  // absmax 2: w * 224 -> 448 (0x7e), -224 (0xf6), 2.24 -> 2.25 (0x41), 112 (0x6e).
  const std::vector<float> w = {2.0f, -1.0f, 0.01f, 0.5f};
  const QuantizedTensor q = quantizeFp8PerTensor(w.data(), 2, 2);
  EXPECT_EQ(q.code, QuantCode::kFp8E4M3);
  EXPECT_EQ(q.act, ActQuant::kFp8);
  EXPECT_TRUE(q.perTensorScale);
  EXPECT_EQ(q.codes, (std::vector<uint8_t>{0x7e, 0xf6, 0x41, 0x6e}));
  ASSERT_EQ(q.scales.size(), 2u);
  EXPECT_FLOAT_EQ(q.scales[0], 1.0f / 224);
  EXPECT_EQ(q.scales[1], q.scales[0]);
  const Tensor d = dequantize(q, DType::kF32);
  EXPECT_FLOAT_EQ(d.f32()[0], 2.0f);
  EXPECT_FLOAT_EQ(d.f32()[1], -1.0f);
  EXPECT_FLOAT_EQ(d.f32()[2], 2.25f / 224);
  EXPECT_FLOAT_EQ(d.f32()[3], 0.5f);
  const PackedQuantized p = pack(q);
  ASSERT_TRUE(p.tensorScale.has_value());
  EXPECT_EQ(*p.tensorScale, q.scales[0]);
}

// ---- pack, takeColumns, stackOutputs ------------------------------------------------------------

// A 4-bit GPT-Q-like tensor [out 3, in 8] with zero points and the given input groups.
QuantizedTensor actOrderTensor(const std::vector<int32_t>& gIdx, int32_t groups) {
  QuantizedTensor q;
  q.code = QuantCode::kUint4;
  q.out = 3;
  q.in = 8;
  q.groupSize = 8 / groups;
  q.groups = groups;
  q.gIdx = gIdx;
  for (int64_t k = 0; k < q.out * q.in; ++k)
    q.codes.push_back(static_cast<uint8_t>((5 * k + 3) % 16));
  for (int64_t k = 0; k < q.out * groups; ++k) {
    q.scales.push_back(0.25f * static_cast<float>(k + 1));
    q.zeros.push_back(static_cast<uint8_t>((3 * k) % 16));
  }
  return q;
}

std::vector<float> packedDense(const PackedQuantized& p) {
  const QuantWeight w{.code = p.code,
                      .packed = p.packed.data(),
                      .scales = p.scales.data(),
                      .zeros = p.zeros.empty() ? nullptr : p.zeros.data(),
                      .groupSize = p.groupSize,
                      .perm = p.perm.empty() ? nullptr : p.perm.data()};
  std::vector<float> d(static_cast<size_t>(p.out * p.in));
  EXPECT_TRUE(kernels::dequantizeWeightReference(w, p.out, p.in, d.data()).ok());
  return d;
}

void expectSameMatrix(const std::vector<float>& got, const Tensor& want) {
  ASSERT_EQ(static_cast<int64_t>(got.size()), want.numel());
  for (int64_t k = 0; k < want.numel(); ++k) EXPECT_EQ(got[k], want.f32()[k]) << "element " << k;
}

TEST(Pack, ActOrderPermutationMakesGroupsContiguous) {
  const QuantizedTensor q = actOrderTensor({0, 1, 0, 1, 1, 0, 1, 0}, 2);
  ASSERT_TRUE(validate(q, "act-order").ok());
  const PackedQuantized p = pack(q);
  EXPECT_EQ(p.perm, (std::vector<int32_t>{0, 2, 5, 7, 1, 3, 4, 6}));
  EXPECT_EQ(p.groupSize, 4);
  EXPECT_EQ(p.scales.size(), 3u * 2);
  // Column 1 of output 0 holds input 2's code, in the high nibble of byte 0.
  EXPECT_EQ(p.packed[0] >> 4, q.codes[2]);
  expectSameMatrix(packedDense(p), dequantize(q, DType::kF32));
}

TEST(Pack, UnequalRunsTakeTheirCommonDivisor) {
  // Group 0 holds 4 inputs, groups 1 and 2 two each: runtime groups of 2 (scales repeated).
  const QuantizedTensor q = actOrderTensor({1, 0, 0, 1, 2, 2, 0, 0}, 3);
  const PackedQuantized p = pack(q);
  EXPECT_EQ(p.groupSize, 2);
  EXPECT_EQ(p.perm, (std::vector<int32_t>{1, 2, 6, 7, 0, 3, 4, 5}));
  EXPECT_EQ(p.scales.size(), 3u * 4);
  expectSameMatrix(packedDense(p), dequantize(q, DType::kF32));
  // Contiguous groups need no permutation, even with g_idx given.
  const QuantizedTensor sorted = actOrderTensor({0, 0, 0, 0, 1, 1, 2, 2}, 3);
  const PackedQuantized ps = pack(sorted);
  EXPECT_TRUE(ps.perm.empty());
  EXPECT_EQ(ps.groupSize, 2);
  expectSameMatrix(packedDense(ps), dequantize(sorted, DType::kF32));
}

TEST(TakeColumns, ActOrderCarriesGroupIndex) {
  const QuantizedTensor q = actOrderTensor({0, 1, 0, 1, 1, 0, 1, 0}, 2);
  const QuantizedTensor r = takeColumns(q, 4, 4);  // a row-parallel rank's half of the inputs
  ASSERT_TRUE(validate(r, "slice").ok());
  EXPECT_EQ(r.in, 4);
  EXPECT_EQ(r.groups, 2);  // every group kept
  EXPECT_EQ(r.gIdx, (std::vector<int32_t>{1, 0, 1, 0}));
  EXPECT_EQ(r.scales, q.scales);
  const Tensor full = dequantize(q, DType::kF32), half = dequantize(r, DType::kF32);
  for (int64_t o = 0; o < 3; ++o)
    for (int64_t i = 0; i < 4; ++i)
      EXPECT_EQ(half.f32()[o * 4 + i], full.f32()[o * 8 + 4 + i]) << o << ", " << i;
  // Its packed layout dequantizes the same.
  expectSameMatrix(packedDense(pack(r)), half);
}

TEST(TakeColumns, AlignedGroupsKeepTheirScalesOnly) {
  QuantizedTensor q = actOrderTensor({}, 2);  // groups of 4 inputs, no g_idx
  const QuantizedTensor r = takeColumns(q, 4, 4);
  EXPECT_TRUE(r.gIdx.empty());
  EXPECT_EQ(r.groups, 1);
  EXPECT_EQ(r.scales, (std::vector<float>{q.scales[1], q.scales[3], q.scales[5]}));
  const Tensor full = dequantize(q, DType::kF32), half = dequantize(r, DType::kF32);
  for (int64_t o = 0; o < 3; ++o)
    for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(half.f32()[o * 4 + i], full.f32()[o * 8 + 4 + i]);
}

TEST(StackOutputs, RefusesMismatchedParts) {
  const QuantizedTensor a = actOrderTensor({0, 1, 0, 1, 1, 0, 1, 0}, 2);
  auto expectRefused = [&](QuantizedTensor b, const char* what) {
    auto s = stackOutputs({a, std::move(b)});
    ASSERT_FALSE(s.ok()) << what;
    EXPECT_NE(s.status().message().find("differ"), std::string::npos) << s.status();
  };
  QuantizedTensor b = a;
  b.code = QuantCode::kUint8;
  expectRefused(b, "code");
  b = a;
  b.act = ActQuant::kLlmInt8;
  expectRefused(b, "activations");
  b = a;
  b.gIdx = {0, 0, 0, 0, 1, 1, 1, 1};
  expectRefused(b, "g_idx");
  b = a;
  b.threshold = 5.0f;
  expectRefused(b, "threshold");
  b = a;
  b.inputScale = 0.5f;
  expectRefused(b, "input scale");
  expectRefused(takeColumns(a, 0, 4), "inputs");
  const QuantizedTensor c = actOrderTensor({}, 2), d = actOrderTensor({}, 4);
  EXPECT_FALSE(stackOutputs({c, d}).ok()) << "group size";
  EXPECT_FALSE(stackOutputs({}).ok());
  // Matching parts stack along the outputs.
  auto s = stackOutputs({a, a});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->out, 6);
  ASSERT_TRUE(validate(*s, "stacked").ok());
  const Tensor one = dequantize(a, DType::kF32), two = dequantize(*s, DType::kF32);
  for (int64_t k = 0; k < one.numel(); ++k) {
    EXPECT_EQ(two.f32()[k], one.f32()[k]);
    EXPECT_EQ(two.f32()[one.numel() + k], one.f32()[k]);
  }
  // fp8 parts keep one tensor scale only when they share it.
  const std::vector<float> w1 = {1, 2}, w2 = {4, 1};
  auto same =
      stackOutputs({quantizeFp8PerTensor(w1.data(), 1, 2), quantizeFp8PerTensor(w1.data(), 1, 2)});
  ASSERT_TRUE(same.ok());
  EXPECT_TRUE(same->perTensorScale);
  auto differ =
      stackOutputs({quantizeFp8PerTensor(w1.data(), 1, 2), quantizeFp8PerTensor(w2.data(), 1, 2)});
  ASSERT_TRUE(differ.ok());
  EXPECT_FALSE(differ->perTensorScale);
  EXPECT_FLOAT_EQ(differ->scales[0], 2.0f / 448);
  EXPECT_FLOAT_EQ(differ->scales[1], 4.0f / 448);
}

// Static fp8 input scales of stacked parts (a checkpoint's q/k/v, gate/up): the largest, as TGI's
// and vLLM's loaders take it; a part without one beside a part with one is refused.
TEST(StackOutputs, Fp8StaticInputScalesTakeTheLargest) {
  const std::vector<float> w = {1, 2};
  QuantizedTensor a = quantizeFp8PerTensor(w.data(), 1, 2), b = a, c = a;
  a.inputScale = 0.5f;
  b.inputScale = 0.75f;
  c.inputScale = 0.25f;
  auto s = stackOutputs({a, b, c});
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(s->inputScale.has_value());
  EXPECT_EQ(*s->inputScale, 0.75f);
  EXPECT_EQ(pack(*s).inputScale, 0.75f);
  QuantizedTensor none = a;
  none.inputScale.reset();
  EXPECT_FALSE(stackOutputs({a, none}).ok());
  EXPECT_FALSE(stackOutputs({none, a}).ok());
}

// One group over all inputs (fp8, GPT-Q group_size -1) stays one group over a row-parallel slice:
// the scales per output unchanged, no group index.
TEST(TakeColumns, OneGroupStaysOneGroup) {
  const std::vector<float> w = {1, -2, 3, -4, 5, -6, 7, -8};
  const QuantizedTensor q = quantizeFp8PerTensor(w.data(), 2, 4);
  const QuantizedTensor r = takeColumns(q, 2, 2);
  EXPECT_TRUE(r.gIdx.empty());
  EXPECT_EQ(r.groups, 1);
  EXPECT_EQ(r.groupSize, 2);
  EXPECT_EQ(r.scales, q.scales);
  EXPECT_TRUE(r.perTensorScale);
  ASSERT_TRUE(validate(r, "slice").ok());
  const Tensor whole = dequantize(q, DType::kF32), part = dequantize(r, DType::kF32);
  for (int64_t o = 0; o < 2; ++o)
    for (int64_t j = 0; j < 2; ++j) EXPECT_EQ(part.f32()[o * 2 + j], whole.f32()[o * 4 + 2 + j]);
}

// ---- the CPU backend ----------------------------------------------------------------------------

TEST(CpuBackendLinear, QuantizedLinearWithBias) {
  auto backend = makeCpuBackend(1);
  const QuantizedTensor q = actOrderTensor({0, 1, 0, 1, 1, 0, 1, 0}, 2);
  const PackedQuantized p = pack(q);
  auto put = [&](const void* data, size_t bytes) {
    auto b = backend->allocate(bytes);
    EXPECT_TRUE(b.ok());
    EXPECT_TRUE(backend->upload(**b, data, bytes).ok());
    return std::move(*b);
  };
  Linear l;
  l.format = WeightFormat::kQuantized;
  l.in = 8;
  l.out = 3;
  l.owned = put(p.packed.data(), p.packed.size());
  l.weight = l.owned.get();
  l.scales = put(p.scales.data(), p.scales.size() * 4);
  l.zeros = put(p.zeros.data(), p.zeros.size());
  l.perm = put(p.perm.data(), p.perm.size() * 4);
  const std::vector<float> bias = {1, -2, 0.5f};
  l.bias = put(bias.data(), bias.size() * 4);
  l.quant = {.code = p.code,
             .packed = l.owned->data(),
             .scales = l.scales->as<float>(),
             .zeros = l.zeros->as<uint8_t>(),
             .groupSize = p.groupSize,
             .perm = l.perm->as<int32_t>()};
  std::vector<float> x(2 * 8);
  for (size_t k = 0; k < x.size(); ++k) x[k] = 0.5f * static_cast<float>(k) - 3.0f;
  auto xb = put(x.data(), x.size() * 4);
  auto yb = put(std::vector<float>(6).data(), 24);
  ASSERT_TRUE(backend->linear(l, xb->data(), yb->data(), 2).ok());
  const Tensor w = dequantize(q, DType::kF32);
  const std::vector<float> want = denseGemm(x, std::vector<float>(w.f32(), w.f32() + 24), 2, 8, 3);
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t o = 0; o < 3; ++o)
      EXPECT_NEAR(yb->as<float>()[r * 3 + o], want[r * 3 + o] + bias[o], 1e-4f) << r << ", " << o;
  // Codes shorter than the shape are refused.
  l.in = 16;
  EXPECT_FALSE(backend->linear(l, xb->data(), yb->data(), 1).ok());
}

// ---- a model under each --quantize format -------------------------------------------------------

// The model directories: a reference fixture, or the bundled demo model (models/demo, three
// levels above the fixtures in the source tree).
std::string modelDir(const std::string& name) {
  const char* env = std::getenv("TEXTGEN_MODEL_FIXTURES");
  const std::string fixtures = env && *env ? env : TEXTGEN_MODEL_FIXTURES;
  return name == "demo" ? fixtures + "/../../../models/demo" : fixtures + "/" + name;
}

// Logits of the last `rows` positions of one forward over `tokens` from position 0.
std::vector<float> lastLogits(Model& model, Backend& backend, const std::vector<uint32_t>& tokens,
                              int64_t rows) {
  constexpr int64_t kBlock = 16;
  const auto n = static_cast<int64_t>(tokens.size());
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  auto cache = KvCache::create(backend, model.kvShape(), blocks, kBlock);
  EXPECT_TRUE(cache.ok());
  if (!cache.ok()) return {};
  std::vector<uint32_t> table(static_cast<size_t>(blocks));
  for (int64_t b = 0; b < blocks; ++b) table[b] = static_cast<uint32_t>(b);
  ForwardBatch fb;
  fb.tokenIds = tokens;
  for (int64_t p = 0; p < n; ++p) fb.slots.push_back(static_cast<uint32_t>(p));
  fb.sequences.push_back({.firstRow = 0, .numRows = n, .startPos = 0, .blocks = table});
  for (int64_t r = n - rows; r < n; ++r) fb.logitRows.push_back(r);
  auto l = model.forward(fb, **cache);
  EXPECT_TRUE(l.ok()) << l.status();
  return l.ok() ? *l : std::vector<float>();
}

// Greedy decoding of `steps` tokens after the prompt through the KV cache.
std::vector<uint32_t> greedy(Model& model, Backend& backend, const std::vector<uint32_t>& prompt,
                             size_t steps) {
  constexpr int64_t kBlock = 16;
  const auto blocks = static_cast<int64_t>((prompt.size() + steps + kBlock - 1) / kBlock);
  auto cache = KvCache::create(backend, model.kvShape(), blocks, kBlock);
  EXPECT_TRUE(cache.ok());
  if (!cache.ok()) return {};
  std::vector<uint32_t> table(static_cast<size_t>(blocks)), out, pending = prompt;
  for (int64_t b = 0; b < blocks; ++b) table[b] = static_cast<uint32_t>(b);
  int64_t cached = 0;
  for (size_t s = 0; s < steps; ++s) {
    ForwardBatch fb;
    fb.tokenIds = pending;
    const auto n = static_cast<int64_t>(pending.size());
    for (int64_t p = cached; p < cached + n; ++p) fb.slots.push_back(static_cast<uint32_t>(p));
    fb.sequences.push_back({.firstRow = 0, .numRows = n, .startPos = cached, .blocks = table});
    fb.logitRows.push_back(n - 1);
    auto logits = model.forward(fb, **cache);
    EXPECT_TRUE(logits.ok()) << logits.status();
    if (!logits.ok()) return out;
    cached += n;
    out.push_back(
        static_cast<uint32_t>(std::max_element(logits->begin(), logits->end()) - logits->begin()));
    pending = {out.back()};
  }
  return out;
}

// What a format is held to on a model: the RMS of its logit error relative to the dense logits'
// spread (their standard deviation), and how many of kSteps teacher-forced next-token choices
// must agree with the dense model's. The bounds are about twice what was measured (below), so that
// a broken layout (a wrong scale, a misplaced nibble or group: errors of the order of the spread
// itself) fails while BLAS summation order on another CPU does not.
struct ModelCase {
  const char* model;
  LoadQuantization q;
  double rmsBound;  // of |logit error| / spread
  size_t minTop1;   // of kSteps
};

constexpr size_t kSteps = 16;

class QuantizedModelTest : public ::testing::TestWithParam<ModelCase> {};

// A model loaded under a --quantize format on the CPU backend: every linear layer but the head is a
// quantized Linear, it runs, its logits are close to the dense ones (teacher-forced on the dense
// run's greedy tokens, so both see the same inputs), and its greedy tokens equal the dense ones
// until a first divergence that only a near-tie explains: there the dense run's top-1/top-2 gap is
// within twice the largest logit error measured, and the quantized choice is in its top 5.
TEST_P(QuantizedModelTest, StaysCloseToDense) {
  const ModelCase c = GetParam();
  const std::string dir = modelDir(c.model);
  std::vector<uint32_t> prompt;
  if (std::string(c.model) == "demo") {
    auto tok = tokenizer::Tokenizer::fromDirectory(dir);
    ASSERT_TRUE(tok.ok()) << tok.status();
    auto e = (*tok)->encode("The Python interpreter");
    ASSERT_TRUE(e.ok());
    prompt = e->ids;
  } else {
    std::ifstream in(dir + "/reference.json");
    ASSERT_TRUE(in) << dir;
    prompt = nlohmann::json::parse(in)["prompts"][0]["input_ids"].get<std::vector<uint32_t>>();
  }
  auto backend = makeCpuBackend(1);
  auto dense = loadModel(dir, *backend);
  ASSERT_TRUE(dense.ok()) << dense.status();
  ModelOptions options;
  options.quantize = c.q;
  auto quant = loadModel(dir, *backend, options);
  ASSERT_TRUE(quant.ok()) << quant.status();
  const std::vector<uint32_t> d = greedy(**dense, *backend, prompt, kSteps);
  const std::vector<uint32_t> q = greedy(**quant, *backend, prompt, kSteps);
  ASSERT_EQ(d.size(), kSteps);
  ASSERT_EQ(q.size(), kSteps);
  std::vector<uint32_t> forced = prompt;
  forced.insert(forced.end(), d.begin(), d.end() - 1);
  const std::vector<float> want = lastLogits(**dense, *backend, forced, kSteps);
  const std::vector<float> got = lastLogits(**quant, *backend, forced, kSteps);
  const int64_t vocab = (*dense)->config().vocabSize;
  ASSERT_EQ(want.size(), kSteps * static_cast<size_t>(vocab));
  ASSERT_EQ(got.size(), want.size());

  double maxErr = 0, sq = 0, mean = 0, var = 0;
  for (float v : want) mean += v;
  mean /= static_cast<double>(want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    ASSERT_TRUE(std::isfinite(got[k])) << "logit " << k;
    var += (want[k] - mean) * (want[k] - mean);
    const double e = std::fabs(got[k] - want[k]);
    maxErr = std::max(maxErr, e);
    sq += e * e;
  }
  const double spread = std::sqrt(var / static_cast<double>(want.size()));
  const double rms = std::sqrt(sq / static_cast<double>(want.size())) / spread;
  RecordProperty("rms_logit_error_over_spread", std::to_string(rms));
  EXPECT_GT(maxErr, 0.0) << "quantizing changed nothing: is the format applied?";
  EXPECT_LE(rms, c.rmsBound) << "max logit error " << maxErr << ", spread " << spread;

  auto top = [&](size_t s, size_t k) {  // the dense model's k best tokens at step s
    std::vector<uint32_t> ids(static_cast<size_t>(vocab));
    std::iota(ids.begin(), ids.end(), 0u);
    const float* w = want.data() + s * vocab;
    std::partial_sort(ids.begin(), ids.begin() + static_cast<int64_t>(k), ids.end(),
                      [&](uint32_t a, uint32_t b) { return w[a] > w[b]; });
    ids.resize(k);
    return ids;
  };
  size_t top1 = 0;
  for (size_t s = 0; s < kSteps; ++s) {
    const float* g = got.data() + s * vocab;
    top1 += static_cast<uint32_t>(std::max_element(g, g + vocab) - g) == top(s, 1)[0];
  }
  RecordProperty("teacher_forced_top1", std::to_string(top1));
  EXPECT_GE(top1, c.minTop1);

  size_t s = 0;
  while (s < kSteps && q[s] == d[s]) ++s;
  RecordProperty("greedy_equal", std::to_string(s));
  if (s == kSteps) return;
  const std::vector<uint32_t> best = top(s, 5);
  const float* w = want.data() + s * vocab;
  EXPECT_LE(w[best[0]] - w[best[1]], 2 * maxErr)
      << "greedy token " << s << " differs (" << q[s] << " vs " << d[s]
      << ") where the dense top-2 gap is larger than the quantization's logit error";
  EXPECT_NE(std::find(best.begin(), best.end(), q[s]), best.end())
      << "greedy token " << s << " (" << q[s] << ") is not in the dense top 5";
}

// Measured on this machine (rms error / spread, teacher-forced top-1 of 16, greedy tokens equal):
//   demo (trained):     bitsandbytes 0.016, 15, 12; eetq 0.007, 15, 12; fp8 0.038, 15, 2;
//                       nf4 0.087, 13, 1; fp4 0.117, 13, 3.
//   llama-gqa (random): bitsandbytes 0.043, 16, 16; eetq 0.032, 16, 16; fp8 0.181, 14, 1;
//                       nf4 0.450, 4, 1; fp4 0.552, 4, 0.
// Random weights have no margin between their logits (the fixture's top-2 gaps are ~0.07 of a
// spread of 1.5) and no structure that rounding preserves, so 4-bit codes move them by about half
// their spread: there the fixture checks that the layout runs and stays finite, and the quality
// claim rests on the trained demo model (and on perplexity: docs/quantization.md).
INSTANTIATE_TEST_SUITE_P(
    EachFormat, QuantizedModelTest,
    ::testing::Values(ModelCase{"demo", LoadQuantization::kBitsandbytes, 0.035, 13},
                      ModelCase{"demo", LoadQuantization::kEetq, 0.02, 13},
                      ModelCase{"demo", LoadQuantization::kFp8, 0.08, 13},
                      ModelCase{"demo", LoadQuantization::kBitsandbytesNf4, 0.18, 10},
                      ModelCase{"demo", LoadQuantization::kBitsandbytesFp4, 0.24, 10},
                      ModelCase{"llama-gqa", LoadQuantization::kBitsandbytes, 0.09, 14},
                      ModelCase{"llama-gqa", LoadQuantization::kEetq, 0.07, 14},
                      ModelCase{"llama-gqa", LoadQuantization::kFp8, 0.36, 10},
                      ModelCase{"llama-gqa", LoadQuantization::kBitsandbytesNf4, 1.0, 0},
                      ModelCase{"llama-gqa", LoadQuantization::kBitsandbytesFp4, 1.0, 0}),
    [](const auto& p) {
      std::string n = std::string(p.param.model) + "_" + std::string(toString(p.param.q));
      std::replace(n.begin(), n.end(), '-', '_');
      return n;
    });

}  // namespace
}  // namespace textgen::runtime
