// Paged attention's CPU reference against a plain attention in double precision over contiguous
// keys: causal, grouped-query, with a sliding window, and with ALiBi written in BLOOM's form
// (slope * j) and MPT's (slope * (j - (seqLen - 1))), both softmax-equivalent to the kernel's
// slope * (j - i); and Falcon's bf16(slope * j) / divisor (the product rounded to bfloat16, which
// no relative form can do). Bad ALiBi slopes and divisors are refused.
// T5 (docs/t5.md) against a dense attention over each sequence's unpaged keys: the encoder
// (non-causal, bidirectional relative bias), the decoder (causal, causal bias, prefixes and decode
// rows) and cross-attention (contextLens, no bias); and the new fields' validation.
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
#include "textgen/kernels/relative_position.h"

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

// ---- T5 ----

struct T5Case {
  int64_t heads = 4, headDim = 16, blockSize = 4;
  std::vector<int32_t> startPos, newRows;
  std::vector<int32_t> contextLens;  // empty: none
  bool causal = true, bias = false, bidirectional = false;
  int32_t buckets = 32, maxDistance = 64;
};

// Dense keys and values per sequence, scattered into shuffled blocks of a paged cache.
struct T5Inputs {
  std::vector<std::vector<float>> keys, values;  // per sequence [context, heads, headDim]
  std::vector<float> q, table;                   // q [rows, heads, headDim]; [buckets, heads]
  std::vector<float> kCache, vCache;             // [slots, heads, headDim]
  std::vector<int32_t> seqStarts{0}, tables;
  int64_t rows = 0, maxBlocks = 1, maxNewRows = 0, maxContext = 1;
};

int64_t contextOf(const T5Case& c, size_t s) {
  return c.contextLens.empty() ? c.startPos[s] + c.newRows[s] : c.contextLens[s];
}

T5Inputs makeT5Inputs(const T5Case& c, std::mt19937& rng) {
  T5Inputs in;
  const size_t numSeqs = c.newRows.size();
  const int64_t width = c.heads * c.headDim;
  std::normal_distribution<float> unit(0.0f, 1.0f);
  for (size_t s = 0; s < numSeqs; ++s) {
    in.rows += c.newRows[s];
    in.seqStarts.push_back(static_cast<int32_t>(in.rows));
    in.maxNewRows = std::max<int64_t>(in.maxNewRows, c.newRows[s]);
    const int64_t ctx = contextOf(c, s);
    in.maxContext = std::max(in.maxContext, std::max<int64_t>(ctx, c.startPos[s] + c.newRows[s]));
    in.maxBlocks = std::max(in.maxBlocks, (ctx + c.blockSize - 1) / c.blockSize);
    in.keys.emplace_back(ctx * width);
    in.values.emplace_back(ctx * width);
    for (float& x : in.keys.back()) x = unit(rng);
    for (float& x : in.values.back()) x = unit(rng);
  }
  std::vector<int32_t> pool(numSeqs * in.maxBlocks);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  in.tables = pool;
  in.kCache.assign(pool.size() * c.blockSize * width, 0.0f);
  in.vCache.assign(in.kCache.size(), 0.0f);
  for (size_t s = 0; s < numSeqs; ++s) {
    for (int64_t j = 0; j < contextOf(c, s); ++j) {
      const int64_t slot =
          int64_t{in.tables[s * in.maxBlocks + j / c.blockSize]} * c.blockSize + j % c.blockSize;
      std::copy_n(in.keys[s].begin() + j * width, width, in.kCache.begin() + slot * width);
      std::copy_n(in.values[s].begin() + j * width, width, in.vCache.begin() + slot * width);
    }
  }
  // T5 folds 1/sqrt(d) into q; a wide table makes the bias matter.
  std::normal_distribution<float> qd(0.0f, 1.0f / std::sqrt(static_cast<float>(c.headDim)));
  in.q.resize(in.rows * width);
  for (float& x : in.q) x = qd(rng);
  std::normal_distribution<float> biasD(0.0f, 2.0f);
  if (c.bias) {
    in.table.resize(int64_t{c.buckets} * c.heads);
    for (float& x : in.table) x = biasD(rng);
  }
  return in;
}

PagedAttentionParams t5Params(const T5Case& c, const T5Inputs& in, std::vector<float>& out) {
  out.assign(in.rows * c.heads * c.headDim, -1.0f);
  return {.q = in.q.data(),
          .qRowStride = c.heads * c.headDim,
          .kCache = in.kCache.data(),
          .vCache = in.vCache.data(),
          .out = out.data(),
          .seqStarts = in.seqStarts.data(),
          .startPos = c.startPos.data(),
          .blockTables = in.tables.data(),
          .rows = in.rows,
          .numSeqs = static_cast<int64_t>(c.newRows.size()),
          .maxBlocksPerSeq = in.maxBlocks,
          .numHeads = c.heads,
          .numKvHeads = c.heads,
          .headDim = c.headDim,
          .blockSize = c.blockSize,
          .scale = 1.0f,
          .causal = c.causal,
          .contextLens = c.contextLens.empty() ? nullptr : c.contextLens.data(),
          .relativeBias = c.bias ? in.table.data() : nullptr,
          .relativeBuckets = c.bias ? c.buckets : 0,
          .relativeMaxDistance = c.bias ? c.maxDistance : 0,
          .relativeBidirectional = c.bias && c.bidirectional,
          .maxNewRows = in.maxNewRows,
          .maxContext = in.maxContext,
          .dtype = DType::kF32};
}

// transformers' T5Attention in double precision over the dense keys: scores q·k + bias[h, i, j]
// (no scaling), j - i the relative position, the causal mask when asked; no keys give zeros.
std::vector<float> naiveT5(const T5Case& c, const T5Inputs& in, bool withBias) {
  std::vector<float> out(in.rows * c.heads * c.headDim);
  const int64_t d = c.headDim, width = c.heads * d;
  for (size_t s = 0; s < c.newRows.size(); ++s) {
    const int64_t ctx = contextOf(c, s);
    for (int64_t t = 0; t < c.newRows[s]; ++t) {
      const int64_t row = in.seqStarts[s] + t, i = c.startPos[s] + t;
      const int64_t end = c.causal ? i + 1 : ctx;
      for (int64_t h = 0; h < c.heads; ++h) {
        std::vector<double> w(end);
        double maxW = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < end; ++j) {
          double dot = 0.0;
          for (int64_t e = 0; e < d; ++e)
            dot += double{in.q[row * width + h * d + e]} * in.keys[s][j * width + h * d + e];
          if (withBias) {
            const int b = relativePositionBucket(static_cast<int>(j - i), c.bidirectional,
                                                 c.buckets, c.maxDistance);
            dot += in.table[b * c.heads + h];
          }
          w[j] = dot;
          maxW = std::max(maxW, dot);
        }
        double sum = 0.0;
        for (int64_t j = 0; j < end; ++j) sum += (w[j] = std::exp(w[j] - maxW));
        for (int64_t e = 0; e < d; ++e) {
          double acc = 0.0;
          for (int64_t j = 0; j < end; ++j) acc += w[j] * in.values[s][j * width + h * d + e];
          out[row * width + h * d + e] = end > 0 ? static_cast<float>(acc / sum) : 0.0f;
        }
      }
    }
  }
  return out;
}

float maxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// The encoder: every row sees its whole sequence, the bidirectional buckets (lengths up to 70
// reach the saturated buckets of max distance 64).
TEST(PagedAttentionReferenceTest, T5EncoderNonCausalBidirectionalBias) {
  std::mt19937 rng(11);
  T5Case c;
  c.startPos = {0, 0, 0, 0};
  c.newRows = {5, 13, 1, 70};
  c.causal = false;
  c.bias = true;
  c.bidirectional = true;
  const T5Inputs in = makeT5Inputs(c, rng);
  std::vector<float> out;
  ASSERT_TRUE(pagedAttentionReference(t5Params(c, in, out)).ok());
  expectNear(out, naiveT5(c, in, true), 1e-5f);
  EXPECT_GT(maxAbsDiff(out, naiveT5(c, in, false)), 0.05f);  // the bias matters
  T5Case masked = c;                                         // and so does the mask
  masked.causal = true;
  EXPECT_GT(maxAbsDiff(out, naiveT5(masked, in, true)), 0.05f);
}

// The decoder: causal, the causal buckets, a first step (the start token and more), decode rows
// after cached positions, a chunk, and a decode row past max distance.
TEST(PagedAttentionReferenceTest, T5DecoderCausalBias) {
  std::mt19937 rng(12);
  T5Case c;
  c.startPos = {0, 9, 30, 70, 0};
  c.newRows = {6, 1, 3, 1, 1};
  c.bias = true;
  const T5Inputs in = makeT5Inputs(c, rng);
  std::vector<float> out;
  ASSERT_TRUE(pagedAttentionReference(t5Params(c, in, out)).ok());
  expectNear(out, naiveT5(c, in, true), 1e-5f);
  EXPECT_GT(maxAbsDiff(out, naiveT5(c, in, false)), 0.05f);
  // The 128-distance buckets of the released checkpoints.
  c.maxDistance = 128;
  std::vector<float> out128;
  ASSERT_TRUE(pagedAttentionReference(t5Params(c, in, out128)).ok());
  expectNear(out128, naiveT5(c, in, true), 1e-5f);
}

// Cross-attention: the keys are the encoder's contextLens[s] positions, whatever the rows'
// positions (before, inside and past the encoder's length), no bias; an empty context gives 0.
TEST(PagedAttentionReferenceTest, T5CrossAttentionOverContextLens) {
  std::mt19937 rng(13);
  T5Case c;
  c.startPos = {0, 3, 17, 0, 40, 2};
  c.newRows = {1, 4, 2, 1, 6, 2};
  c.contextLens = {12, 5, 40, 1, 9, 0};
  c.causal = false;
  const T5Inputs in = makeT5Inputs(c, rng);
  std::vector<float> out;
  ASSERT_TRUE(pagedAttentionReference(t5Params(c, in, out)).ok());
  expectNear(out, naiveT5(c, in, false), 1e-5f);
  const int64_t width = c.heads * c.headDim, empty = int64_t{in.seqStarts[5]} * width;
  EXPECT_EQ(std::vector<float>(out.begin() + empty, out.end()),
            std::vector<float>(out.size() - empty, 0.0f));
}

TEST(PagedAttentionReferenceTest, T5DefaultsKeepTheCausalPath) {
  std::mt19937 rng(14);
  T5Case c;
  c.startPos = {0, 5};
  c.newRows = {7, 3};
  const T5Inputs in = makeT5Inputs(c, rng);
  std::vector<float> out;
  ASSERT_TRUE(pagedAttentionReference(t5Params(c, in, out)).ok());
  expectNear(out, naiveT5(c, in, false), 1e-5f);
}

TEST(PagedAttentionReferenceTest, T5RefusesInconsistentFields) {
  std::mt19937 rng(15);
  T5Case c;
  c.startPos = {0, 2};
  c.newRows = {3, 2};
  c.bias = true;
  const T5Inputs in = makeT5Inputs(c, rng);
  std::vector<float> out;
  auto refused = [&](PagedAttentionParams p, const std::string& what) {
    const Status st = pagedAttentionReference(p);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << what;
    EXPECT_NE(st.message().find(what), std::string::npos) << st.message();
  };
  const PagedAttentionParams good = t5Params(c, in, out);
  ASSERT_TRUE(pagedAttentionReference(good).ok());
  PagedAttentionParams p = good;
  p.alibiSlopes = kSlopes4.data();
  refused(p, "ALiBi");
  p = good;
  p.relativeBuckets = 0;
  refused(p, "relative bucket count");
  p = good;
  p.relativeMaxDistance = 16;  // inside the causal exact range (16)
  refused(p, "relative bucket count");
  p = good;
  p.relativeBias = nullptr;
  refused(p, "without a bias table");
  p = good;
  p.causal = false;
  p.slidingWindow = 4;
  refused(p, "sliding window");
  const std::vector<int32_t> lens{2, 3};
  p = good;
  p.contextLens = lens.data();
  refused(p, "requires causal = false");
  const std::vector<int32_t> tooLong{2, static_cast<int32_t>(in.maxBlocks * c.blockSize + 1)};
  p = good;
  p.causal = false;
  p.contextLens = tooLong.data();
  refused(p, "contextLens of sequence 1");
  std::vector<float> badTable = in.table;
  badTable[5] = std::numeric_limits<float>::quiet_NaN();
  p = good;
  p.relativeBias = badTable.data();
  refused(p, "relative bias entry 5");
}

}  // namespace
}  // namespace textgen::kernels
