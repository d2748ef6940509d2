#include "textgen/router/batcher.h"

#include <cmath>
#include <future>
#include <random>
#include <system_error>
#include <unordered_set>
#include <utility>

#include "textgen/base/log.h"
#include "textgen/base/thread_name.h"

namespace textgen::router {

Batcher::Batcher(ShardGroup& shards, BatcherOptions options, MetricsRegistry* metrics)
    : shards_(shards),
      options_(options),
      metrics_(metrics),
      // A resumed request's input is its prompt and its answer so far: it may exceed the
      // prefill-token budget, which only chunked prefill can take. So blocks grow only with it.
      queue_(options.blockSize, options.supportChunking, metrics,
             options.growBlocks && options.supportChunking && !options.encoderDecoder,
             options.encoderDecoder),
      allocator_(options.numBlocks, options.blockSize, options.prefixCaching) {
  if (options_.deliveryThread)
    deliverer_ = std::thread([this] {
      setThreadName("tg-deliver");
      deliverLoop();
    });
  // Decode calls run on threads of their own, two at most at a time (the step in flight and the
  // one sent after it): started once, not per step.
  try {
    for (int i = 0; i < 2; ++i)
      senders_.emplace_back([this] {
        setThreadName("tg-send");
        sendLoop();
      });
  } catch (const std::system_error& e) {
    spdlog::warn("decode sender threads: {}; stepping without pipelining", e.what());
  }
  // Decode numbers start at a random point: a call of an earlier router delayed on the network
  // does not match this one's.
  std::random_device seed;
  decodeSteps_ = ((uint64_t{seed()} << 32) | seed()) >> 2;
  try {
    thread_ = std::thread([this] {
      setThreadName("tg-batcher");
      run();
    });
  } catch (...) {
    {
      std::lock_guard lock(sendMu_);
      sendStop_ = true;
    }
    sendCv_.notify_all();
    for (std::thread& t : senders_) t.join();
    {
      std::lock_guard lock(deliverMu_);
      deliverStop_ = true;
    }
    deliverCv_.notify_all();
    if (deliverer_.joinable()) deliverer_.join();
    throw;
  }
}

Batcher::~Batcher() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();  // every decode it sent was waited for
  {
    std::lock_guard lock(sendMu_);
    sendStop_ = true;
  }
  sendCv_.notify_all();
  for (std::thread& t : senders_) t.join();
  failAll(unavailableError("the router is shutting down"));
  std::map<uint64_t, std::shared_ptr<ResponseSink>> queued;
  {
    std::lock_guard lock(mutex_);
    queued.swap(sinks_);
  }
  for (auto& [id, sink] : queued)  // outside mutex_: deliver() may wait for room
    deliver([sink] { sink->onError(unavailableError("the router is shutting down")); });
  {
    std::lock_guard lock(deliverMu_);
    deliverStop_ = true;
  }
  deliverCv_.notify_all();
  if (deliverer_.joinable()) deliverer_.join();  // after every queued delivery ran
}

void Batcher::deliver(std::function<void()> fn) {
  if (!options_.deliveryThread) {
    fn();
    return;
  }
  std::unique_lock lock(deliverMu_);
  // Bounded: when clients' callbacks fall this far behind, stepping waits for them.
  deliverRoom_.wait(lock, [&] { return deliveries_.size() < kMaxDeliveries; });
  deliveries_.push_back(std::move(fn));
  lock.unlock();
  deliverCv_.notify_one();
}

void Batcher::deliverLoop() {
  std::unique_lock lock(deliverMu_);
  while (true) {
    deliverCv_.wait(lock, [&] { return deliverStop_ || !deliveries_.empty(); });
    if (deliveries_.empty()) return;  // stopping, every delivery made
    std::function<void()> fn = std::move(deliveries_.front());
    deliveries_.pop_front();
    lock.unlock();
    deliverRoom_.notify_one();
    fn();
    fn = nullptr;  // the sinks it held go before the lock is taken again
    lock.lock();
  }
}

void Batcher::submit(uint64_t id, ValidRequest request, std::shared_ptr<RequestControl> control,
                     std::shared_ptr<ResponseSink> sink) {
  {
    std::lock_guard lock(mutex_);
    sinks_[id] = std::move(sink);
    queue_.append({id, std::move(request), std::move(control), std::chrono::steady_clock::now()});
    ++load_;
    if (metrics_) metrics_->gaugeSet("tgi_queue_size", static_cast<double>(queue_.size()));
  }
  wake_.notify_one();
}

size_t Batcher::queueSize() const {
  std::lock_guard lock(mutex_);
  return queue_.size();
}

uint32_t Batcher::freeBlocks() const {
  std::lock_guard lock(mutex_);
  return allocator_.freeBlocks();
}

uint32_t Batcher::cachedBlocks() const {
  std::lock_guard lock(mutex_);
  return allocator_.cachedBlocks();
}

uint32_t Batcher::cachedPrefix(std::span<const uint32_t> prompt) const {
  std::lock_guard lock(mutex_);
  return allocator_.cachedPrefix(prompt);
}

namespace {

Status clientLeft() {
  return Status(StatusCode::kCancelled, "the client disconnected");
}

}  // namespace

std::vector<BatchEntry> Batcher::takeBatch(std::optional<size_t> minSize,
                                           std::optional<size_t> maxSize, uint32_t prefillBudget) {
  std::vector<std::shared_ptr<ResponseSink>> left;
  std::vector<std::pair<std::shared_ptr<ResponseSink>, RequestTimes>> admitted;
  std::vector<BatchEntry> batch;
  {
    std::lock_guard lock(mutex_);
    std::vector<uint64_t> dropped;
    // While requests run, admission leaves 1% of the blocks free for them to grow into (vLLM's
    // watermark), so a newcomer is not preempted at once.
    const uint32_t reserve =
        queue_.growing() && !active_.empty() ? std::max<uint32_t>(1, options_.numBlocks / 100) : 0;
    batch = queue_.nextBatch(minSize, maxSize, prefillBudget, allocator_, &dropped, reserve);
    for (uint64_t id : dropped) {  // their clients left while they waited
      left.push_back(std::move(sinks_[id]));
      sinks_.erase(id);
      resumed_.erase(id);
      --load_;
    }
    uint64_t queried = 0, hit = 0;
    for (const BatchEntry& e : batch) {
      const ValidRequest& v = e.entry.request;
      Active& a = active_[e.entry.id];
      a = {};
      a.blocks = e.blocks;
      a.control = e.entry.control;
      a.sink = sinks_[e.entry.id];
      a.times = {e.entry.queuedAt, std::chrono::steady_clock::now(), e.blocks.cacheLen};
      if (auto r = resumed_.find(e.entry.id); r != resumed_.end()) {
        a.times = r->second;  // its first admission's times and cache hit
        resumed_.erase(r);
      } else {
        queried += v.inputLength;
        hit += e.blocks.cacheLen;
      }
      if (v.inputIds.size() == v.inputLength) a.tokens = v.inputIds;
      a.promptLen = v.inputLength;
      a.shardBlocks = static_cast<uint32_t>(e.blocks.blocks.size());
      a.admitted = ++admissions_;
      a.generatedBefore = e.entry.generated;
      a.maxNewTokens = v.maxNewTokens;
      a.trace = v.trace;
      if (queue_.growing()) {
        a.request = v;
        a.request.inputIds.clear();  // kept in tokens
      }
      if (a.sink) admitted.emplace_back(a.sink, a.times);
      sinks_.erase(e.entry.id);
    }
    if (metrics_) {
      metrics_->gaugeSet("tgi_queue_size", static_cast<double>(queue_.size()));
      if (allocator_.prefixCaching() && !batch.empty()) {
        cacheGauge();  // allocations may have evicted
        metrics_->counterAdd("textgen_prefix_cache_queried_tokens_total",
                             static_cast<double>(queried));
        metrics_->counterAdd("textgen_prefix_cache_hit_tokens_total", static_cast<double>(hit));
      }
    }
  }
  if (!left.empty() || !admitted.empty()) {
    deliver([left = std::move(left), admitted = std::move(admitted)] {
      for (auto& sink : left) sink->onError(clientLeft());  // the queue counted them as dropped
      for (auto& [sink, times] : admitted) sink->onAdmitted(times);
    });
  }
  return batch;
}

void Batcher::drop(uint64_t id, const Status& why) {
  auto it = active_.find(id);
  if (it == active_.end()) return;
  const std::shared_ptr<ResponseSink> sink = it->second.sink;
  const bool superseded = it->second.control && it->second.control->superseded;
  finish(id);  // the blocks are free before the sink hears
  if (metrics_ && why.code() == StatusCode::kCancelled && !superseded)
    metrics_->counterAdd("tgi_request_failure", 1, {{"err", "dropped"}});
  deliver([sink, why] { sink->onError(why); });
}

void Batcher::publish(Active& a, size_t written) {
  if (a.tokens.empty() || !allocator_.prefixCaching()) return;
  std::lock_guard lock(mutex_);
  allocator_.publish(std::span<const uint32_t>(a.tokens).first(std::min(written, a.tokens.size())),
                     a.blocks.blocks);
  cacheGauge();
}

void Batcher::cacheGauge() {
  if (metrics_ && allocator_.prefixCaching())
    metrics_->gaugeSet("textgen_prefix_cache_blocks", allocator_.cachedBlocks(),
                       {{"replica", options_.name}});
}

void Batcher::finish(uint64_t id) {
  auto it = active_.find(id);
  if (it == active_.end()) return;
  {
    std::lock_guard lock(mutex_);
    allocator_.free(it->second.blocks.blocks);
  }
  active_.erase(it);
  --load_;
}

void Batcher::preempt(uint64_t id) {
  auto it = active_.find(id);
  Active& a = it->second;
  // What the shards wrote: the prompt, and every generated token but the last (never fed). A
  // request still prefilling in chunks offers nothing (the router does not track its chunks).
  const size_t generated = a.tokens.size() - a.promptLen;
  if (allocator_.prefixCaching() && generated > 0)
    allocator_.publish(std::span<const uint32_t>(a.tokens).first(a.tokens.size() - 1),
                       a.blocks.blocks);
  allocator_.free(a.blocks.blocks);
  QueueEntry e;
  e.id = id;
  e.request = std::move(a.request);
  e.request.inputLength = static_cast<uint32_t>(a.tokens.size());
  e.request.inputIds = std::move(a.tokens);
  // The prompt's details went out with its first token; preempted before it (while its prompt
  // was prefilled in chunks) it still owes them, and computes its whole prompt again.
  if (e.generated > 0 || generated > 0) e.request.decoderInputDetails = false;
  e.control = a.control;
  e.queuedAt = a.times.queued;
  e.generated = a.generatedBefore + static_cast<uint32_t>(generated);
  resumed_[id] = a.times;
  sinks_[id] = a.sink;
  queue_.prepend(std::move(e));
  active_.erase(it);
  if (metrics_) {
    metrics_->counterAdd("textgen_preemptions_total", 1);
    metrics_->gaugeSet("tgi_queue_size", static_cast<double>(queue_.size()));
  }
}

std::optional<std::vector<BlockExtension>> Batcher::grow(std::optional<CachedBatch>& batch,
                                                         const StepOutput* pending, bool mayPreempt,
                                                         bool stepAhead) {
  std::vector<BlockExtension> extensions;
  preempted_ = false;
  if (!queue_.growing() || !batch) return extensions;
  std::unordered_map<uint64_t, uint32_t> more;  // tokens of the pending step
  if (pending) {
    more.reserve(pending->generations.size());
    for (const Generation& g : pending->generations) more[g.requestId] += g.tokens.ids.size();
  }
  std::vector<uint64_t> victims;
  {
    std::lock_guard lock(mutex_);
    for (uint64_t id : batch->requestIds) {
      auto it = active_.find(id);
      if (it == active_.end() || it->second.tokens.empty()) continue;  // gone, or never grows
      Active& a = it->second;
      // The next step writes the position of its last token: the prompt's last while prefilling.
      auto need = static_cast<uint32_t>(a.tokens.size());
      if (auto m = more.find(id); m != more.end()) need += m->second;
      if (stepAhead) {
        // After the step in flight: one more token, unless that step gives it its last.
        const uint32_t most = a.promptLen - a.generatedBefore + a.maxNewTokens - 1;
        if (a.maxNewTokens > 0 && need + 1 > most) continue;
        ++need;
      }
      while (!allocator_.extend(a.blocks, need)) {
        if (!mayPreempt) return std::nullopt;
        // The newest request of the batch gives its blocks back; perhaps this one.
        uint64_t victim = id;
        for (uint64_t other : batch->requestIds) {
          auto o = active_.find(other);
          if (o != active_.end() && !o->second.tokens.empty() &&
              o->second.admitted > active_.at(victim).admitted)
            victim = other;
        }
        victims.push_back(victim);
        preempt(victim);
        if (victim == id) break;
      }
      // With speculation, up to `speculate` proposed positions after it, within the request's
      // prompt + max_new_tokens: blocks for them when free ones remain, never by preempting (the
      // shards propose only within the blocks a request has).
      if (options_.speculate > 0 && active_.contains(id) && a.request.maxNewTokens > 0) {
        const uint32_t most = a.promptLen - a.generatedBefore + a.request.maxNewTokens - 1;
        const uint32_t ahead = std::min(need + options_.speculate, most);
        const size_t blocksAhead = (size_t{ahead} + options_.blockSize - 1) / options_.blockSize;
        if (ahead > need && blocksAhead <= a.blocks.blocks.size() + allocator_.idleBlocks())
          (void)allocator_.extend(a.blocks, ahead);
      }
    }
    if (!victims.empty())
      spdlog::debug("preempted {} request(s): too few KV blocks to grow", victims.size());
    preempted_ = !victims.empty();
  }
  if (!victims.empty()) {
    std::vector<uint64_t> keep;
    for (uint64_t id : batch->requestIds) {
      if (std::find(victims.begin(), victims.end(), id) == victims.end()) keep.push_back(id);
    }
    // The victims are queued under their ids again: the shards must have let them go, or their
    // next Prefill is refused (id in use). A failure leaves the replica unhealthy, and recover()
    // clears the shards before the next batch (without it, clear now).
    if (keep.empty()) {
      if (!shards_.clearCache(batch->id).ok()) {
        healthy_ = false;
        if (!options_.recover) (void)shards_.clearCache(std::nullopt);
      }
      batch.reset();
      return extensions;
    }
    auto filtered = shards_.filter(batch->id, keep);
    if (!filtered.ok()) {
      healthy_ = false;
      failAll(Status(StatusCode::kInternal,
                     "Request failed during generation: " + filtered.status().message()));
      if (!options_.recover) (void)shards_.clearCache(std::nullopt);
      batch.reset();
      return extensions;
    }
    batch = *filtered;
  }
  for (uint64_t id : batch->requestIds) {
    auto it = active_.find(id);
    if (it == active_.end()) continue;
    Active& a = it->second;
    if (a.blocks.blocks.size() > a.shardBlocks) {
      extensions.push_back({id, std::vector<uint32_t>(a.blocks.blocks.begin() + a.shardBlocks,
                                                      a.blocks.blocks.end())});
      a.shardBlocks = static_cast<uint32_t>(a.blocks.blocks.size());
    }
  }
  return extensions;
}

void Batcher::failAll(const Status& error) {
  ++failures_;
  // Free first, then tell the clients: whoever hears the error sees the blocks already back.
  std::vector<std::shared_ptr<ResponseSink>> sinks;
  {
    std::lock_guard lock(mutex_);
    for (auto& [id, a] : active_) {
      allocator_.free(a.blocks.blocks);
      sinks.push_back(a.sink);
      --load_;
    }
    // A failed step may have left the shards' KV memory partly written, and recovery rewrites it
    // (Warmup): nothing cached can be trusted.
    allocator_.dropCache();
    cacheGauge();
  }
  active_.clear();
  if (!sinks.empty()) {
    deliver([sinks = std::move(sinks), error] {
      for (auto& sink : sinks) sink->onError(error);
    });
  }
}

std::optional<CachedBatch> Batcher::absorb(StatusOr<StepOutput> out, const char* method,
                                           bool mayFilter) {
  const Labels m{{"method", method}};
  if (metrics_) metrics_->counterAdd("tgi_batch_inference_count", 1, m);
  if (!out.ok()) {
    if (metrics_) metrics_->counterAdd("tgi_batch_inference_failure", 1, m);
    healthy_ = false;
    failAll(Status(StatusCode::kInternal,
                   "Request failed during generation: " + out.status().message()));
    // recover() clears the shards before the next batch; without it, clear now (a frozen shard
    // would hold the loop for ClearCache's deadline here).
    if (!options_.recover) (void)shards_.clearCache(std::nullopt);
    return std::nullopt;
  }
  healthy_ = true;
  if (metrics_) {
    metrics_->counterAdd("tgi_batch_inference_success", 1, m);
    metrics_->histogramObserve("tgi_batch_forward_duration",
                               std::chrono::duration<double>(out->forward).count(), m);
    metrics_->histogramObserve("tgi_batch_decode_duration",
                               std::chrono::duration<double>(out->decode).count(), m);
    metrics_->histogramObserve("tgi_batch_inference_duration",
                               std::chrono::duration<double>(out->total).count(), m);
  }
  // The step's tokens reach their clients on the delivery thread, in order, after this returns.
  // The step's output goes with them, and is freed there too: at a few hundred rows, freeing its
  // generations was a large share of this thread's work per step.
  std::optional<CachedBatch> batch = std::move(out->batch);
  const auto step = std::make_shared<const StepOutput>(std::move(*out));
  struct Delivery {
    std::shared_ptr<ResponseSink> sink;
    const Generation* generation;  // in `step`
    RequestTimes times;
  };
  std::vector<Delivery> deliveries;
  deliveries.reserve(step->generations.size());
  auto flush = [&] {
    if (deliveries.empty()) return;
    deliver([this, step, deliveries = std::move(deliveries), method] {
      const auto start = std::chrono::steady_clock::now();
      for (const Delivery& d : deliveries) d.sink->onGeneration(*d.generation, d.times);
      if (metrics_) {
        metrics_->histogramObserve(
            "textgen_batch_delivery_duration",
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
            {{"method", method}});
      }
    });
    deliveries.clear();
  };
  for (const Generation& g : step->generations) {
    auto it = active_.find(g.requestId);
    if (it == active_.end()) continue;
    if (it->second.leaving()) {
      flush();  // what it was told before, first
      drop(g.requestId, clientLeft());
      continue;
    }
    if (g.error) {  // the shard refused this request alone; it is not in the batch
      flush();
      drop(g.requestId, invalidArgumentError(*g.error));
      continue;
    }
    if (metrics_ && options_.speculate > 0 && !g.tokens.ids.empty())
      metrics_->histogramObserve("tgi_request_skipped_tokens",
                                 static_cast<double>(g.tokens.ids.size() - 1));
    Active& a = it->second;
    if (!a.tokens.empty()) {
      // Its first tokens mean its whole prompt is in the cache; at the end, so are all the tokens
      // but the last (which was sampled, never fed).
      if (!a.published) {
        publish(a, a.tokens.size());
        a.published = true;
      }
      a.tokens.insert(a.tokens.end(), g.tokens.ids.begin(), g.tokens.ids.end());
      if (g.generatedText) publish(a, a.tokens.size() - 1);
    }
    const uint64_t id = g.requestId;
    const bool last = g.generatedText.has_value();
    deliveries.push_back({it->second.sink, &g, it->second.times});
    if (last) finish(id);  // free before the last delivery, as in failAll
  }
  flush();
  if (!batch) return std::nullopt;
  // The next step already runs this batch: the requests dropped above are filtered after it.
  if (!mayFilter) return batch;
  // Keep what is still running and still wanted; a disconnected client is dropped within this step.
  std::vector<uint64_t> keep;
  for (uint64_t id : batch->requestIds) {
    auto it = active_.find(id);
    if (it == active_.end()) continue;
    if (it->second.leaving()) {
      drop(id, clientLeft());
      continue;
    }
    keep.push_back(id);
  }
  if (keep.size() == batch->requestIds.size()) return batch;
  const auto start = std::chrono::steady_clock::now();
  if (keep.empty()) {
    // A batch the shards failed to let go of holds blocks this router has freed (and will hand out
    // again): the shards are cleared before the next batch. Not now: another batch may still run
    // there (this one joined it). Nor is the replica unhealthy: it answered the step.
    if (!shards_.clearCache(batch->id).ok()) mustRecover_ = true;
    return std::nullopt;
  }
  auto filtered = shards_.filter(batch->id, keep);
  if (metrics_) {
    metrics_->histogramObserve(
        "tgi_batch_filter_duration",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
        {{"method", method}});
  }
  if (!filtered.ok()) {
    healthy_ = false;
    failAll(Status(StatusCode::kInternal,
                   "Request failed during generation: " + filtered.status().message()));
    if (!options_.recover) (void)shards_.clearCache(std::nullopt);
    return std::nullopt;
  }
  return *filtered;
}

namespace {

std::vector<uint64_t> joined(std::vector<uint64_t> a, const std::vector<uint64_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<uint64_t> idsOf(const std::vector<BatchEntry>& entries,
                            const std::vector<uint64_t>& more = {}) {
  std::vector<uint64_t> ids;
  for (const BatchEntry& e : entries) ids.push_back(e.entry.id);
  return joined(std::move(ids), more);
}

}  // namespace

std::optional<tracing::SpanData> Batcher::stepSpan(const char* method,
                                                   const std::vector<uint64_t>& ids) const {
  if (!tracing::enabled()) return std::nullopt;
  constexpr size_t kMaxLinks = 32;
  std::optional<tracing::SpanData> span;
  for (uint64_t id : ids) {
    auto it = active_.find(id);
    if (it == active_.end() || !it->second.trace || !it->second.trace->sampled) continue;
    const tracing::SpanContext& parent = *it->second.trace;
    if (!span) {
      span = tracing::SpanData{.context = tracing::newChild(parent),
                               .parent = parent.spanId,
                               .name = method,
                               .kind = tracing::SpanKind::kClient,
                               .attributes = {{"batch_size", static_cast<int64_t>(ids.size())}}};
    } else if (span->links.size() < kMaxLinks) {
      span->links.push_back(parent);
    } else {
      ++span->droppedLinks;
    }
  }
  return span;
}

StatusOr<StepOutput> Batcher::call(const char* method, std::optional<tracing::SpanData> span,
                                   const std::function<StatusOr<StepOutput>()>& rpc, bool queued) {
  using Seconds = std::chrono::duration<double>;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const Labels m{{"method", method}};
  const int64_t lastEnd = lastStepEndNs_.load();
  if (metrics_ && !queued && lastEnd != 0) {
    const auto gap = start.time_since_epoch() - std::chrono::nanoseconds(lastEnd);
    metrics_->histogramObserve("textgen_batch_host_duration",
                               Seconds(std::max(gap, gap.zero())).count(), m);
  }
  if (span) span->startUnixNs = tracing::unixNanos();
  StatusOr<StepOutput> out = [&] {
    tracing::ScopedContext scope(span ? std::optional(span->context) : std::nullopt);
    return rpc();
  }();
  const auto end = Clock::now();
  lastStepEndNs_.store(
      std::chrono::duration_cast<std::chrono::nanoseconds>(end.time_since_epoch()).count());
  if (span) {
    span->endUnixNs = tracing::unixNanos();
    if (!out.ok()) span->error = out.status().message();
    tracing::record(std::move(*span));
  }
  if (metrics_ && out.ok()) {
    const auto beyond =
        std::chrono::duration_cast<std::chrono::nanoseconds>(end - start) - out->total - out->queue;
    metrics_->histogramObserve("textgen_batch_transport_duration",
                               Seconds(std::max(beyond, beyond.zero())).count(), m);
  }
  return out;
}

bool Batcher::pipelinable(const StatusOr<StepOutput>& out) {
  if (!options_.pipelineDecode || !out.ok() || !out->batch || stop_) return false;
  for (uint64_t id : out->batch->requestIds) {
    auto it = active_.find(id);
    if (it == active_.end() || (it->second.leaving())) return false;
  }
  std::lock_guard lock(mutex_);
  return queue_.empty();
}

bool Batcher::mayStepAhead(const std::optional<CachedBatch>& running) {
  if (!options_.pipelineDecode || !options_.stepAhead || options_.speculate > 0 || !running ||
      stop_ || running->currentTokens != running->requestIds.size())
    return false;
  bool goesOn = false;
  for (uint64_t id : running->requestIds) {
    auto it = active_.find(id);
    if (it == active_.end() || (it->second.leaving())) return false;
    const Active& a = it->second;
    // Ends by max_new_tokens in the step in flight: its next token is that step's.
    goesOn |= a.tokens.empty() || a.maxNewTokens == 0 ||
              a.tokens.size() + 1 < size_t{a.promptLen} - a.generatedBefore + a.maxNewTokens;
  }
  if (!goesOn) return false;
  std::lock_guard lock(mutex_);
  return queue_.empty();
}

std::future<StatusOr<StepOutput>> Batcher::launchDecode(const CachedBatch& batch,
                                                        std::vector<BlockExtension> extensions,
                                                        DecodeOrder order) {
  auto work = [this, batch, extensions = std::move(extensions), order,
               span = stepSpan("decode", batch.requestIds)]() mutable {
    return call(
        "decode", std::move(span), [&] { return shards_.decode({batch}, extensions, order); },
        /*queued=*/order.after.has_value());
  };
  if (!senders_.empty()) {
    std::packaged_task<StatusOr<StepOutput>()> task(std::move(work));
    std::future<StatusOr<StepOutput>> result = task.get_future();
    {
      std::lock_guard lock(sendMu_);
      sends_.push_back(std::move(task));
    }
    sendCv_.notify_one();
    return result;
  }
  // No sender threads (they could not be started): unpipelined, on this thread.
  if (order.after) return {};
  std::promise<StatusOr<StepOutput>> done;
  done.set_value(work());
  return done.get_future();
}

void Batcher::sendLoop() {
  std::unique_lock lock(sendMu_);
  while (true) {
    sendCv_.wait(lock, [&] { return sendStop_ || !sends_.empty(); });
    if (sends_.empty()) return;
    std::packaged_task<StatusOr<StepOutput>()> task = std::move(sends_.front());
    sends_.pop_front();
    lock.unlock();
    task();
    lock.lock();
  }
}

void Batcher::probe() {
  if (healthy_ || !options_.recover) return;
  {
    std::lock_guard lock(mutex_);
    probe_ = true;
  }
  wake_.notify_one();
}

void Batcher::run() {
  while (true) {
    bool probing = false;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || !queue_.empty() || probe_; });
      if (stop_) return;
      probing = std::exchange(probe_, false) && queue_.empty();
    }
    if (probing) {
      // Nothing queued, so nothing runs: the shards are the check's alone. A request queued
      // meanwhile runs recover() itself, below, if this check fails.
      const auto now = std::chrono::steady_clock::now();
      if (!healthy_ && options_.recover && now - lastProbe_ >= kMinProbeInterval && !stop_) {
        lastProbe_ = now;
        // Health first (its short deadline): a shard still frozen fails it at once, so that
        // Warmup's long deadline does not hold this thread (and ~Batcher, which waits for it).
        if (shards_.health().ok() && options_.recover().ok()) {
          mustRecover_ = false;
          healthy_ = true;
        }
      }
      continue;
    }
    std::vector<BatchEntry> first =
        takeBatch(std::nullopt, options_.maxBatchSize, options_.maxBatchPrefillTokens);
    if (first.empty()) continue;  // not enough blocks yet, or every queued client left
    // No batch runs before this one's prefill: the shards can be cleared of what a failed step,
    // or a batch they failed to clear, left there. A recovery that fails is a shard failure.
    if ((!healthy_ || mustRecover_) && options_.recover) {
      if (Status s = options_.recover(); !s.ok()) {
        healthy_ = false;
        failAll(Status(StatusCode::kInternal, "Request failed during generation: " + s.message()));
        continue;
      }
      mustRecover_ = false;
    } else if (mustRecover_) {
      mustRecover_ = !shards_.clearCache(std::nullopt).ok();
    }
    std::optional<CachedBatch> cached =
        absorb(call("prefill", stepSpan("prefill", idsOf(first)),
                    [&] { return shards_.prefill(nextBatchId_++, first, std::nullopt); }),
               "prefill");
    uint32_t waitingTokens = 1;
    auto gauges = [&] {
      if (metrics_ && cached) {
        metrics_->gaugeSet("tgi_batch_current_size",
                           static_cast<double>(cached->requestIds.size()));
        metrics_->gaugeSet("tgi_batch_current_max_tokens", cached->maxTokens);
      }
    };
    while (cached && !stop_) {
      // Blocks for the step ahead first: the running requests come before newcomers.
      std::vector<BlockExtension> extensions = *grow(cached, nullptr, /*mayPreempt=*/true);
      if (!cached) break;
      gauges();
      std::optional<size_t> minSize, maxSize;
      uint32_t prefillBudget = options_.maxBatchPrefillTokens;
      if (options_.supportChunking) {
        prefillBudget = options_.maxBatchPrefillTokens > cached->currentTokens
                            ? options_.maxBatchPrefillTokens - cached->currentTokens
                            : 0;
      } else {
        if (waitingTokens < options_.maxWaitingTokens) {
          minSize = static_cast<size_t>(std::floor(static_cast<float>(cached->requestIds.size()) *
                                                   options_.waitingServedRatio));
        }
        if (options_.maxBatchSize) {
          maxSize = *options_.maxBatchSize > cached->requestIds.size()
                        ? *options_.maxBatchSize - cached->requestIds.size()
                        : 0;
        }
      }
      // Nothing joins right after a preemption: the victims would take the blocks back at once.
      std::vector<BatchEntry> more =
          preempted_ ? std::vector<BatchEntry>{} : takeBatch(minSize, maxSize, prefillBudget);
      if (!more.empty()) {
        if (metrics_) {
          const char* reason = minSize                    ? "backpressure"
                               : options_.supportChunking ? "chunking"
                                                          : "wait_exceeded";
          metrics_->counterAdd("tgi_batch_concat", 1, {{"reason", reason}});
        }
        const uint64_t id = nextBatchId_++;
        if (options_.supportChunking) {
          // The running batch joins the new one in a single forward.
          cached = absorb(call("prefill", stepSpan("prefill", idsOf(more, cached->requestIds)),
                               [&] { return shards_.prefill(id, more, cached, extensions); }),
                          "prefill");
          waitingTokens = 1;
          if (!cached) break;
          // The step added tokens: the decode below may need blocks again.
          extensions = *grow(cached, nullptr, /*mayPreempt=*/true);
          if (!cached) break;
        } else {
          const uint64_t failuresBefore = failures_.load();
          std::optional<CachedBatch> added =
              absorb(call("prefill", stepSpan("prefill", idsOf(more)),
                          [&] { return shards_.prefill(id, more, std::nullopt); }),
                     "prefill");
          waitingTokens = 1;
          // A failed prefill failed every request, the running batch's too (failAll): its
          // requests and blocks are gone here, so it is not decoded again; recover() clears the
          // shards before the next batch. Without a failure (every joiner finished, was refused
          // or left) the running batch goes on.
          if (!added && failures_.load() != failuresBefore) break;
          if (added) {
            auto merged = absorb(
                call("decode", stepSpan("decode", joined(cached->requestIds, added->requestIds)),
                     [&] {
                       return shards_.decode({*cached, *added}, extensions);
                     }),
                "decode");
            cached = merged;
            ++waitingTokens;
            continue;
          }
        }
      }
      // Decode steps, pipelined while nothing waits to join (vLLM's asynchronous scheduling):
      // step N+1 goes to the shards while step N still runs there, numbered to run right after it
      // (DecodeOrder), so that neither delivering N's tokens, nor planning, nor transport sits
      // between the two on the GPU. A client that leaves meanwhile is filtered out after the
      // steps in flight, which compute tokens it discards. When N+1 cannot be planned before N
      // returns (speculation, prompt chunks in the batch), it is still sent before N's tokens are
      // delivered.
      using Clock = std::chrono::steady_clock;
      std::optional<CachedBatch> running = cached;  // the batch the step in flight runs
      uint64_t inflightStep = ++decodeSteps_;
      std::future<StatusOr<StepOutput>> inflight =
          launchDecode(*running, std::move(extensions), {inflightStep, std::nullopt});
      while (true) {
        const auto planStart = Clock::now();
        std::future<StatusOr<StepOutput>> next;
        // Undoes what grow() told the shards of, when a step planned with it is not sent.
        auto unsent = [&](const std::vector<BlockExtension>& grown) {
          for (const BlockExtension& x : grown)
            active_[x.requestId].shardBlocks -= static_cast<uint32_t>(x.blocks.size());
        };
        if (mayStepAhead(running)) {
          std::optional<CachedBatch> b = running;
          if (std::optional<std::vector<BlockExtension>> grown =
                  grow(b, nullptr, /*mayPreempt=*/false, /*stepAhead=*/true)) {
            const uint64_t step = ++decodeSteps_;
            next = launchDecode(*b, *grown, {step, inflightStep});
            if (next.valid()) {
              inflightStep = step;
            } else {
              unsent(*grown);
            }
          }
        }
        const auto planned = Clock::now();
        StatusOr<StepOutput> out = inflight.get();
        if (!out.ok() && next.valid()) {
          (void)next.get();  // it follows a failed step: the shards refuse it
          next = {};
        }
        auto planMore = Clock::duration::zero();
        if (!next.valid() && pipelinable(out)) {  // too late to run ahead: sent before delivery
          const auto start = Clock::now();
          std::optional<CachedBatch> b = out->batch;
          if (std::optional<std::vector<BlockExtension>> grown =
                  grow(b, &*out, /*mayPreempt=*/false)) {
            inflightStep = ++decodeSteps_;
            next = launchDecode(*b, *grown, {inflightStep, std::nullopt});
            if (!next.valid()) unsent(*grown);
          }
          planMore = Clock::now() - start;
        }
        // Requests of the step that neither got a token nor stay in its batch (a shard that lost
        // them): failed, rather than left waiting with their blocks.
        std::vector<uint64_t> lost;
        // Usually each request of the batch has its generation, in the batch's order.
        bool complete = out.ok() && out->generations.size() == running->requestIds.size();
        for (size_t k = 0; complete && k < running->requestIds.size(); ++k)
          complete = out->generations[k].requestId == running->requestIds[k];
        if (out.ok() && !complete) {
          std::unordered_set<uint64_t> seen;
          for (const Generation& g : out->generations) seen.insert(g.requestId);
          if (out->batch) seen.insert(out->batch->requestIds.begin(), out->batch->requestIds.end());
          for (uint64_t id : running->requestIds)
            if (!seen.contains(id) && active_.contains(id)) lost.push_back(id);
        }
        const auto absorbStart = Clock::now();
        cached = absorb(std::move(out), "decode", /*mayFilter=*/!next.valid());
        for (uint64_t id : lost) {
          spdlog::error("request {}: the shards returned neither a token nor a place in the batch",
                        id);
          drop(id, Status(StatusCode::kInternal,
                          "Request failed during generation: the shards lost the request"));
        }
        ++waitingTokens;
        if (metrics_) {
          const auto work = (planned - planStart) + planMore + (Clock::now() - absorbStart);
          metrics_->histogramObserve("textgen_batch_router_duration",
                                     std::chrono::duration<double>(work).count(),
                                     {{"method", "decode"}});
        }
        if (!next.valid()) break;
        if (!cached) {
          // The step ahead followed one that ended every request: it stepped nothing.
          StatusOr<StepOutput> rest = next.get();
          if (!rest.ok()) (void)absorb(std::move(rest), "decode");
          break;
        }
        gauges();  // the batch as the step in flight runs it
        running = cached;
        inflight = std::move(next);
      }
    }
    lastStepEndNs_.store(0);  // idle: the wait for the next request is not host time
    if (metrics_) {
      metrics_->gaugeSet("tgi_batch_current_size", 0);
      metrics_->gaugeSet("tgi_batch_current_max_tokens", 0);
    }
  }
}

}  // namespace textgen::router
