// The router-owned KV-cache block allocator (TGI v3): the shards hold the memory, the router
// decides which blocks and slots each request may use. Block 0 is reserved (TGI keeps it for health
// checks). Running out of blocks is not an error: allocate() returns nothing and the scheduler
// waits. Not thread-safe: owned by one replica group's batching loop.
//
// Prefix caching (on when the shards honour cache_len): blocks whose KV entries hold a known token
// sequence are kept in a radix tree after their request ends. Each edge is one full block, keyed by
// a hash of its tokens (the tokens themselves are compared on a match, so a hash collision is a
// miss, never a wrong reuse); a path from the root is a prefix. A request whose prompt starts with
// a cached path gets those blocks first in its table and cache_len covering them, so the shard
// computes only the rest.
// - Blocks are reference-counted: a cached block may sit in any number of live block tables. A
//   request writes only positions from its cache_len on, which lie in blocks it got fresh; a block
//   enters the tree only once its tokens are written (publish()), and its writer never writes it
//   again. So no block is written while shared.
// - Unreferenced cached blocks are evicted least recently used first, leaves before their parents,
//   when fresh blocks run short. A referenced block is never evicted.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <span>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace textgen::router {

struct BlockAllocation {
  std::vector<uint32_t> blocks;
  std::vector<uint32_t> slots;  // one per token position: block * blockSize + offset
  // Leading prompt tokens whose KV entries the first blocks already hold (a prefix-cache hit): a
  // whole number of blocks, always below the prompt's length (the shard computes at least one).
  uint32_t cacheLen = 0;
};

class BlockAllocator {
 public:
  BlockAllocator(uint32_t numBlocks, uint32_t blockSize, bool prefixCaching = false);

  // Blocks for `tokens` positions (prompt + max_new_tokens), or nothing when too few are free.
  std::optional<BlockAllocation> allocate(uint32_t tokens);
  // The same for a request whose prompt is `prompt` (tokens >= prompt.size()): with prefix caching,
  // the longest cached prefix of the prompt leads the block table and sets cacheLen. Cached blocks
  // nobody references are evicted to make room.
  std::optional<BlockAllocation> allocate(std::span<const uint32_t> prompt, uint32_t tokens);
  // Grows a live allocation to hold `tokens` positions: fresh blocks are appended (evicting cached
  // blocks nobody holds when free ones run short), with their slots. False, and nothing changed,
  // when too few blocks can be had.
  bool extend(BlockAllocation& allocation, uint32_t tokens);
  // Releases one reference to each block: a block nobody holds goes back to the free list, or stays
  // cached (evictable) when it is in the tree.
  void free(std::span<const uint32_t> blocks);

  // Records that `blocks` (a live allocation, in table order) hold the KV entries of `tokens` from
  // position 0: every full block enters the tree, after the cached prefix it may already share.
  // Stops at the first block whose place in the tree another block already holds. No-op without
  // prefix caching.
  void publish(std::span<const uint32_t> tokens, std::span<const uint32_t> blocks);
  // Tokens of `prompt` that allocate() would take from the cache now (for picking a replica).
  uint32_t cachedPrefix(std::span<const uint32_t> prompt) const;
  // Forgets every cached prefix (the shards' KV memory was lost or overwritten): unreferenced
  // cached blocks are freed; referenced ones are freed when their holders let go.
  void dropCache();

  // Blocks allocate() can hand out: free ones plus evictable cached ones.
  uint32_t freeBlocks() const;
  // Free blocks that hold no cached prefix: taking them evicts nothing.
  uint32_t idleBlocks() const { return static_cast<uint32_t>(free_.size()); }
  // Blocks in the prefix tree, referenced or not.
  uint32_t cachedBlocks() const { return cached_; }
  uint32_t totalBlocks() const { return numBlocks_; }
  // Blocks requests can hold: all but block 0, which is reserved.
  uint32_t usableBlocks() const { return numBlocks_ > 0 ? numBlocks_ - 1 : 0; }
  uint32_t blockSize() const { return blockSize_; }
  bool prefixCaching() const { return prefixCaching_; }

 private:
  static constexpr uint32_t kRoot = 0;  // block 0 is reserved, so it names the tree's root

  struct Node {
    bool cached = false;
    uint32_t parent = kRoot;
    uint32_t depth = 0;  // blocks above this one
    uint64_t key = 0;
    uint64_t lastUse = 0;
    std::vector<uint32_t> tokens;                     // blockSize of them
    std::unordered_map<uint64_t, uint32_t> children;  // key -> block
  };
  // Evictable blocks, the least recently used first; on a tie the deeper first (a path is touched
  // as a whole, so a parent's lastUse is never below a child's).
  using EvictKey = std::tuple<uint64_t, uint32_t, uint32_t>;  // lastUse, ~depth, block

  uint64_t hashBlock(std::span<const uint32_t> tokens) const;
  // The cached blocks that hold prompt's leading full blocks, at most `limit` of them.
  std::vector<uint32_t> match(std::span<const uint32_t> prompt, size_t limit) const;
  std::optional<uint32_t> child(uint32_t parent, std::span<const uint32_t> tokens,
                                uint64_t key) const;
  EvictKey evictKey(uint32_t block) const;
  void evictOne();
  void unlink(uint32_t block);

  uint32_t numBlocks_;
  uint32_t blockSize_;
  bool prefixCaching_;
  uint64_t seed_;
  uint64_t clock_ = 0;
  uint32_t cached_ = 0;
  std::vector<uint32_t> free_;  // a stack; lowest ids handed out first
  std::vector<uint32_t> refs_;  // live allocations holding each block
  std::vector<Node> nodes_;     // by block; nodes_[kRoot].children are the first blocks
  std::set<EvictKey> evictable_;
};

}  // namespace textgen::router
