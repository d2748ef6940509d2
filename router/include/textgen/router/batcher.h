// Continuous batching for one replica group (TGI v3's batching task): a thread that takes batches
// from the queue, runs Prefill and Decode on the shards, merges new requests into the running batch
// under the budgets, streams every step's tokens to each request's sink as soon as the step
// returns, filters finished and disconnected requests (freeing their blocks), and fails the batch's
// requests when a shard fails.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "textgen/router/block_allocator.h"
#include "textgen/router/metrics.h"
#include "textgen/router/queue.h"
#include "textgen/router/shard_client.h"

namespace textgen::router {

// When a request entered the queue and when it entered a batch (TGI's queue time is the
// difference; its inference time runs from the batch), and how much of its prompt the prefix cache
// served.
struct RequestTimes {
  std::chrono::steady_clock::time_point queued;
  std::chrono::steady_clock::time_point batched;
  uint32_t cachedTokens = 0;  // OpenAI's usage.prompt_tokens_details.cached_tokens
};

// Receives one request's results, in order, on the batcher's delivery thread (or its batching
// thread with BatcherOptions::deliveryThread off). Implementations must not block.
class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  // One step's tokens for this request; `finished` when generation ended.
  virtual void onGeneration(const Generation& generation, const RequestTimes& times) = 0;
  // The request ended without a result: no more calls follow. CANCELLED when its client left
  // (nothing needs answering), INVALID_ARGUMENT when the shard refused it alone, any other code
  // when its batch failed.
  virtual void onError(const Status& error) = 0;
  // The request joined a batch (its queue and batch times; again after a preemption, with the
  // first admission's): for a trace whose request fails before its first token.
  virtual void onAdmitted(const RequestTimes& /*times*/) {}
};

struct BatcherOptions {
  uint32_t maxBatchPrefillTokens = 4096;
  uint32_t maxBatchTotalTokens = 16384;
  std::optional<size_t> maxBatchSize;
  float waitingServedRatio = 0.3f;
  uint32_t maxWaitingTokens = 20;
  bool supportChunking = false;
  // T5's shards (ShardInfo::encoderDecoder): a prompt's blocks are the encoder output's.
  bool encoderDecoder = false;
  // Tokens the shards may propose per request and step (Info.speculate): a step may write that many
  // positions past the request's last token, so its blocks cover them first.
  uint32_t speculate = 0;
  // Reuse cached prompt prefixes (cache_len); only when the shards honour it.
  bool prefixCaching = false;
  // Send each decode step while the one before it still runs on the shards (while nothing waits
  // in the queue), or at least before delivering its tokens.
  bool pipelineDecode = true;
  // With pipelineDecode: send it while the step before it runs, when it can be planned then.
  bool stepAhead = true;
  // Call the clients' sinks (tokens, errors) on a thread of their own, in order, so that SSE
  // formatting and socket writes stay off the batching thread. Off: on the batching thread, within
  // the step that produced them (tests that act from a callback at a known step).
  bool deliveryThread = true;
  // Give a request blocks for its prompt and extend them as it generates, preempting the most
  // recently admitted requests when blocks run out (vLLM); they are recomputed from their prompt
  // and the tokens generated so far. Only with chunking (a resumed input may exceed the prefill
  // budget). Off: blocks for prompt + max_new_tokens up front (TGI).
  bool growBlocks = true;
  // The replica's master address: the `replica` label of per-replica gauges.
  std::string name;
  uint32_t blockSize = 16;
  uint32_t numBlocks = 1024;
  // After a shard failure, run before the next batch (ClearCache + Warmup on a restarted shard). A
  // failure fails that batch's requests and keeps the replica unhealthy.
  std::function<Status()> recover;
};

class Batcher {
 public:
  // Sink calls queued for the delivery thread at most (BatcherOptions::deliveryThread): about one
  // per step, so stepping runs this far ahead of the slowest client callback, then waits for it.
  static constexpr size_t kMaxDeliveries = 64;
  Batcher(ShardGroup& shards, BatcherOptions options, MetricsRegistry* metrics);
  ~Batcher();  // stops the thread; in-flight requests get an error

  // Queues a validated request; the sink hears about it from the batcher's thread.
  void submit(uint64_t id, ValidRequest request, std::shared_ptr<RequestControl> control,
              std::shared_ptr<ResponseSink> sink);

  size_t queueSize() const;
  // Requests queued or running: the load used to pick a replica.
  size_t load() const { return load_.load(); }
  bool healthy() const { return healthy_.load(); }
  // Asks the batching thread to check an unhealthy replica again while nothing is queued (TGI's
  // health route runs a generation when the last one failed): recover() (ClearCache + Warmup, a
  // whole forward on every shard) once the shards answer Health, and healthy once it succeeds.
  // Without recover, or while healthy, nothing. At most one check a kMinProbeInterval; the route
  // answers from the flag. ~Batcher waits for a check under way (Warmup's deadline at most).
  void probe();
  static constexpr std::chrono::milliseconds kMinProbeInterval{1000};
  uint32_t freeBlocks() const;
  uint32_t cachedBlocks() const;
  uint32_t usableBlocks() const { return allocator_.usableBlocks(); }  // constant
  // Prompt tokens this replica's prefix cache holds for `prompt` now (for picking a replica).
  uint32_t cachedPrefix(std::span<const uint32_t> prompt) const;

 private:
  struct Active {
    BlockAllocation blocks;
    std::shared_ptr<RequestControl> control;
    std::shared_ptr<ResponseSink> sink;
    RequestTimes times;
    // The prompt, then each generated token: for publishing written blocks, for growing the block
    // table, and for resuming after preemption. Empty when the request has no token ids.
    std::vector<uint32_t> tokens;
    bool published = false;    // the prompt's blocks (after its prefill)
    uint32_t promptLen = 0;    // of tokens, as sent to the shards (a resumed request's included)
    uint32_t shardBlocks = 0;  // leading blocks of the table the shards know
    uint64_t admitted = 0;     // admission order: the newest is preempted first
    uint32_t generatedBefore = 0;  // tokens generated before its last preemption
    uint32_t maxNewTokens = 0;     // its max_new_tokens, over every admission
    ValidRequest request;          // its parameters, to queue it again (inputIds moved to tokens)
    std::optional<tracing::SpanContext> trace;  // its infer span, when traced
    // Whether its client left. The shared flag is read again only after some request's cancel()
    // since this one's last read (RequestControl::cancellations): a step over a few hundred
    // requests would otherwise miss the cache on every flag.
    bool leaving() {
      const uint64_t now = RequestControl::cancellations();
      if (now != seenCancellations) {
        seenCancellations = now;
        left = control && control->cancelled();
      }
      return left;
    }
    uint64_t seenCancellations = ~uint64_t{0};
    bool left = false;
  };

  void run();
  // Queues a call to clients' sinks for the delivery thread, which makes them in order, off the
  // batching thread (SSE formatting and socket writes stay out of its steps). Waits while
  // kMaxDeliveries are queued.
  void deliver(std::function<void()> fn);
  void deliverLoop();
  void sendLoop();  // a decode sender thread's loop
  // Runs one Prefill or Decode, timing the router's side of the step: the host time since the
  // previous step returned (textgen_batch_host_duration: delivering tokens, filtering, planning)
  // and the call's time beyond the shard's own total (textgen_batch_transport_duration: gRPC,
  // protobuf). With a span (stepSpan), the call is traced: the span's context travels to the
  // shards in the calls' metadata. A `queued` call (sent while the step before it runs) puts no
  // host time between steps; its wait on the shards is not transport.
  StatusOr<StepOutput> call(const char* method, std::optional<tracing::SpanData> span,
                            const std::function<StatusOr<StepOutput>()>& rpc, bool queued = false);
  // Sends a Decode of `batch` on a thread of its own. An invalid future when no thread can be had
  // for a pipelined one (order.after); an unpipelined one then runs on this thread.
  std::future<StatusOr<StepOutput>> launchDecode(const CachedBatch& batch,
                                                 std::vector<BlockExtension> extensions,
                                                 DecodeOrder order);
  // Whether the decode after the one in flight over `running` (as absorb() left it) can be sent
  // now, before that step returns: every request of it decodes one row and is still wanted, one at
  // least goes on past the step in flight, nobody waits in the queue, no speculation.
  bool mayStepAhead(const std::optional<CachedBatch>& running);
  // The span of a step over these requests when one of them is traced: a child of the first
  // traced request's infer span, linked to the others', carrying the batch size. On the batcher's
  // thread (it reads active_).
  std::optional<tracing::SpanData> stepSpan(const char* method,
                                            const std::vector<uint64_t>& ids) const;
  std::vector<BatchEntry> takeBatch(std::optional<size_t> minSize, std::optional<size_t> maxSize,
                                    uint32_t prefillBudget);
  // Delivers a step's output; returns the batch to keep running (after filtering), if any.
  // With mayFilter false (the next step already runs the batch) nothing is filtered: the requests
  // dropped here are filtered after that step.
  std::optional<CachedBatch> absorb(StatusOr<StepOutput> out, const char* method,
                                    bool mayFilter = true);
  // Whether the decode after `out` can be sent before `out` is delivered: a batch left, every
  // request in it still wanted, nobody waiting in the queue.
  bool pipelinable(const StatusOr<StepOutput>& out);
  // Blocks for the positions each request of `batch` writes next (its tokens so far, `pending`
  // adding a returned step's that absorb() has not seen yet), and the blocks the shards have not
  // heard of, as the extensions to send with that step. With `mayPreempt`, blocks that cannot be
  // had are taken from the most recently admitted requests of the batch: they are filtered out and
  // go back to the queue's head (nullopt batch when none is left). Without, nullopt when blocks
  // run short. Empty when blocks do not grow.
  // With `stepAhead`, a step of one token per request is still running: the blocks are those of
  // the step after it (none for a request that it ends by max_new_tokens).
  std::optional<std::vector<BlockExtension>> grow(std::optional<CachedBatch>& batch,
                                                  const StepOutput* pending, bool mayPreempt,
                                                  bool stepAhead = false);
  // Frees a running request's blocks (offering what it wrote to the prefix cache) and queues it
  // again at the head with its tokens so far as its prompt. Under mutex_.
  void preempt(uint64_t id);
  void failAll(const Status& error);
  void finish(uint64_t id);
  // Offers the blocks of the first `written` tokens of a running request to the prefix cache.
  void publish(Active& a, size_t written);
  // textgen_prefix_cache_blocks for this replica; under mutex_.
  void cacheGauge();
  // Ends one running request: frees its blocks, then tells its sink `why` (CANCELLED when its
  // client left, which is also counted as a "dropped" failure).
  void drop(uint64_t id, const Status& why);

  ShardGroup& shards_;
  BatcherOptions options_;
  MetricsRegistry* metrics_;
  mutable std::mutex mutex_;  // queue_, allocator_ and sinks_ between submit() and the thread
  std::condition_variable wake_;
  Queue queue_;
  BlockAllocator allocator_;
  std::map<uint64_t, std::shared_ptr<ResponseSink>> sinks_;  // queued, not yet batched
  std::unordered_map<uint64_t, Active> active_;              // batched: the thread's alone
  std::map<uint64_t, RequestTimes> resumed_;  // preempted, queued again: their first times
  uint64_t admissions_ = 0;
  bool preempted_ = false;  // the last grow() preempted
  std::atomic<size_t> load_{0};
  std::atomic<bool> healthy_{true};
  // failAll() calls so far: a step's caller tells from it whether that step failed every request
  // (healthy_ alone does not say: a later step sets it again).
  std::atomic<uint64_t> failures_{0};
  // The shards may hold a batch whose blocks this router freed (a batch they failed to clear):
  // recover() (or, without it, ClearCache of every batch) runs before the next batch. Cleared
  // only when that succeeds; the batching thread's alone.
  bool mustRecover_ = false;
  bool probe_ = false;                                 // probe() asked (under mutex_)
  std::chrono::steady_clock::time_point lastProbe_{};  // the thread's alone
  std::atomic<bool> stop_{false};
  uint64_t nextBatchId_ = 1;
  // When the last step returned (steady-clock nanoseconds; 0: idle since); written by whichever
  // thread ran it (the batching thread, or a pipelined step's).
  std::atomic<int64_t> lastStepEndNs_{0};
  uint64_t decodeSteps_ = 0;  // Decode calls numbered so far (DecodeOrder)
  std::mutex sendMu_;         // sends_, sendStop_
  std::condition_variable sendCv_;
  std::deque<std::packaged_task<StatusOr<StepOutput>()>> sends_;
  bool sendStop_ = false;
  std::vector<std::thread> senders_;
  std::mutex deliverMu_;  // deliveries_, deliverStop_
  std::condition_variable deliverCv_, deliverRoom_;
  std::deque<std::function<void()>> deliveries_;
  bool deliverStop_ = false;
  std::thread deliverer_;
  std::thread thread_;
};

}  // namespace textgen::router
