// Paged attention's CPU reference against a plain attention in double precision over contiguous
// keys: causal, grouped-query, with a sliding window, and with ALiBi written in BLOOM's form
// (slope * j) and MPT's (slope * (j - (seqLen - 1))), both softmax-equivalent to the kernel's
// slope * (j - i); and Falcon's bf16(slope * j) / divisor (the product rounded to bfloat16, which
// no relative form can do). Bad ALiBi slopes and divisors are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "textgen/kernels/half.h"
#include "textgen/kernels/paged_attention.h"

namespace textgen::kernels {
namespace {

enum class BiasForm { kNone, kBloom, kMpt, kFalcon };

// Falcon's divisor in these tests: sqrt(head_dim 16).
constexpr float kFalconDivisor = 4.0f;

struct Case {
  int64_t numSeqs = 2, heads = 4, kvHeads = 2, headDim = 16, blockSize = 4, window = 0;
  std::vector<int32_t> startPos{0, 5}, newRows{7, 3};
};

// The kernel's inputs, f32, with every sequence's positions in shuffled blocks.
struct Inputs {
  std::vector<float> q, k, v;  // q [rows, heads, headDim]; k, v [slots, kvHeads, headDim]
  std::vector<int32_t> seqStarts{0}, tables;
  int64_t rows = 0, maxBlocks = 0, maxNewRows = 0, maxContext = 0;
};

Inputs makeInputs(const Case& c, std::mt19937& rng) {
  Inputs in;
  for (int64_t s = 0; s < c.numSeqs; ++s) {
    in.rows += c.newRows[s];
    in.seqStarts.push_back(static_cast<int32_t>(in.rows));
    const int64_t ctx = c.startPos[s] + c.newRows[s];
    in.maxNewRows = std::max<int64_t>(in.maxNewRows, c.newRows[s]);
    in.maxContext = std::max(in.maxContext, ctx);
    in.maxBlocks = std::max(in.maxBlocks, (ctx + c.blockSize - 1) / c.blockSize);
  }
  const int64_t numBlocks = c.numSeqs * in.maxBlocks;
  in.tables.resize(numBlocks);
  std::iota(in.tables.begin(), in.tables.end(), 0);
  std::shuffle(in.tables.begin(), in.tables.end(), rng);
  std::normal_distribution<float> d(0.0f, 1.0f);
  in.q.resize(in.rows * c.heads * c.headDim);
  in.k.resize(numBlocks * c.blockSize * c.kvHeads * c.headDim);
  in.v.resize(in.k.size());
  for (auto* v : {&in.q, &in.k, &in.v})
    for (float& x : *v) x = d(rng);
  return in;
}

PagedAttentionParams paramsFor(const Case& c, const Inputs& in, std::vector<float>& out,
                               const float* slopes) {
  out.assign(in.rows * c.heads * c.headDim, 0.0f);
  return {.q = in.q.data(),
          .qRowStride = c.heads * c.headDim,
          .kCache = in.k.data(),
          .vCache = in.v.data(),
          .out = out.data(),
          .seqStarts = in.seqStarts.data(),
          .startPos = c.startPos.data(),
          .blockTables = in.tables.data(),
          .rows = in.rows,
          .numSeqs = c.numSeqs,
          .maxBlocksPerSeq = in.maxBlocks,
          .numHeads = c.heads,
          .numKvHeads = c.kvHeads,
          .headDim = c.headDim,
          .blockSize = c.blockSize,
          .slidingWindow = c.window,
          .scale = 1.0f / std::sqrt(static_cast<float>(c.headDim)),
          .alibiSlopes = slopes,
          .maxNewRows = in.maxNewRows,
          .maxContext = in.maxContext,
          .dtype = DType::kF32};
}

// Attention in double precision, keys gathered by position: softmax(q·k / sqrt(d) + bias) · v,
// the bias in the model's own form.
std::vector<float> naive(const Case& c, const Inputs& in, const std::vector<float>& slopes,
                         BiasForm form) {
  std::vector<float> out(in.rows * c.heads * c.headDim);
  const int64_t group = c.heads / c.kvHeads, d = c.headDim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (int64_t s = 0; s < c.numSeqs; ++s) {
    const int32_t* blocks = in.tables.data() + s * in.maxBlocks;
    const int64_t seqLen = c.startPos[s] + c.newRows[s];
    auto kvOffset = [&](int64_t j, int64_t kvh) {
      return ((int64_t{blocks[j / c.blockSize]} * c.blockSize + j % c.blockSize) * c.kvHeads +
              kvh) *
             d;
    };
    for (int64_t t = 0; t < c.newRows[s]; ++t) {
      const int64_t row = in.seqStarts[s] + t, i = c.startPos[s] + t;
      const int64_t lo = c.window > 0 ? std::max<int64_t>(0, i - c.window + 1) : 0;
      for (int64_t h = 0; h < c.heads; ++h) {
        std::vector<double> w(i + 1, 0.0);
        double maxW = -std::numeric_limits<double>::infinity();
        for (int64_t j = lo; j <= i; ++j) {
          double dot = 0.0;
          for (int64_t e = 0; e < d; ++e)
            dot += double{in.q[(row * c.heads + h) * d + e]} * in.k[kvOffset(j, h / group) + e];
          w[j] = dot * scale;
          if (form == BiasForm::kBloom) w[j] += slopes[h] * static_cast<double>(j);
          if (form == BiasForm::kMpt) w[j] += slopes[h] * static_cast<double>(j - (seqLen - 1));
          if (form == BiasForm::kFalcon) {
            const float product = bf16ToFloat(floatToBf16(slopes[h] * static_cast<float>(j)));
            w[j] += double{product} / kFalconDivisor;
          }
          maxW = std::max(maxW, w[j]);
        }
        double sum = 0.0;
        for (int64_t j = lo; j <= i; ++j) sum += (w[j] = std::exp(w[j] - maxW));
        for (int64_t e = 0; e < d; ++e) {
          double acc = 0.0;
          for (int64_t j = lo; j <= i; ++j) acc += w[j] * in.v[kvOffset(j, h / group) + e];
          out[(row * c.heads + h) * d + e] = static_cast<float>(acc / sum);
        }
      }
    }
  }
  return out;
}

void expectNear(const std::vector<float>& got, const std::vector<float>& want, float tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], tol) << "element " << i;
}

// BLOOM's slopes for 4 heads: 2^-2, 2^-4, 2^-6, 2^-8; steep ones make the bias dominate.
const std::vector<float> kSlopes4{0.25f, 0.0625f, 0.015625f, 0.00390625f};

TEST(PagedAttentionReferenceTest, MatchesPlainAttentionWithoutBias) {
  std::mt19937 rng(1);
  const Case c;
  const Inputs in = makeInputs(c, rng);
  std::vector<float> out;
  ASSERT_TRUE(pagedAttentionReference(paramsFor(c, in, out, nullptr)).ok());
  expectNear(out, naive(c, in, {}, BiasForm::kNone), 1e-5f);
}

TEST(PagedAttentionReferenceTest, AlibiMatchesBloomAndMptForms) {
  std::mt19937 rng(2);
  Case c;
  c.startPos = {0, 9};
  c.newRows = {12, 4};
  const Inputs in = makeInputs(c, rng);
  std::vector<float> out;
  ASSERT_TRUE(pagedAttentionReference(paramsFor(c, in, out, kSlopes4.data())).ok());
  expectNear(out, naive(c, in, kSlopes4, BiasForm::kBloom), 1e-5f);
  expectNear(out, naive(c, in, kSlopes4, BiasForm::kMpt), 1e-5f);
  // The bias changes the result (the test would pass vacuously otherwise).
  const std::vector<float> plain = naive(c, in, {}, BiasForm::kNone);
  float maxDiff = 0.0f;
  for (size_t i = 0; i < out.size(); ++i) maxDiff = std::max(maxDiff, std::fabs(out[i] - plain[i]));
  EXPECT_GT(maxDiff, 0.05f);
}

TEST(PagedAttentionReferenceTest, AlibiWithMqaAndSlidingWindow) {
  std::mt19937 rng(3);
  Case c;
  c.kvHeads = 1;
  c.window = 5;
  c.blockSize = 3;
  c.startPos = {4, 0};
  c.newRows = {6, 11};
  const Inputs in = makeInputs(c, rng);
  const std::vector<float> slopes{0.5f, 0.125f, 1.0f / 32, 1.0f / 128};
  std::vector<float> out;
  ASSERT_TRUE(pagedAttentionReference(paramsFor(c, in, out, slopes.data())).ok());
  expectNear(out, naive(c, in, slopes, BiasForm::kBloom), 1e-5f);
}

TEST(PagedAttentionReferenceTest, ZeroSlopesGiveTheUnbiasedResultExactly) {
  std::mt19937 rng(4);
  const Case c;
  const Inputs in = makeInputs(c, rng);
  const std::vector<float> zeros(c.heads, 0.0f);
  std::vector<float> plain, zero;
  ASSERT_TRUE(pagedAttentionReference(paramsFor(c, in, plain, nullptr)).ok());
  ASSERT_TRUE(pagedAttentionReference(paramsFor(c, in, zero, zeros.data())).ok());
  EXPECT_EQ(plain, zero);
}

TEST(PagedAttentionReferenceTest, RefusesNonFiniteSlopes) {
  std::mt19937 rng(5);
  const Case c;
  const Inputs in = makeInputs(c, rng);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    std::vector<float> slopes = kSlopes4, out;
    slopes[2] = bad;
    const Status st = pagedAttentionReference(paramsFor(c, in, out, slopes.data()));
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("ALiBi slope of head 2"), std::string::npos) << st.message();
  }
}

// Falcon: slopes 2^(-k/2) rounded to bfloat16 (inexact products), positions past 256 (products
// with more than 8 significant bits even for power-of-two slopes).
TEST(PagedAttentionReferenceTest, FalconAlibiRoundsTheProductToBfloat16) {
  std::mt19937 rng(6);
  Case c;
  c.startPos = {250, 3};
  c.newRows = {9, 6};
  const Inputs in = makeInputs(c, rng);
  std::vector<float> slopes;
  for (int h = 1; h <= c.heads; ++h)
    slopes.push_back(bf16ToFloat(floatToBf16(std::exp2(-0.5f * static_cast<float>(h)))));
  std::vector<float> out;
  PagedAttentionParams p = paramsFor(c, in, out, slopes.data());
  p.alibiBf16Divisor = kFalconDivisor;
  ASSERT_TRUE(pagedAttentionReference(p).ok());
  expectNear(out, naive(c, in, slopes, BiasForm::kFalcon), 1e-5f);
  // The rounding matters here: BLOOM's form with slope / divisor is measurably different.
  std::vector<float> scaled;
  for (float x : slopes) scaled.push_back(x / kFalconDivisor);
  const std::vector<float> bloom = naive(c, in, scaled, BiasForm::kBloom);
  float maxDiff = 0.0f;
  for (size_t i = 0; i < out.size(); ++i) maxDiff = std::max(maxDiff, std::fabs(out[i] - bloom[i]));
  EXPECT_GT(maxDiff, 1e-3f);
  for (float bad :
       {-1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    p.alibiBf16Divisor = bad;
    const Status st = pagedAttentionReference(p);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("alibiBf16Divisor"), std::string::npos) << st.message();
  }
}

}  // namespace
}  // namespace textgen::kernels
