#include "textgen/router/block_allocator.h"

#include <algorithm>
#include <random>

#include "textgen/base/check.h"

namespace textgen::router {

BlockAllocator::BlockAllocator(uint32_t numBlocks, uint32_t blockSize, bool prefixCaching)
    : numBlocks_(numBlocks),
      blockSize_(blockSize),
      prefixCaching_(prefixCaching),
      seed_(std::random_device{}() | (static_cast<uint64_t>(std::random_device{}()) << 32)),
      refs_(numBlocks, 0),
      nodes_(std::max<uint32_t>(numBlocks, 1)) {
  TG_CHECK(blockSize > 0, "block size must be positive");
  for (uint32_t b = numBlocks; b > 1; --b) free_.push_back(b - 1);  // block 0 reserved
  if (numBlocks > 0) refs_[0] = 1;
}

uint32_t BlockAllocator::freeBlocks() const {
  return static_cast<uint32_t>(free_.size() + evictable_.size());
}

uint64_t BlockAllocator::hashBlock(std::span<const uint32_t> tokens) const {
  // A seeded multiply-xorshift mix: the key only finds the candidate child; the tokens decide.
  uint64_t h = seed_ ^ (tokens.size() * 0x9E3779B97F4A7C15ull);
  for (uint32_t t : tokens) {
    h ^= t + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  return h;
}

std::optional<uint32_t> BlockAllocator::child(uint32_t parent, std::span<const uint32_t> tokens,
                                              uint64_t key) const {
  const auto& children = nodes_[parent].children;
  auto it = children.find(key);
  if (it == children.end()) return std::nullopt;
  const Node& n = nodes_[it->second];
  if (!std::equal(tokens.begin(), tokens.end(), n.tokens.begin(), n.tokens.end()))
    return std::nullopt;  // a hash collision: a miss
  return it->second;
}

std::vector<uint32_t> BlockAllocator::match(std::span<const uint32_t> prompt, size_t limit) const {
  std::vector<uint32_t> path;
  if (!prefixCaching_ || nodes_.empty()) return path;
  uint32_t parent = kRoot;
  for (size_t i = 0; i < limit; ++i) {
    const auto tokens = prompt.subspan(i * blockSize_, blockSize_);
    const std::optional<uint32_t> b = child(parent, tokens, hashBlock(tokens));
    if (!b) break;
    path.push_back(*b);
    parent = *b;
  }
  return path;
}

uint32_t BlockAllocator::cachedPrefix(std::span<const uint32_t> prompt) const {
  if (prompt.empty()) return 0;
  return static_cast<uint32_t>(match(prompt, (prompt.size() - 1) / blockSize_).size()) * blockSize_;
}

BlockAllocator::EvictKey BlockAllocator::evictKey(uint32_t block) const {
  const Node& n = nodes_[block];
  return {n.lastUse, ~n.depth, block};
}

std::optional<BlockAllocation> BlockAllocator::allocate(uint32_t tokens) {
  return allocate({}, tokens);
}

std::optional<BlockAllocation> BlockAllocator::allocate(std::span<const uint32_t> prompt,
                                                        uint32_t tokens) {
  TG_CHECK(prompt.size() <= tokens, "a prompt of {} tokens in an allocation of {}", prompt.size(),
           tokens);
  const uint32_t needed = (tokens + blockSize_ - 1) / blockSize_;
  if (needed == 0) return std::nullopt;
  // At least one prompt token is left to compute: the shard samples the first token from it.
  const size_t limit = prompt.empty() ? 0 : (prompt.size() - 1) / blockSize_;
  const std::vector<uint32_t> hit = match(prompt, limit);
  const size_t fresh = needed - hit.size();
  size_t hitEvictable = 0;  // matched blocks nobody holds: they stop being evictable below
  for (uint32_t b : hit) hitEvictable += refs_[b] == 0;
  if (fresh > free_.size() + evictable_.size() - hitEvictable) return std::nullopt;

  ++clock_;
  BlockAllocation a;
  a.blocks.reserve(needed);
  for (uint32_t b : hit) {
    if (refs_[b] == 0) evictable_.erase(evictKey(b));
    ++refs_[b];
    nodes_[b].lastUse = clock_;
    a.blocks.push_back(b);
  }
  while (free_.size() < fresh) evictOne();
  for (size_t i = 0; i < fresh; ++i) {
    const uint32_t b = free_.back();
    free_.pop_back();
    refs_[b] = 1;
    a.blocks.push_back(b);
  }
  a.cacheLen = static_cast<uint32_t>(hit.size()) * blockSize_;
  a.slots.reserve(tokens);
  for (uint32_t p = 0; p < tokens; ++p)
    a.slots.push_back(a.blocks[p / blockSize_] * blockSize_ + p % blockSize_);
  return a;
}

bool BlockAllocator::extend(BlockAllocation& a, uint32_t tokens) {
  const size_t needed = (size_t{tokens} + blockSize_ - 1) / blockSize_;
  if (needed <= a.blocks.size()) return true;
  const size_t fresh = needed - a.blocks.size();
  if (fresh > free_.size() + evictable_.size()) return false;
  while (free_.size() < fresh) evictOne();
  for (size_t i = 0; i < fresh; ++i) {
    const uint32_t b = free_.back();
    free_.pop_back();
    refs_[b] = 1;
    a.blocks.push_back(b);
  }
  for (size_t p = a.slots.size(); p < needed * blockSize_; ++p)
    a.slots.push_back(a.blocks[p / blockSize_] * blockSize_ + p % blockSize_);
  return true;
}

void BlockAllocator::unlink(uint32_t block) {
  Node& n = nodes_[block];
  nodes_[n.parent].children.erase(n.key);
  n.cached = false;
  n.tokens.clear();
  n.tokens.shrink_to_fit();
  --cached_;
}

void BlockAllocator::evictOne() {
  TG_CHECK(!evictable_.empty(), "no cached block to evict");
  const uint32_t b = std::get<2>(*evictable_.begin());
  TG_CHECK(refs_[b] == 0 && nodes_[b].cached && nodes_[b].children.empty(),
           "evicting block {}, which is held or has cached children", b);
  evictable_.erase(evictable_.begin());
  unlink(b);
  free_.push_back(b);
}

void BlockAllocator::free(std::span<const uint32_t> blocks) {
  for (uint32_t b : blocks) {
    TG_CHECK(b > 0 && b < numBlocks_ && refs_[b] > 0, "freeing block {} that is not allocated", b);
    if (--refs_[b] > 0) continue;
    if (nodes_[b].cached) {
      evictable_.insert(evictKey(b));
    } else {
      free_.push_back(b);
    }
  }
}

void BlockAllocator::publish(std::span<const uint32_t> tokens, std::span<const uint32_t> blocks) {
  if (!prefixCaching_) return;
  const size_t full = std::min(tokens.size() / blockSize_, blocks.size());
  ++clock_;
  uint32_t parent = kRoot;
  std::vector<uint32_t> path;
  for (size_t i = 0; i < full; ++i) {
    const uint32_t b = blocks[i];
    TG_CHECK(b > 0 && b < numBlocks_ && refs_[b] > 0, "publishing block {} that is not allocated",
             b);
    const auto t = tokens.subspan(i * blockSize_, blockSize_);
    const uint64_t key = hashBlock(t);
    if (std::optional<uint32_t> c = child(parent, t, key)) {
      if (*c != b) break;  // another request's copy of this block is cached: ours stays private
    } else {
      // A different block (or a colliding key) in this place, or ours cached elsewhere: stop.
      if (nodes_[b].cached || nodes_[parent].children.contains(key)) break;
      Node& n = nodes_[b];
      n.cached = true;
      n.parent = parent;
      n.depth = static_cast<uint32_t>(i);
      n.key = key;
      n.tokens.assign(t.begin(), t.end());
      nodes_[parent].children.emplace(key, b);
      ++cached_;
    }
    path.push_back(b);
    parent = b;
  }
  // The whole path shares one time, so a parent is never older than its children.
  for (uint32_t b : path) nodes_[b].lastUse = clock_;
}

void BlockAllocator::dropCache() {
  for (uint32_t b = 1; b < numBlocks_; ++b) {
    Node& n = nodes_[b];
    if (!n.cached) continue;
    n = Node{};
    if (refs_[b] == 0) free_.push_back(b);
  }
  nodes_[kRoot].children.clear();
  evictable_.clear();
  cached_ = 0;
}

}  // namespace textgen::router
