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

// A cache line of its own: read every step, written rarely.
struct alignas(64) CancellationCount {
  std::atomic<uint64_t> n{0};
};

// Shared between the HTTP handler and the scheduler: the handler cancels when its client
// disconnects; the scheduler stops the request within one step.
struct RequestControl {
  void cancel() {
    cancelled_.store(true);
    cancellations_.n.fetch_add(1);  // after the flag: whoever sees the count sees the flag
  }
  bool cancelled() const { return cancelled_.load(); }
  // How many cancel() calls there have been, over every request: a scheduler that finds it
  // unchanged since it last read its requests' flags need not read them again (at a few hundred
  // rows, reading each flag every step is a cache miss each).
  static uint64_t cancellations() { return cancellations_.n.load(); }

  // Cancelled by its own route, not its client (a chat's tool-less rerun replaces it): not counted
  // as a dropped request.
  std::atomic<bool> superseded{false};

 private:
  std::atomic<bool> cancelled_{false};
  static inline CancellationCount cancellations_;
};

struct QueueEntry {
  uint64_t id = 0;
  ValidRequest request;
  std::shared_ptr<RequestControl> control;
  std::chrono::steady_clock::time_point queuedAt = std::chrono::steady_clock::now();
  // Resumed after preemption: the last `generated` of request.inputIds were generated for it
  // (request.inputLength counts them; max_new_tokens still counts from the original prompt).
  uint32_t generated = 0;
};

struct BatchEntry {
  QueueEntry entry;
  BlockAllocation blocks;
  std::optional<uint32_t> chunkLen;  // set when the prompt is prefilled in chunks
};

class Queue {
 public:
  // `growing`: a request gets blocks for its prompt and first new token only, and more as it
  // generates (the batcher extends them, preempting when they run out); otherwise blocks for
  // prompt + max_new_tokens up front (TGI).
  // `encoderDecoder` (T5): a request's prompt takes whole blocks of its own (the encoder's output)
  // before its decoder's positions, max_new_tokens of them (shard.proto ModelKind).
  Queue(uint32_t blockSize, bool supportChunking, MetricsRegistry* metrics = nullptr,
        bool growing = false, bool encoderDecoder = false)
      : blockSize_(blockSize),
        supportChunking_(supportChunking),
        growing_(growing),
        encoderDecoder_(encoderDecoder),
        metrics_(metrics) {}

  void append(QueueEntry entry) { entries_.push_back(std::move(entry)); }
  // A preempted request goes back to the head: it runs again before anything newer.
  void prepend(QueueEntry entry) { entries_.push_front(std::move(entry)); }
  bool growing() const { return growing_; }
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }

  // The next batch, or nothing (empty queue, too small for minSize, no blocks free). Requests whose
  // client went away are removed and, when `dropped` is given, listed there. A request is taken
  // only while `reserveBlocks` stay free after it (room for the running requests to grow).
  std::vector<BatchEntry> nextBatch(std::optional<size_t> minSize, std::optional<size_t> maxSize,
                                    uint32_t prefillTokenBudget, BlockAllocator& allocator,
                                    std::vector<uint64_t>* dropped = nullptr,
                                    uint32_t reserveBlocks = 0);

 private:
  uint32_t blockSize_;
  bool supportChunking_;
  bool growing_;
  bool encoderDecoder_;
  MetricsRegistry* metrics_;
  std::deque<QueueEntry> entries_;
};

}  // namespace textgen::router
