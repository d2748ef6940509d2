// T5's relative position buckets against the tables transformers recorded in the T5 fixtures
// (tests/reference/models/t5-*/reference.json, docs/t5.md): the four sweeps over -300..300
// (32 buckets, max distance 64 and 128, bidirectional and causal), the decoder's causal table and
// every prompt's bidirectional encoder table; and the edges docs/t5.md lists.
#include "textgen/kernels/relative_position.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace textgen::kernels {
namespace {

// The fixtures' folder from the build (not __FILE__: ccache's base directory makes it relative).
const std::filesystem::path kFixtures = TEXTGEN_MODEL_FIXTURES;

nlohmann::json loadReference(const std::string& fixture) {
  std::ifstream in(kFixtures / fixture / "reference.json");
  if (!in) {
    ADD_FAILURE() << "cannot open " << (kFixtures / fixture / "reference.json");
    return nlohmann::json::object();
  }
  return nlohmann::json::parse(in);
}

constexpr const char* kT5Fixtures[] = {"t5-gated-gelu", "t5-relu-tied", "t5-gated-gelu-tied"};

TEST(RelativePositionTest, SweepsMatchTransformers) {
  for (const char* fixture : kT5Fixtures) {
    SCOPED_TRACE(fixture);
    const nlohmann::json ref = loadReference(fixture);
    ASSERT_EQ(ref.at("bucket_sweeps").size(), 4u);
    for (const auto& sweep : ref.at("bucket_sweeps")) {
      const int buckets = sweep.at("num_buckets"), maxDistance = sweep.at("max_distance");
      const bool bidirectional = sweep.at("bidirectional");
      const int first = sweep.at("first_relative_position");
      const auto& want = sweep.at("buckets");
      ASSERT_GE(want.size(), 601u);
      for (size_t i = 0; i < want.size(); ++i) {
        const int rel = first + static_cast<int>(i);
        ASSERT_EQ(relativePositionBucket(rel, bidirectional, buckets, maxDistance),
                  want[i].get<int>())
            << "rel " << rel << " buckets " << buckets << " max distance " << maxDistance
            << (bidirectional ? " bidirectional" : " causal");
      }
    }
  }
}

TEST(RelativePositionTest, DecoderAndEncoderTablesMatchTransformers) {
  for (const char* fixture : kT5Fixtures) {
    SCOPED_TRACE(fixture);
    const nlohmann::json ref = loadReference(fixture);
    const int buckets = ref.at("config").at("relative_attention_num_buckets");
    const int maxDistance = ref.at("config").at("relative_attention_max_distance");
    // Row q, column k: bucket(k - q); above the diagonal bucket 0 (masked anyway).
    const auto& decoder = ref.at("decoder_bucket_table");
    ASSERT_EQ(decoder.size(), 24u);
    for (size_t q = 0; q < decoder.size(); ++q) {
      for (size_t k = 0; k < decoder[q].size(); ++k) {
        ASSERT_EQ(relativePositionBucket(static_cast<int>(k) - static_cast<int>(q), false, buckets,
                                         maxDistance),
                  decoder[q][k].get<int>())
            << "decoder q " << q << " k " << k;
      }
    }
    for (const auto& prompt : ref.at("prompts")) {
      const auto& encoder = prompt.at("encoder_bucket_table");
      ASSERT_EQ(encoder.size(), prompt.at("input_ids").size());
      for (size_t q = 0; q < encoder.size(); ++q) {
        for (size_t k = 0; k < encoder[q].size(); ++k) {
          ASSERT_EQ(relativePositionBucket(static_cast<int>(k) - static_cast<int>(q), true, buckets,
                                           maxDistance),
                    encoder[q][k].get<int>())
              << "encoder q " << q << " k " << k;
        }
      }
    }
  }
}

// docs/t5.md's edges for 32 buckets and max distance 64, and far past the sweeps.
TEST(RelativePositionTest, Edges) {
  EXPECT_EQ(relativePositionBucket(0, true, 32, 64), 0);
  EXPECT_EQ(relativePositionBucket(1, true, 32, 64), 17);
  EXPECT_EQ(relativePositionBucket(7, true, 32, 64), 23);
  EXPECT_EQ(relativePositionBucket(8, true, 32, 64), 24);
  EXPECT_EQ(relativePositionBucket(49, true, 32, 64), 30);
  EXPECT_EQ(relativePositionBucket(50, true, 32, 64), 31);
  EXPECT_EQ(relativePositionBucket(-7, true, 32, 64), 7);
  EXPECT_EQ(relativePositionBucket(-8, true, 32, 64), 8);
  EXPECT_EQ(relativePositionBucket(-49, true, 32, 64), 14);
  EXPECT_EQ(relativePositionBucket(-50, true, 32, 64), 15);
  EXPECT_EQ(relativePositionBucket(5, false, 32, 64), 0);  // future keys: bucket 0
  EXPECT_EQ(relativePositionBucket(-15, false, 32, 64), 15);
  EXPECT_EQ(relativePositionBucket(-16, false, 32, 64), 16);
  EXPECT_EQ(relativePositionBucket(-17, false, 32, 64), 16);
  EXPECT_EQ(relativePositionBucket(-18, false, 32, 64), 17);
  EXPECT_EQ(relativePositionBucket(-58, false, 32, 64), 30);
  EXPECT_EQ(relativePositionBucket(-59, false, 32, 64), 31);
  EXPECT_EQ(relativePositionBucket(-1000000, false, 32, 128), 31);
  EXPECT_EQ(relativePositionBucket(1000000, true, 32, 128), 31);
  EXPECT_EQ(relativePositionBucket(-1000000, true, 32, 128), 15);
}

TEST(RelativePositionTest, ValidConfig) {
  EXPECT_TRUE(validRelativePositionConfig(true, 32, 128));
  EXPECT_TRUE(validRelativePositionConfig(false, 32, 64));
  EXPECT_FALSE(validRelativePositionConfig(true, 2, 64));    // no exact bucket per direction
  EXPECT_FALSE(validRelativePositionConfig(false, 32, 16));  // max distance inside the exact range
  EXPECT_FALSE(validRelativePositionConfig(false, 0, 64));
}

}  // namespace
}  // namespace textgen::kernels
