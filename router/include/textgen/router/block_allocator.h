// The router-owned KV-cache block allocator (TGI v3): the shards hold the memory, the router
// decides which blocks and slots each request may use. Block 0 is reserved (TGI keeps it for health
// checks). Running out of blocks is not an error: allocate() returns nothing and the scheduler
// waits. Not thread-safe: owned by one replica group's batching loop.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace textgen::router {

struct BlockAllocation {
  std::vector<uint32_t> blocks;
  std::vector<uint32_t> slots;  // one per token position: block * blockSize + offset
};

class BlockAllocator {
 public:
  BlockAllocator(uint32_t numBlocks, uint32_t blockSize);

  // Blocks for `tokens` positions (prompt + max_new_tokens), or nothing when too few are free.
  std::optional<BlockAllocation> allocate(uint32_t tokens);
  void free(std::span<const uint32_t> blocks);

  uint32_t freeBlocks() const { return static_cast<uint32_t>(free_.size()); }
  uint32_t totalBlocks() const { return numBlocks_; }
  uint32_t blockSize() const { return blockSize_; }

 private:
  uint32_t numBlocks_;
  uint32_t blockSize_;
  std::vector<uint32_t> free_;  // a stack; lowest ids handed out first
  std::vector<bool> inUse_;
};

}  // namespace textgen::router
