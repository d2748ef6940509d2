// positionEmbeddingReference against a plain loop, the offset, rounding, and bad params (bounds).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "textgen/kernels/half.h"
#include "textgen/kernels/position_embedding.h"

namespace textgen::kernels {
namespace {

TEST(PositionEmbeddingReferenceTest, AddsTheRowAtPositionPlusOffset) {
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.0f, 1.0f);
  const int64_t rows = 6, width = 7, tableRows = 12, offset = 2;
  std::vector<float> x(rows * width), table(tableRows * width);
  for (float& v : x) v = d(rng);
  for (float& v : table) v = d(rng);
  const std::vector<int32_t> positions{0, 1, 2, 9, 3, 0};  // unordered, repeated, the last row
  std::vector<float> want = x;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < width; ++i)
      want[r * width + i] += table[(positions[r] + 2) * width + i];
  }
  PositionEmbeddingParams p{.x = x.data(),
                            .table = table.data(),
                            .positions = positions.data(),
                            .rows = rows,
                            .width = width,
                            .tableRows = tableRows,
                            .offset = offset,
                            .maxPosition = 9};
  ASSERT_TRUE(positionEmbeddingReference(p).ok());
  EXPECT_EQ(x, want);
}

TEST(PositionEmbeddingReferenceTest, Bf16RoundsTheSumOnce) {
  // 1 + 2^-8 is a tie in bf16: rounds to even (1).
  std::vector<uint16_t> x{floatToBf16(1.0f)};
  std::vector<uint16_t> table{floatToBf16(5.0f), floatToBf16(std::ldexp(1.0f, -8))};
  const std::vector<int32_t> positions{1};
  PositionEmbeddingParams p{.x = x.data(),
                            .table = table.data(),
                            .positions = positions.data(),
                            .rows = 1,
                            .width = 1,
                            .tableRows = 2,
                            .maxPosition = 1,
                            .dtype = DType::kBF16};
  ASSERT_TRUE(positionEmbeddingReference(p).ok());
  EXPECT_EQ(bf16ToFloat(x[0]), 1.0f);
}

TEST(PositionEmbeddingReferenceTest, RejectsBadParams) {
  std::vector<float> x(4, 1.0f), table(6, 0.5f);
  std::vector<int32_t> positions{0, 1};
  const PositionEmbeddingParams ok{.x = x.data(),
                                   .table = table.data(),
                                   .positions = positions.data(),
                                   .rows = 2,
                                   .width = 2,
                                   .tableRows = 3,
                                   .offset = 1,
                                   .maxPosition = 1};
  EXPECT_TRUE(validatePositionEmbedding(ok).ok());

  PositionEmbeddingParams p = ok;
  p.maxPosition = 2;  // 2 + offset 1 = row 3 of a 3-row table
  EXPECT_EQ(positionEmbeddingReference(p).message(),
            "position_embedding: maxPosition 2 + offset 1 is outside the table's 3 rows");
  p = ok;
  p.offset = -1;
  EXPECT_EQ(positionEmbeddingReference(p).message(), "position_embedding: offset must be >= 0");
  p = ok;
  p.maxPosition = -1;
  EXPECT_EQ(positionEmbeddingReference(p).message(),
            "position_embedding: maxPosition must be >= 0");
  p = ok;
  p.width = 0;
  EXPECT_EQ(positionEmbeddingReference(p).message(), "position_embedding: width must be > 0");
  p = ok;
  p.tableRows = 0;
  EXPECT_EQ(positionEmbeddingReference(p).message(), "position_embedding: tableRows must be > 0");
  p = ok;
  p.rows = -1;
  EXPECT_EQ(positionEmbeddingReference(p).message(), "position_embedding: rows must be >= 0");
  p = ok;
  p.positions = nullptr;
  EXPECT_EQ(positionEmbeddingReference(p).message(), "position_embedding: positions is null");
  p = ok;
  p.table = nullptr;
  EXPECT_EQ(positionEmbeddingReference(p).message(), "position_embedding: table is null");
  p = ok;
  p.x = nullptr;
  EXPECT_EQ(positionEmbeddingReference(p).message(), "position_embedding: x is null");
  p = ok;
  p.rows = 0;
  p.x = nullptr;  // nothing to do
  EXPECT_TRUE(positionEmbeddingReference(p).ok());

  // A position beyond the stated bound: an error, and nothing written.
  positions[1] = 2;
  p = ok;
  EXPECT_EQ(positionEmbeddingReference(p).message(),
            "position_embedding: position 2 of row 1 outside [0, maxPosition 1]");
  positions[1] = -1;
  EXPECT_EQ(positionEmbeddingReference(p).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(x, std::vector<float>(4, 1.0f));
}

}  // namespace
}  // namespace textgen::kernels
