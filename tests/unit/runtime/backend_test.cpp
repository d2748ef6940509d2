// CPU backend operations against their definitions: RoPE with partial rotary (only the first
// rotaryDim dimensions of each head turn, in rotate-half layout), and paged attention with a
// sliding window over scattered blocks.
#include "textgen/runtime/backend.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace textgen::runtime {
namespace {

TEST(CpuBackendTest, PartialRotaryRotatesOnlyTheRotaryDims) {
  auto b = makeCpuBackend(1);
  const int64_t headDim = 8, rotary = 4, half = rotary / 2;
  std::vector<float> q(headDim), k(headDim);
  for (int i = 0; i < headDim; ++i) q[i] = k[i] = static_cast<float>(i + 1);
  const std::vector<float> inv{1.0f, 0.01f};
  const int32_t pos = 3;
  ASSERT_TRUE(b->rope({.q = q.data(),
                       .k = k.data(),
                       .qRowStride = headDim,
                       .kRowStride = headDim,
                       .invFreq = inv.data(),
                       .positions = &pos,
                       .rows = 1,
                       .numHeads = 1,
                       .numKvHeads = 1,
                       .headDim = headDim,
                       .rotaryDim = rotary})
                  .ok());
  for (int i = 0; i < half; ++i) {
    const float c = std::cos(pos * inv[i]), s = std::sin(pos * inv[i]);
    const float x1 = static_cast<float>(i + 1), x2 = static_cast<float>(i + 1 + half);
    EXPECT_NEAR(q[i], x1 * c - x2 * s, 1e-5);
    EXPECT_NEAR(q[i + half], x2 * c + x1 * s, 1e-5);
  }
  for (int i = rotary; i < headDim; ++i) EXPECT_EQ(q[i], static_cast<float>(i + 1));  // untouched
  EXPECT_EQ(q, k);
}

TEST(CpuBackendTest, SlidingWindowAttentionOverScatteredBlocks) {
  auto b = makeCpuBackend(1);
  const int64_t blockSize = 2, numBlocks = 8, headDim = 4, window = 3, len = 6;
  std::vector<float> kc(numBlocks * blockSize * headDim), vc(kc.size());
  const std::vector<int32_t> blocks{5, 1, 7};  // positions 0-1 in block 5, 2-3 in 1, 4-5 in 7
  std::mt19937 rng(1);
  std::normal_distribution<float> d;
  std::vector<std::vector<float>> keys(len, std::vector<float>(headDim)), values = keys;
  for (int64_t p = 0; p < len; ++p) {
    const int64_t slot = blocks[p / blockSize] * blockSize + p % blockSize;
    for (int64_t i = 0; i < headDim; ++i) {
      kc[slot * headDim + i] = keys[p][i] = d(rng);
      vc[slot * headDim + i] = values[p][i] = d(rng);
    }
  }
  std::vector<float> q(headDim), out(headDim);
  for (float& x : q) x = d(rng);
  // One sequence, one new row at the last position: it attends to positions 3..5.
  const std::vector<int32_t> seqStarts{0, 1}, startPos{len - 1};
  kernels::PagedAttentionParams p{.q = q.data(),
                                  .qRowStride = headDim,
                                  .kCache = kc.data(),
                                  .vCache = vc.data(),
                                  .out = out.data(),
                                  .seqStarts = seqStarts.data(),
                                  .startPos = startPos.data(),
                                  .blockTables = blocks.data(),
                                  .rows = 1,
                                  .numSeqs = 1,
                                  .maxBlocksPerSeq = 3,
                                  .numHeads = 1,
                                  .numKvHeads = 1,
                                  .headDim = headDim,
                                  .blockSize = blockSize,
                                  .slidingWindow = window,
                                  .scale = 0.5f,
                                  .maxNewRows = 1,
                                  .maxContext = len};
  ASSERT_TRUE(b->attention(p).ok());
  std::vector<double> w;
  double sum = 0;
  for (int64_t j = len - window; j < len; ++j) {
    double dot = 0;
    for (int64_t i = 0; i < headDim; ++i) dot += q[i] * keys[j][i];
    w.push_back(std::exp(0.5 * dot));
    sum += w.back();
  }
  for (int64_t i = 0; i < headDim; ++i) {
    double want = 0;
    for (int64_t j = 0; j < window; ++j) want += w[j] / sum * values[len - window + j][i];
    EXPECT_NEAR(out[i], want, 1e-5);
  }
}

}  // namespace
}  // namespace textgen::runtime
