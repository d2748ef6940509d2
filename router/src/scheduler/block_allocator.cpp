#include "textgen/router/block_allocator.h"

#include "textgen/base/check.h"

namespace textgen::router {

BlockAllocator::BlockAllocator(uint32_t numBlocks, uint32_t blockSize)
    : numBlocks_(numBlocks), blockSize_(blockSize), inUse_(numBlocks, false) {
  TG_CHECK(blockSize > 0, "block size must be positive");
  for (uint32_t b = numBlocks; b > 1; --b) free_.push_back(b - 1);  // block 0 reserved
  if (numBlocks > 0) inUse_[0] = true;
}

std::optional<BlockAllocation> BlockAllocator::allocate(uint32_t tokens) {
  const uint32_t needed = (tokens + blockSize_ - 1) / blockSize_;
  if (needed == 0 || needed > free_.size()) return std::nullopt;
  BlockAllocation a;
  a.blocks.reserve(needed);
  for (uint32_t i = 0; i < needed; ++i) {
    const uint32_t b = free_.back();
    free_.pop_back();
    inUse_[b] = true;
    a.blocks.push_back(b);
  }
  a.slots.reserve(tokens);
  for (uint32_t p = 0; p < tokens; ++p)
    a.slots.push_back(a.blocks[p / blockSize_] * blockSize_ + p % blockSize_);
  return a;
}

void BlockAllocator::free(std::span<const uint32_t> blocks) {
  for (uint32_t b : blocks) {
    TG_CHECK(b > 0 && b < numBlocks_ && inUse_[b], "freeing block {} that is not allocated", b);
    inUse_[b] = false;
    free_.push_back(b);
  }
}

}  // namespace textgen::router
