// TGI v3's next_batch: budgets, block shortfall, chunking, min/max size and dropped clients.
#include "textgen/router/queue.h"

#include <gtest/gtest.h>

namespace textgen::router {
namespace {

QueueEntry entry(uint64_t id, uint32_t input, uint32_t maxNew,
                 std::shared_ptr<RequestControl> c = nullptr) {
  QueueEntry e;
  e.id = id;
  e.request.inputLength = input;
  e.request.inputIds.assign(input, 5);
  e.request.maxNewTokens = maxNew;
  e.control = std::move(c);
  return e;
}

std::vector<uint64_t> ids(const std::vector<BatchEntry>& b) {
  std::vector<uint64_t> out;
  for (const auto& e : b) out.push_back(e.entry.id);
  return out;
}

TEST(QueueTest, PrefillBudgetStopsTheBatchWithoutChunking) {
  Queue q(16, /*supportChunking=*/false);
  BlockAllocator blocks(100, 16);
  for (uint64_t i = 1; i <= 3; ++i) q.append(entry(i, 20, 10));
  auto b = q.nextBatch(std::nullopt, std::nullopt, 40, blocks);  // 20 + 20 fit, the third waits
  EXPECT_EQ(ids(b), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(q.size(), 1u);
  EXPECT_EQ(blocks.freeBlocks(),
            99u - 2 * 2);  // each holds 30 tokens: 2 blocks; the third's were returned
}

TEST(QueueTest, AnEncoderDecoderPromptTakesWholeBlocksBeforeItsDecoderPositions) {
  // T5: a 20-token prompt's encoder output takes 2 blocks of 16 of its own, then max_new_tokens 10
  // decoder positions a third; decoder-only, 30 positions take 2. Never a cached prefix.
  Queue q(16, /*supportChunking=*/false, nullptr, /*growing=*/false, /*encoderDecoder=*/true);
  BlockAllocator blocks(100, 16, /*prefixCaching=*/true);
  q.append(entry(1, 20, 10));
  q.append(entry(2, 16, 17));  // 1 block + 2 blocks
  auto b = q.nextBatch(std::nullopt, std::nullopt, 4096, blocks);
  ASSERT_EQ(ids(b), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(b[0].blocks.blocks.size(), 3u);
  EXPECT_EQ(b[1].blocks.blocks.size(), 3u);
  EXPECT_EQ(b[0].blocks.cacheLen, 0u);
  blocks.publish(b[0].entry.request.inputIds, b[0].blocks.blocks);
  q.append(entry(3, 20, 10));  // the same prompt: still computed anew
  auto again = q.nextBatch(std::nullopt, std::nullopt, 4096, blocks);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].blocks.cacheLen, 0u);
}

TEST(QueueTest, BudgetIsPaddedToWholeBlocks) {
  Queue q(16, false);
  BlockAllocator blocks(100, 16);
  q.append(entry(1, 30, 1));
  q.append(entry(2, 2, 1));
  auto b = q.nextBatch(std::nullopt, std::nullopt, 20, blocks);  // 20 -> 32: both fit
  EXPECT_EQ(ids(b), (std::vector<uint64_t>{1, 2}));
}

TEST(QueueTest, ChunkingFillsTheBudgetExactly) {
  Queue q(4, /*supportChunking=*/true);
  BlockAllocator blocks(100, 4);
  q.append(entry(1, 10, 2));
  q.append(entry(2, 30, 2));
  q.append(entry(3, 5, 2));
  auto b = q.nextBatch(std::nullopt, std::nullopt, 24, blocks);
  ASSERT_EQ(ids(b), (std::vector<uint64_t>{1, 2}));
  EXPECT_FALSE(b[0].chunkLen.has_value());
  EXPECT_EQ(b[1].chunkLen, 14u);  // 24 - 10
  EXPECT_EQ(q.size(), 1u);
}

TEST(QueueTest, BlockShortfallWaitsInOrder) {
  Queue q(16, false);
  BlockAllocator blocks(4, 16);  // 3 usable blocks
  q.append(entry(1, 16, 16));    // 2 blocks
  q.append(entry(2, 16, 16));    // 2 blocks: does not fit yet
  q.append(entry(3, 1, 1));      // would fit, but FIFO order holds
  auto b = q.nextBatch(std::nullopt, std::nullopt, 1000, blocks);
  EXPECT_EQ(ids(b), (std::vector<uint64_t>{1}));
  EXPECT_EQ(q.size(), 2u);
  blocks.free(b[0].blocks.blocks);
  EXPECT_EQ(ids(q.nextBatch(std::nullopt, std::nullopt, 1000, blocks)),
            (std::vector<uint64_t>{2, 3}));
}

TEST(QueueTest, MinAndMaxSize) {
  Queue q(16, false);
  BlockAllocator blocks(100, 16);
  for (uint64_t i = 1; i <= 5; ++i) q.append(entry(i, 4, 4));
  EXPECT_TRUE(q.nextBatch(6, std::nullopt, 1000, blocks).empty());  // fewer than min waiting
  EXPECT_EQ(blocks.freeBlocks(), 99u);
  EXPECT_EQ(ids(q.nextBatch(2, 3, 1000, blocks)), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_TRUE(q.nextBatch(std::nullopt, 0, 1000, blocks).empty());
  // min_size not reachable under the budget (one 16-token block fits one 10-token prompt):
  // everything goes back in order, blocks too.
  Queue r(16, false);
  r.append(entry(7, 10, 4));
  r.append(entry(8, 10, 4));
  const uint32_t before = blocks.freeBlocks();
  EXPECT_TRUE(r.nextBatch(2, std::nullopt, 4, blocks).empty());
  EXPECT_EQ(blocks.freeBlocks(), before);
  EXPECT_EQ(ids(r.nextBatch(std::nullopt, std::nullopt, 100, blocks)),
            (std::vector<uint64_t>{7, 8}));
}

TEST(QueueTest, DroppedClientsAreSkippedAndCounted) {
  MetricsRegistry m;
  Queue q(16, false, &m);
  BlockAllocator blocks(100, 16);
  auto gone = std::make_shared<RequestControl>();
  gone->cancel();
  q.append(entry(1, 4, 4, gone));
  q.append(entry(2, 4, 4, std::make_shared<RequestControl>()));
  EXPECT_EQ(ids(q.nextBatch(std::nullopt, std::nullopt, 100, blocks)), (std::vector<uint64_t>{2}));
  EXPECT_NE(m.render().find("tgi_request_failure{err=\"dropped\"} 1"), std::string::npos);
  EXPECT_NE(m.render().find("tgi_batch_next_size_count 1"), std::string::npos);
}

TEST(QueueTest, ClientsThatLeftAreDroppedEvenBehindAHeadThatWaitsForBlocks) {
  Queue q(16, false);
  BlockAllocator blocks(4, 16);                                    // 3 usable blocks: 48 tokens
  q.append(entry(1, 40, 40, std::make_shared<RequestControl>()));  // needs 5 blocks: waits
  auto gone = std::make_shared<RequestControl>();
  q.append(entry(2, 4, 4, gone));
  gone->cancel();
  std::vector<uint64_t> dropped;
  EXPECT_TRUE(q.nextBatch(std::nullopt, std::nullopt, 100, blocks, &dropped).empty());
  EXPECT_EQ(dropped, std::vector<uint64_t>{2});  // not held until request 1 gets its blocks
  EXPECT_EQ(q.size(), 1u);
}

}  // namespace
}  // namespace textgen::router
