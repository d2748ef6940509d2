#include "textgen/router/block_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <span>

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

namespace textgen::router {
namespace {

std::vector<uint32_t> iota(uint32_t from, uint32_t n) {
  std::vector<uint32_t> v(n);
  for (uint32_t i = 0; i < n; ++i) v[i] = from + i;
  return v;
}

TEST(PrefixCacheTest, PublishedFullBlocksAreReusedUpToOneTokenShortOfThePrompt) {
  BlockAllocator a(32, 4, true);
  const std::vector<uint32_t> prompt = iota(100, 10);
  auto x = a.allocate(prompt, 14);
  ASSERT_TRUE(x);
  EXPECT_EQ(x->cacheLen, 0u);
  EXPECT_EQ(a.cachedPrefix(prompt), 0u);  // nothing is shared before it is written
  a.publish(prompt, x->blocks);
  EXPECT_EQ(a.cachedBlocks(), 2u);
  EXPECT_EQ(a.cachedPrefix(prompt), 8u);
  auto y = a.allocate(prompt, 12);  // shares while x still runs
  ASSERT_TRUE(y);
  EXPECT_EQ(y->cacheLen, 8u);
  EXPECT_EQ(std::vector<uint32_t>(y->blocks.begin(), y->blocks.begin() + 2),
            std::vector<uint32_t>(x->blocks.begin(), x->blocks.begin() + 2));
  EXPECT_NE(y->blocks[2], x->blocks[2]);  // the partial block is never shared
  EXPECT_EQ(y->slots[5], x->slots[5]);
  // Eight tokens are two full blocks, but one token must be computed: one block is reused.
  EXPECT_EQ(a.cachedPrefix(iota(100, 8)), 4u);
  EXPECT_EQ(a.cachedPrefix(iota(100, 9)), 8u);
  // A prompt that diverges inside the second block shares the first only.
  std::vector<uint32_t> other = prompt;
  other[6] = 7;
  EXPECT_EQ(a.cachedPrefix(other), 4u);
  EXPECT_EQ(a.cachedPrefix(iota(101, 10)), 0u);
  // Without prefix caching nothing is reused.
  BlockAllocator plain(32, 4);
  auto p = plain.allocate(prompt, 12);
  plain.publish(prompt, p->blocks);
  EXPECT_EQ(plain.allocate(prompt, 12)->cacheLen, 0u);
  EXPECT_EQ(plain.cachedBlocks(), 0u);
}

TEST(PrefixCacheTest, ReferencesKeepBlocksAndFreedCachedBlocksStayEvictable) {
  BlockAllocator a(9, 4, true);  // 8 usable
  const std::vector<uint32_t> prompt = iota(1, 9);
  auto x = a.allocate(prompt, 12);  // 3 blocks
  a.publish(prompt, x->blocks);     // 2 cached
  auto y = a.allocate(prompt, 12);  // 2 shared + 1 fresh
  ASSERT_TRUE(y);
  EXPECT_EQ(a.freeBlocks(), 4u);
  a.free(x->blocks);
  EXPECT_EQ(a.freeBlocks(), 5u);  // x's private block; the shared ones are still held by y
  // Held blocks are never evicted: 6 blocks do not fit.
  EXPECT_FALSE(a.allocate(24).has_value());
  a.free(y->blocks);
  EXPECT_EQ(a.freeBlocks(), 8u);
  EXPECT_EQ(a.cachedBlocks(), 2u);
  EXPECT_EQ(a.cachedPrefix(prompt), 8u);
  // Now they can go: an allocation of every block evicts them.
  auto all = a.allocate(32);
  ASSERT_TRUE(all);
  EXPECT_EQ(a.cachedBlocks(), 0u);
  EXPECT_EQ(a.cachedPrefix(prompt), 0u);
  EXPECT_EQ(a.freeBlocks(), 0u);
}

TEST(PrefixCacheTest, EvictionTakesTheLeastRecentlyUsedLeavesFirst) {
  BlockAllocator a(13, 4, true);  // 12 usable
  const std::vector<uint32_t> p = iota(10, 13), q = iota(500, 13);
  for (const auto* prompt : {&p, &q}) {
    auto x = a.allocate(*prompt, 16);
    a.publish(*prompt, x->blocks);  // 3 blocks each
    a.free(x->blocks);
  }
  EXPECT_EQ(a.cachedBlocks(), 6u);
  auto touch = a.allocate(p, 13);  // p is now the more recent
  a.free(touch->blocks);
  // 8 fresh blocks: 6 free, 2 evicted from q's path, deepest first.
  auto x = a.allocate(32);
  ASSERT_TRUE(x);
  EXPECT_EQ(a.cachedPrefix(p), 12u);
  EXPECT_EQ(a.cachedPrefix(q), 4u);
  a.free(x->blocks);
}

TEST(PrefixCacheTest, ADuplicateBlockStaysPrivateAndDropCacheForgetsEverything) {
  BlockAllocator a(32, 4, true);
  const std::vector<uint32_t> prompt = iota(40, 12);
  auto x = a.allocate(prompt, 13), y = a.allocate(prompt, 13);  // both compute it (same batch)
  a.publish(prompt, x->blocks);
  a.publish(prompt, y->blocks);  // y's copies lose: x's are cached
  EXPECT_EQ(a.cachedBlocks(), 3u);
  a.free(y->blocks);
  EXPECT_EQ(a.freeBlocks(), 31u - 4u);  // y's four blocks are back; x holds its own
  a.dropCache();
  EXPECT_EQ(a.cachedBlocks(), 0u);
  EXPECT_EQ(a.cachedPrefix(prompt), 0u);
  a.free(x->blocks);  // held blocks are freed by their holder, after the drop
  EXPECT_EQ(a.freeBlocks(), 31u);
  auto z = a.allocate(prompt, 13);
  EXPECT_EQ(z->cacheLen, 0u);
}

// A model check: random requests over a few shared stems, random publishes, finishes and drops,
// against a KV memory that records which token each slot holds. Every reused prefix must hold the
// prompt's tokens; no write may land in a block another live request holds; blocks are conserved.
TEST(PrefixCacheTest, RandomRequestsNeverShareAWrittenBlockOrReuseAWrongOne) {
  constexpr uint32_t kBlocks = 48, kBs = 4;
  BlockAllocator a(kBlocks, kBs, true);
  std::mt19937 rng(11);
  std::vector<int64_t> kv(kBlocks * kBs, -1);
  struct Live {
    BlockAllocation alloc;
    std::vector<uint32_t> tokens;  // prompt, then generated
    uint32_t prompt = 0, written = 0, capacity = 0;
    bool published = false;
  };
  std::vector<Live> live;
  const std::vector<std::vector<uint32_t>> stems = {iota(1, 9), iota(100, 14), iota(200, 3)};
  uint64_t hits = 0;
  for (int step = 0; step < 20000; ++step) {
    const uint32_t op = rng() % 10;
    if (op < 4) {  // a new request
      std::vector<uint32_t> p = stems[rng() % stems.size()];
      for (uint32_t i = rng() % 9; i > 0; --i) p.push_back(1000 + rng() % 2);
      const uint32_t capacity = static_cast<uint32_t>(p.size()) + 1 + rng() % 10;
      auto alloc = a.allocate(p, capacity);
      if (!alloc) continue;
      ASSERT_LT(alloc->cacheLen, p.size());
      ASSERT_EQ(alloc->cacheLen % kBs, 0u);
      for (uint32_t i = 0; i < alloc->cacheLen; ++i) ASSERT_EQ(kv[alloc->slots[i]], p[i]) << i;
      hits += alloc->cacheLen > 0;
      live.push_back({*alloc, p, static_cast<uint32_t>(p.size()), alloc->cacheLen, capacity});
    } else if (op < 8 && !live.empty()) {  // a step of one request: its prompt, or one token
      Live& l = live[rng() % live.size()];
      uint32_t end;
      if (l.written < l.prompt) {
        end = l.prompt;  // the rest of the prompt
      } else if (l.tokens.size() == l.written) {
        if (l.tokens.size() < l.capacity) l.tokens.push_back(3000 + rng() % 2);  // sampled
        continue;
      } else {
        end = l.written + 1;  // the sampled token is fed
      }
      for (uint32_t pos = l.written; pos < end; ++pos) {
        const uint32_t block = l.alloc.blocks[pos / kBs];
        for (const Live& other : live) {
          if (&other == &l) continue;
          ASSERT_EQ(std::count(other.alloc.blocks.begin(), other.alloc.blocks.end(), block), 0)
              << "block " << block << " written while another request holds it";
        }
        kv[l.alloc.slots[pos]] = l.tokens[pos];
      }
      l.written = end;
      if (!l.published && l.written >= l.prompt) {
        a.publish(std::span<const uint32_t>(l.tokens).first(l.prompt), l.alloc.blocks);
        l.published = true;
      }
    } else if (!live.empty()) {  // a finish (or a cancel): what was written may be published
      const size_t i = rng() % live.size();
      Live& l = live[i];
      if (l.published && rng() % 2)
        a.publish(std::span<const uint32_t>(l.tokens).first(l.written), l.alloc.blocks);
      a.free(l.alloc.blocks);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    if (step % 5000 == 4999) {  // a shard failed: its requests fail, its memory is gone
      for (const Live& l : live) a.free(l.alloc.blocks);
      live.clear();
      a.dropCache();
      std::fill(kv.begin(), kv.end(), -1);
    }
    std::set<uint32_t> held;
    for (const Live& l : live) held.insert(l.alloc.blocks.begin(), l.alloc.blocks.end());
    ASSERT_EQ(a.freeBlocks() + held.size(), kBlocks - 1) << "step " << step;
  }
  EXPECT_GT(hits, 500u);
  for (const Live& l : live) a.free(l.alloc.blocks);
  EXPECT_EQ(a.freeBlocks(), kBlocks - 1);
}

}  // namespace
}  // namespace textgen::router
