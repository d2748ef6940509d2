#include "textgen/base/strong_id.h"

#include <gtest/gtest.h>

#include <type_traits>
#include <unordered_set>

namespace textgen {
namespace {

static_assert(!std::is_convertible_v<uint64_t, RequestId>, "ids are not implicitly made from ints");
static_assert(!std::is_convertible_v<RequestId, uint64_t>, "ids do not decay to ints");
static_assert(!std::is_convertible_v<RequestId, BatchId>, "ids of different kinds do not mix");
static_assert(!std::is_assignable_v<RequestId&, BatchId>, "ids of different kinds do not mix");
static_assert(std::is_same_v<SlotId::RepType, uint32_t>);
static_assert(sizeof(BlockId) == sizeof(uint32_t), "no overhead over the raw integer");

TEST(StrongIdTest, ComparesByValue) {
  EXPECT_EQ(RequestId(3), RequestId(3));
  EXPECT_NE(RequestId(3), RequestId(4));
  EXPECT_LT(BlockId(1), BlockId(2));
  EXPECT_EQ(RequestId().value(), 0u);
  EXPECT_EQ(SlotId(17).value(), 17u);
}

TEST(StrongIdTest, Hashes) {
  std::unordered_set<BatchId> ids{BatchId(1), BatchId(2), BatchId(1)};
  EXPECT_EQ(ids.size(), 2u);
  EXPECT_TRUE(ids.contains(BatchId(2)));
}

}  // namespace
}  // namespace textgen
