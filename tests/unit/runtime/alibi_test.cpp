// ALiBi slopes (layers/alibi.h) against values worked out by hand from transformers'
// build_alibi_tensor (BLOOM) and build_mpt_alibi_tensor (MPT), and their tensor-parallel slices.
#include "layers/alibi.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace textgen::runtime {
namespace {

void expectSlopes(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t h = 0; h < want.size(); ++h)
    EXPECT_FLOAT_EQ(got[h], static_cast<float>(want[h])) << "head " << h;
}

// 8 heads: 2^(-8/8 * k), k = 1..8, exact in float.
const std::vector<double> kEight{0.5,     0.25,     0.125,     0.0625,
                                 0.03125, 0.015625, 0.0078125, 0.00390625};
// 12 heads: the 8 above, then the odd powers of 2^(-1/2) for the 4 remaining heads.
const std::vector<double> kTwelve{0.5,
                                  0.25,
                                  0.125,
                                  0.0625,
                                  0.03125,
                                  0.015625,
                                  0.0078125,
                                  0.00390625,
                                  0.70710678118654752,
                                  0.35355339059327376,
                                  0.17677669529663688,
                                  0.08838834764831844};

TEST(AlibiTest, BloomSlopesForEightHeadsArePowersOfTwo) {
  const std::vector<float> s = bloomAlibiSlopes(8);
  ASSERT_EQ(s.size(), 8u);
  for (size_t h = 0; h < 8; ++h) EXPECT_EQ(s[h], static_cast<float>(kEight[h])) << "head " << h;
}

TEST(AlibiTest, BloomSlopesForTwelveHeadsAppendOddPowersOfTheFinerBase) {
  expectSlopes(bloomAlibiSlopes(12), kTwelve);
}

TEST(AlibiTest, BloomSlopesForSixHeads) {
  // P = 4: 2^-2, 2^-4, 2^-6, 2^-8; then 2^-1, 2^-3 (powers 1 and 3 of 2^-1).
  expectSlopes(bloomAlibiSlopes(6), {0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125});
}

TEST(AlibiTest, MptSlopesWithTheDefaultBiasMaxEqualBlooms) {
  expectSlopes(mptAlibiSlopes(8), kEight);
  // Q = 16, slopes 2^(-k/2); k = 2, 4, ..., 16 first, then k = 1, 3, 5, 7: BLOOM's order.
  expectSlopes(mptAlibiSlopes(12), kTwelve);
  expectSlopes(mptAlibiSlopes(1), {1.0 / 256});
}

TEST(AlibiTest, MptSlopesWithAnotherBiasMax) {
  // 8 heads, alibi_bias_max 16: 2^(-2k), k = 1..8.
  expectSlopes(mptAlibiSlopes(8, 16.0),
               {std::exp2(-2.0), std::exp2(-4.0), std::exp2(-6.0), std::exp2(-8.0),
                std::exp2(-10.0), std::exp2(-12.0), std::exp2(-14.0), std::exp2(-16.0)});
  // 12 heads, alibi_bias_max 16: Q = 16, 2^-k; even k (2..16) then odd k (1, 3, 5, 7).
  expectSlopes(mptAlibiSlopes(12, 16.0),
               {std::exp2(-2.0), std::exp2(-4.0), std::exp2(-6.0), std::exp2(-8.0),
                std::exp2(-10.0), std::exp2(-12.0), std::exp2(-14.0), std::exp2(-16.0),
                std::exp2(-1.0), std::exp2(-3.0), std::exp2(-5.0), std::exp2(-7.0)});
  // 12 heads, alibi_bias_max 4: 2^(-k/4); even k then odd k = 1, 3, 5, 7.
  expectSlopes(mptAlibiSlopes(12, 4.0),
               {std::exp2(-0.5), std::exp2(-1.0), std::exp2(-1.5), std::exp2(-2.0), std::exp2(-2.5),
                std::exp2(-3.0), std::exp2(-3.5), std::exp2(-4.0), std::exp2(-0.25),
                std::exp2(-0.75), std::exp2(-1.25), std::exp2(-1.75)});
}

TEST(AlibiTest, RanksTakeContiguousHeads) {
  const std::vector<float> all = bloomAlibiSlopes(12);
  auto r2 = alibiSlopesForRank(all, 2, 4);
  ASSERT_TRUE(r2.ok()) << r2.status().message();
  expectSlopes(*r2, {0.0078125, 0.00390625, 0.70710678118654752});  // heads 6, 7, 8
  auto r1 = alibiSlopesForRank(all, 1, 2);
  ASSERT_TRUE(r1.ok());
  expectSlopes(*r1, {0.0078125, 0.00390625, 0.70710678118654752, 0.35355339059327376,
                     0.17677669529663688, 0.08838834764831844});
  // The ranks' slices in order are the whole.
  std::vector<float> joined;
  for (int r = 0; r < 3; ++r) {
    auto part = alibiSlopesForRank(all, r, 3);
    ASSERT_TRUE(part.ok());
    joined.insert(joined.end(), part->begin(), part->end());
  }
  EXPECT_EQ(joined, all);
  auto one = alibiSlopesForRank(all, 0, 1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, all);
}

TEST(AlibiTest, RefusesSlicesThatDoNotDivide) {
  const std::vector<float> all = bloomAlibiSlopes(12);
  EXPECT_EQ(alibiSlopesForRank(all, 0, 5).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(alibiSlopesForRank(all, 4, 4).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(alibiSlopesForRank(all, -1, 4).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(alibiSlopesForRank({}, 0, 1).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace textgen::runtime
