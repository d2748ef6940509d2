// The loader's load-time quantizers (loader/load_quantizer.h: straight into the packed runtime
// layout, on every core) against pack() of the readable definitions in loader/quantized_tensor.h:
// the same bytes, scales and fields, bit for bit, over shapes that engage every thread and inputs
// that hit every decision boundary (zero blocks, NaN, infinities, outliers, fp8 ties and
// subnormals).
#include "loader/load_quantizer.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "loader/quantized_tensor.h"
#include "textgen/kernels/fp8.h"

namespace textgen::runtime {
namespace {

using kernels::ActQuant;
using kernels::QuantCode;

// Random weights with the values that matter to the decisions sprinkled in.
std::vector<float> weights(int64_t out, int64_t in, uint32_t seed, bool nonFinite) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> w(static_cast<size_t>(out * in));
  for (float& x : w) x = normal(rng);
  std::uniform_int_distribution<int64_t> pick(0, out * in - 1);
  for (int k = 0; k < 8 && out * in > 64; ++k) w[pick(rng)] *= 300.0f;  // outliers
  for (int k = 0; k < 4 && out * in > 64; ++k) w[pick(rng)] = 0.0f;
  if (in >= 64) std::fill_n(w.begin(), 64, 0.0f);      // an all-zero block (and int8 row start)
  if (out > 2) std::fill_n(w.begin() + in, in, 0.0f);  // an all-zero row
  if (nonFinite && out * in > 64) {
    w[pick(rng)] = std::numeric_limits<float>::quiet_NaN();
    w[pick(rng)] = std::numeric_limits<float>::infinity();
    w[pick(rng)] = -std::numeric_limits<float>::infinity();
  }
  return w;
}

bool sameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expectSamePacked(const PackedQuantized& fast, const PackedQuantized& ref) {
  EXPECT_EQ(fast.code, ref.code);
  EXPECT_EQ(fast.act, ref.act);
  EXPECT_EQ(fast.threshold, ref.threshold);
  EXPECT_EQ(fast.out, ref.out);
  EXPECT_EQ(fast.in, ref.in);
  EXPECT_EQ(fast.groupSize, ref.groupSize);
  ASSERT_EQ(fast.packed.size(), ref.packed.size());
  int64_t firstDiff = -1;
  for (size_t k = 0; k < ref.packed.size() && firstDiff < 0; ++k)
    if (fast.packed[k] != ref.packed[k]) firstDiff = static_cast<int64_t>(k);
  EXPECT_EQ(firstDiff, -1) << "packed byte " << firstDiff << ": "
                           << (firstDiff < 0 ? 0 : int{fast.packed[firstDiff]}) << " vs "
                           << (firstDiff < 0 ? 0 : int{ref.packed[firstDiff]});
  EXPECT_TRUE(sameBits(fast.scales, ref.scales));
  EXPECT_EQ(fast.zeros, ref.zeros);
  EXPECT_EQ(fast.perm, ref.perm);
  EXPECT_EQ(fast.inputScale, ref.inputScale);
  ASSERT_EQ(fast.tensorScale.has_value(), ref.tensorScale.has_value());
  if (ref.tensorScale) {
    EXPECT_EQ(std::bit_cast<uint32_t>(*fast.tensorScale),
              std::bit_cast<uint32_t>(*ref.tensorScale));
  }
}

struct Shape {
  int64_t out, in;
};
// Small and odd shapes, blocks below 64 (96 -> 48, 6 -> 6), and one large enough for every
// core's chunk.
const Shape kShapes[] = {{1, 2}, {3, 6}, {5, 64}, {7, 96}, {17, 128}, {33, 200}, {384, 2048}};

TEST(LoadQuantizer, Bnb4EqualsPackedReference) {
  for (QuantCode code : {QuantCode::kNf4, QuantCode::kFp4})
    for (const Shape& s : kShapes)
      for (bool nonFinite : {false, true}) {
        SCOPED_TRACE(testing::Message() << (code == QuantCode::kNf4 ? "nf4 " : "fp4 ") << s.out
                                        << "x" << s.in << (nonFinite ? " non-finite" : ""));
        const std::vector<float> w = weights(s.out, s.in, 1 + s.in, nonFinite);
        auto ref = quantizeBnb4(w.data(), s.out, s.in, code);
        auto fast = quantizeBnb4Packed(w.data(), s.out, s.in, code);
        ASSERT_TRUE(ref.ok() && fast.ok());
        expectSamePacked(*fast, pack(*ref));
      }
}

TEST(LoadQuantizer, Bnb4ValuesAtEveryThreshold) {
  // Every table value, midpoint and their float neighbours, as w / absmax (absmax 1 per block).
  std::vector<float> x;
  for (int c = 0; c < 16; ++c) {
    for (float t : {kernels::kNf4Table[c],
                    c < 15 ? 0.5f * (kernels::kNf4Table[c] + kernels::kNf4Table[c + 1]) : 1.0f})
      for (float v : {t, std::nextafter(t, -2.0f), std::nextafter(t, 2.0f)}) x.push_back(v);
  }
  for (float t :
       {0.00260417f, 0.0859375f, 0.20833333f, 0.29166667f, 0.4166667f, 0.583333f, 0.8333333f})
    for (float v : {t, std::nextafter(t, 0.0f), std::nextafter(t, 2.0f)}) {
      x.push_back(v);
      x.push_back(-v);
    }
  x.push_back(-0.0f);
  // Blocks of 64 with a leading 1 (absmax 1: the rest are the values themselves).
  std::vector<float> w;
  for (size_t k = 0; k < x.size(); k += 63) {
    w.push_back(1.0f);
    for (size_t j = k; j < k + 63; ++j) w.push_back(j < x.size() ? x[j] : 0.0f);
  }
  const int64_t out = static_cast<int64_t>(w.size()) / 64;
  for (QuantCode code : {QuantCode::kNf4, QuantCode::kFp4}) {
    auto ref = quantizeBnb4(w.data(), out, 64, code);
    auto fast = quantizeBnb4Packed(w.data(), out, 64, code);
    ASSERT_TRUE(ref.ok() && fast.ok());
    expectSamePacked(*fast, pack(*ref));
  }
}

TEST(LoadQuantizer, Bnb4RefusesOddInputs) {
  const std::vector<float> w(5, 1.0f);
  EXPECT_FALSE(quantizeBnb4Packed(w.data(), 1, 5, QuantCode::kNf4).ok());
}

TEST(LoadQuantizer, Int8EqualsPackedReference) {
  for (ActQuant act : {ActQuant::kLlmInt8, ActQuant::kNone})
    for (const Shape& s : kShapes)
      for (bool nonFinite : {false, true}) {
        SCOPED_TRACE(testing::Message()
                     << s.out << "x" << s.in << (nonFinite ? " non-finite" : ""));
        const std::vector<float> w = weights(s.out, s.in, 7 + s.in, nonFinite);
        expectSamePacked(quantizeInt8Packed(w.data(), s.out, s.in, act),
                         pack(quantizeInt8Rowwise(w.data(), s.out, s.in, act)));
      }
  // Ties: x * 127 / absmax exactly halfway between integers (absmax 127).
  std::vector<float> ties;
  for (int k = -127; k < 127; ++k) ties.push_back(static_cast<float>(k) + 0.5f);
  ties.push_back(127.0f);
  ties.push_back(-127.0f);
  const int64_t in = static_cast<int64_t>(ties.size());
  expectSamePacked(quantizeInt8Packed(ties.data(), 1, in, ActQuant::kNone),
                   pack(quantizeInt8Rowwise(ties.data(), 1, in, ActQuant::kNone)));
}

TEST(LoadQuantizer, Fp8EqualsPackedReference) {
  for (const Shape& s : kShapes)
    for (bool nonFinite : {false, true}) {
      SCOPED_TRACE(testing::Message() << s.out << "x" << s.in << (nonFinite ? " non-finite" : ""));
      const std::vector<float> w = weights(s.out, s.in, 11 + s.in, nonFinite);
      expectSamePacked(quantizeFp8Packed(w.data(), s.out, s.in),
                       pack(quantizeFp8PerTensor(w.data(), s.out, s.in)));
    }
  const std::vector<float> zeros(64, 0.0f);
  expectSamePacked(quantizeFp8Packed(zeros.data(), 2, 32),
                   pack(quantizeFp8PerTensor(zeros.data(), 2, 32)));
}

TEST(LoadQuantizer, Fp8EncodingEqualsReference) {
  auto expectSame = [](float f) {
    ASSERT_EQ(floatToFp8E4M3Fast(f), kernels::floatToFp8E4M3(f))
        << "f = " << f << " (bits 0x" << std::hex << std::bit_cast<uint32_t>(f) << ")";
  };
  // Every code's value, the midpoints to its neighbour (ties to even) and their float
  // neighbours, both signs, beyond the largest and in the subnormal range.
  for (int c = 0; c < 0x7f; ++c) {
    const float v = kernels::fp8E4M3ToFloat(static_cast<uint8_t>(c));
    const float next = c + 1 < 0x7f ? kernels::fp8E4M3ToFloat(static_cast<uint8_t>(c + 1)) : 480.0f;
    const float mid = 0.5f * (v + next);
    for (float x : {v, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f),
                    std::nextafter(v, 0.0f), std::nextafter(v, 1e9f)}) {
      expectSame(x);
      expectSame(-x);
    }
  }
  for (float x : {0.0f, -0.0f, 448.0f, 464.0f, 480.0f, 1e30f,
                  std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                  std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min()})
    expectSame(x);
  // A sweep over every bit pattern's neighbourhood.
  for (uint64_t u = 0; u <= 0xffffffffull; u += 1009)
    expectSame(std::bit_cast<float>(static_cast<uint32_t>(u)));
}

}  // namespace
}  // namespace textgen::runtime
