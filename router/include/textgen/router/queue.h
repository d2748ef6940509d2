// The FIFO of validated requests waiting for a batch, and TGI v3's next_batch: pop from the front
// under the prefill-token budget (padded to whole blocks), the batch size limits and the free KV
// blocks, chunking the last request when the shards support it. Requests whose client went away
// are dropped here. Not thread-safe: owned by one replica group's batching loop (entries arrive
// through append() under the owner's lock).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "textgen/router/block_allocator.h"
#include "textgen/router/metrics.h"
#include "textgen/router/validation.h"

namespace textgen::router {

// Shared between the HTTP handler and the scheduler: the handler sets `cancelled` when its client
// disconnects; the scheduler stops the request within one step.
struct RequestControl {
  std::atomic<bool> cancelled{false};
};

struct QueueEntry {
  uint64_t id = 0;
  ValidRequest request;
  std::shared_ptr<RequestControl> control;
  std::chrono::steady_clock::time_point queuedAt = std::chrono::steady_clock::now();
};

struct BatchEntry {
  QueueEntry entry;
  BlockAllocation blocks;
  std::optional<uint32_t> chunkLen;  // set when the prompt is prefilled in chunks
};

class Queue {
 public:
  Queue(uint32_t blockSize, bool supportChunking, MetricsRegistry* metrics = nullptr)
      : blockSize_(blockSize), supportChunking_(supportChunking), metrics_(metrics) {}

  void append(QueueEntry entry) { entries_.push_back(std::move(entry)); }
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }

  // The next batch, or nothing (empty queue, too small for minSize, no blocks free). Requests whose
  // client went away are removed and, when `dropped` is given, listed there.
  std::vector<BatchEntry> nextBatch(std::optional<size_t> minSize, std::optional<size_t> maxSize,
                                    uint32_t prefillTokenBudget, BlockAllocator& allocator,
                                    std::vector<uint64_t>* dropped = nullptr);

 private:
  uint32_t blockSize_;
  bool supportChunking_;
  MetricsRegistry* metrics_;
  std::deque<QueueEntry> entries_;
};

}  // namespace textgen::router
