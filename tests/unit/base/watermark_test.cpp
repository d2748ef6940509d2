// The watermark's green lists (TGI's: torch.randperm on a CPU generator seeded with 15485863 times
// the previous token) against torch's own permutations, recorded on the GPU machine by
// tools/watermark/record_torch_randperm.py; and the detector's z-score.
#include "textgen/base/watermark.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

namespace textgen {
namespace {

TEST(Watermark, RandpermEqualsTorchOnTheCpu) {
  std::ifstream in(std::string(TEXTGEN_WATERMARK_FIXTURES) + "/torch_randperm.json");
  ASSERT_TRUE(in) << "tests/reference/watermark/torch_randperm.json is missing";
  const nlohmann::json ref = nlohmann::json::parse(in);
  ASSERT_EQ(ref["hash_key"].get<uint64_t>(), kWatermarkHashKey);
  ASSERT_GE(ref["cases"].size(), 10u);
  for (const auto& c : ref["cases"]) {
    const auto vocab = c["vocab"].get<uint32_t>();
    const auto prev = c["previous"].get<uint32_t>();
    SCOPED_TRACE("previous " + std::to_string(prev) + " vocab " + std::to_string(vocab));
    const std::vector<uint32_t> perm = torchCpuRandperm(kWatermarkHashKey * prev, vocab);
    const auto want = c["prefix"].get<std::vector<uint32_t>>();
    ASSERT_EQ(std::vector<uint32_t>(perm.begin(), perm.begin() + want.size()), want);
    const uint64_t half =
        std::accumulate(perm.begin(), perm.begin() + greenListSize(vocab, 0.5), uint64_t{0});
    EXPECT_EQ(half, c["green_half_sum"].get<uint64_t>());
    // The mask holds exactly the green list.
    const std::vector<uint32_t> mask = greenListMask(prev, vocab, 0.5);
    uint32_t bits = 0;
    for (uint32_t w : mask) bits += static_cast<uint32_t>(__builtin_popcount(w));
    EXPECT_EQ(bits, greenListSize(vocab, 0.5));
    EXPECT_TRUE(mask[perm[0] / 32] >> (perm[0] % 32) & 1u);
    EXPECT_FALSE(mask[perm[vocab - 1] / 32] >> (perm[vocab - 1] % 32) & 1u);
  }
}

TEST(Watermark, GreenListSizeAndCache) {
  EXPECT_EQ(greenListSize(4096, 0.5), 2048u);
  EXPECT_EQ(greenListSize(32001, 0.25), 8000u);               // int(), as TGI
  GreenListCache cache(4096, 0.25, /*budgetBytes=*/2 * 512);  // two masks of 512 bytes
  EXPECT_EQ(cache.capacity(), 2u);
  EXPECT_EQ(GreenListCache(4096, 0.5).capacity(), 4096u);  // the whole vocabulary fits 64 MiB
  EXPECT_EQ(GreenListCache(1u << 24, 0.5).capacity(), 32u);
  const std::vector<uint32_t> a(cache.mask(5).begin(), cache.mask(5).end());
  (void)cache.mask(6);
  (void)cache.mask(7);  // evicts 5
  EXPECT_EQ(std::vector<uint32_t>(cache.mask(5).begin(), cache.mask(5).end()), a);
  EXPECT_EQ(a, greenListMask(5, 4096, 0.25));
  EXPECT_NE(a, greenListMask(6, 4096, 0.25));
}

TEST(Watermark, ScoresGreenRunsAndChance) {
  const uint32_t vocab = 4096;
  // A sequence that always picks a green token scores sqrt(T) standard deviations (gamma 0.5).
  std::vector<uint32_t> green{17};
  std::vector<uint32_t> red{17};
  for (int i = 0; i < 100; ++i) {
    const std::vector<uint32_t> perm = torchCpuRandperm(kWatermarkHashKey * green.back(), vocab);
    green.push_back(perm[0]);
    const std::vector<uint32_t> permRed = torchCpuRandperm(kWatermarkHashKey * red.back(), vocab);
    red.push_back(permRed[vocab - 1]);
  }
  const WatermarkScore g = scoreWatermark(green, vocab, 0.5);
  EXPECT_EQ(g.scored, 100);
  EXPECT_EQ(g.green, 100);
  EXPECT_NEAR(g.z, 10.0, 1e-9);
  EXPECT_LT(g.pValue, 1e-20);
  const WatermarkScore r = scoreWatermark(red, vocab, 0.5);
  EXPECT_EQ(r.green, 0);
  EXPECT_NEAR(r.z, -10.0, 1e-9);
  // Uniformly random tokens: |z| stays small.
  std::mt19937 rng(3);
  std::vector<uint32_t> noise(2000);
  for (uint32_t& t : noise) t = rng() % vocab;
  EXPECT_LT(std::abs(scoreWatermark(noise, vocab, 0.5).z), 3.0);
  // Nothing to score; ids past the vocabulary count as red.
  EXPECT_EQ(scoreWatermark(std::vector<uint32_t>{3}, vocab, 0.5).scored, 0);
  EXPECT_EQ(scoreWatermark(std::vector<uint32_t>{3}, vocab, 0.5).z, 0.0);
  EXPECT_EQ(scoreWatermark(std::vector<uint32_t>{3, 5000, 9000}, vocab, 0.5).green, 0);
}

TEST(Watermark, ParamsAreChecked) {
  EXPECT_TRUE(checkWatermarkParams(0.5, 2.0).ok());
  EXPECT_FALSE(checkWatermarkParams(0.0, 2.0).ok());
  EXPECT_FALSE(checkWatermarkParams(1.0, 2.0).ok());
  EXPECT_FALSE(checkWatermarkParams(NAN, 2.0).ok());
  EXPECT_FALSE(checkWatermarkParams(0.5, -1.0).ok());
  EXPECT_FALSE(checkWatermarkParams(0.5, INFINITY).ok());
}

}  // namespace
}  // namespace textgen
