#include "textgen/router/queue.h"

namespace textgen::router {

std::vector<BatchEntry> Queue::nextBatch(std::optional<size_t> minSize,
                                         std::optional<size_t> maxSize, uint32_t prefillTokenBudget,
                                         BlockAllocator& allocator, std::vector<uint64_t>* dropped,
                                         uint32_t reserveBlocks) {
  std::vector<BatchEntry> batch;
  // Requests whose client left go first, wherever they wait: not only once they reach the head
  // (a head that cannot get blocks would keep them, their sinks and connections, meanwhile).
  std::erase_if(entries_, [&](const QueueEntry& e) {
    if (!e.control || !e.control->cancelled()) return false;
    if (metrics_ && !e.control->superseded)
      metrics_->counterAdd("tgi_request_failure", 1, {{"err", "dropped"}});
    if (dropped) dropped->push_back(e.id);
    return true;
  });
  if (entries_.empty()) return batch;
  if (minSize && entries_.size() < *minSize) return batch;
  if (maxSize && *maxSize == 0) return batch;
  const uint32_t budget = (prefillTokenBudget + blockSize_ - 1) / blockSize_ * blockSize_;
  uint32_t prefillTokens = 0;
  while (!entries_.empty()) {
    QueueEntry entry = std::move(entries_.front());
    entries_.pop_front();
    if (entry.control && entry.control->cancelled()) {
      if (metrics_ && !entry.control->superseded)
        metrics_->counterAdd("tgi_request_failure", 1, {{"err", "dropped"}});
      if (dropped) dropped->push_back(entry.id);
      continue;
    }
    // Growing: the prompt and the first new token's position (the first decode writes it); a
    // resumed request's max_new_tokens counts the tokens it generated before.
    const bool grows = growing_ && entry.request.inputIds.size() == entry.request.inputLength;
    const uint32_t encoderPositions =
        (entry.request.inputLength + blockSize_ - 1) / blockSize_ * blockSize_;
    const uint32_t tokens =
        encoderDecoder_ ? encoderPositions + entry.request.maxNewTokens
        : grows         ? entry.request.inputLength + 1
                        : entry.request.inputLength - entry.generated + entry.request.maxNewTokens;
    // A request that wants its prompt's logprobs computes every prompt token: no cached prefix.
    const bool reuse = !encoderDecoder_ && !entry.request.decoderInputDetails &&
                       entry.request.inputIds.size() == entry.request.inputLength;
    const std::span<const uint32_t> prompt =
        reuse ? std::span<const uint32_t>(entry.request.inputIds) : std::span<const uint32_t>();
    std::optional<BlockAllocation> blocks = allocator.allocate(prompt, tokens);
    if (blocks && allocator.freeBlocks() < reserveBlocks) {
      allocator.free(blocks->blocks);
      blocks.reset();
    }
    if (!blocks) {  // not enough free blocks: wait for requests to finish
      entries_.push_front(std::move(entry));
      break;
    }
    const uint32_t postfix =
        entry.request.inputLength - blocks->cacheLen;  // what the shard computes
    if (prefillTokens + postfix > budget) {
      const uint32_t chunk = budget > prefillTokens ? budget - prefillTokens : 0;
      if (supportChunking_ && chunk > 0) {
        batch.push_back({std::move(entry), std::move(*blocks), chunk});
      } else {
        allocator.free(blocks->blocks);
        entries_.push_front(std::move(entry));
      }
      break;
    }
    prefillTokens += postfix;
    batch.push_back({std::move(entry), std::move(*blocks), std::nullopt});
    if (maxSize && batch.size() == *maxSize) break;
  }
  if (minSize && batch.size() < *minSize) {
    for (auto it = batch.rbegin(); it != batch.rend(); ++it) {
      allocator.free(it->blocks.blocks);
      entries_.push_front(std::move(it->entry));
    }
    batch.clear();
  }
  if (!batch.empty() && metrics_)
    metrics_->histogramObserve("tgi_batch_next_size", static_cast<double>(batch.size()));
  return batch;
}

}  // namespace textgen::router
