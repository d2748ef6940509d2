#include "textgen/router/block_allocator.h"

#include <gtest/gtest.h>

#include <set>

namespace textgen::router {
namespace {

TEST(BlockAllocatorTest, ReservesBlockZeroAndDerivesSlots) {
  BlockAllocator a(5, 4);  // blocks 1..4 usable
  EXPECT_EQ(a.freeBlocks(), 4u);
  auto x = a.allocate(6);  // 2 blocks
  ASSERT_TRUE(x.has_value());
  EXPECT_EQ(x->blocks, (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(x->slots, (std::vector<uint32_t>{4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(a.freeBlocks(), 2u);
}

TEST(BlockAllocatorTest, ShortfallIsEmptyNotAnErrorAndFreedBlocksReturn) {
  BlockAllocator a(4, 16);
  auto x = a.allocate(40);  // 3 blocks: all of them
  ASSERT_TRUE(x.has_value());
  EXPECT_FALSE(a.allocate(1).has_value());
  a.free(x->blocks);
  EXPECT_EQ(a.freeBlocks(), 3u);
  auto y = a.allocate(48);
  ASSERT_TRUE(y.has_value());
  std::set<uint32_t> blocks(y->blocks.begin(), y->blocks.end());
  EXPECT_EQ(blocks, (std::set<uint32_t>{1, 2, 3}));
  EXPECT_FALSE(a.allocate(0).has_value());
}

TEST(BlockAllocatorDeathTest, DoubleFreeIsAProgrammingError) {
  BlockAllocator a(4, 16);
  auto x = a.allocate(16);
  a.free(x->blocks);
  EXPECT_DEATH(a.free(x->blocks), "not allocated");
  EXPECT_DEATH(a.free(std::vector<uint32_t>{0}), "not allocated");
}

}  // namespace
}  // namespace textgen::router
