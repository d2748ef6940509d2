#include "shard_service.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "textgen/shard/v1/shard.grpc.pb.h"
#include "textgen/tracing/tracing.h"

namespace textgen::runtime {
namespace {

namespace pb = textgen::shard::v1;

// A Prefill or Decode span when the router sent a sampled W3C `traceparent` with the call (its
// step span is the parent): named after the step, carrying the batch size, recorded when the call
// returns. Steps the router does not trace record nothing.
class StepSpan {
 public:
  StepSpan(const grpc::ServerContext* ctx, const char* name, int64_t batchSize) {
    if (!tracing::enabled() || !ctx) return;
    const auto& md = ctx->client_metadata();
    auto it = md.find("traceparent");
    if (it == md.end()) return;
    auto parent = tracing::parseTraceparent(std::string_view(it->second.data(), it->second.size()));
    if (!parent || !parent->sampled) return;
    span_ = tracing::SpanData{.context = tracing::newChild(*parent),
                              .parent = parent->spanId,
                              .parentRemote = true,
                              .name = name,
                              .kind = tracing::SpanKind::kServer,
                              .startUnixNs = tracing::unixNanos(),
                              .attributes = {{"batch_size", batchSize}}};
  }
  ~StepSpan() {
    if (!span_) return;
    span_->endUnixNs = tracing::unixNanos();
    tracing::record(std::move(*span_));
  }
  StepSpan(const StepSpan&) = delete;
  StepSpan& operator=(const StepSpan&) = delete;
  void fail(const std::string& message) {
    if (span_) span_->error = message;
  }

 private:
  std::optional<tracing::SpanData> span_;
};

grpc::Status toGrpc(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), s.message());
}

StatusOr<RequestSpec> fromProto(const pb::Request& r) {
  const std::string who = "request " + std::to_string(r.id()) + ": ";
  const auto& p = r.parameters();
  using Grammar = SamplingParams::Grammar;
  Grammar grammarType = Grammar::kNone;
  switch (p.grammar_type()) {
    case pb::GRAMMAR_TYPE_NONE: break;
    case pb::GRAMMAR_TYPE_JSON: grammarType = Grammar::kJson; break;
    case pb::GRAMMAR_TYPE_REGEX: grammarType = Grammar::kRegex; break;
    default:
      return invalidArgumentError(who + "unknown grammar_type " +
                                  std::to_string(static_cast<int>(p.grammar_type())));
  }
  if ((grammarType == Grammar::kNone) != p.grammar().empty())
    return invalidArgumentError(who + "grammar and grammar_type must be set together");
  if (r.has_adapter_id() && !r.adapter_id().empty()) {
    return unimplementedError(who + "LoRA adapters are not implemented (adapter_id '" +
                              r.adapter_id() + "')");
  }
  RequestSpec s;
  s.id = r.id();
  s.inputIds.assign(r.input_ids().begin(), r.input_ids().end());
  // Zero means "unset" for the float parameters, as in TGI's proto defaults.
  s.sampling.temperature = p.temperature() == 0.0f ? 1.0f : p.temperature();
  s.sampling.topK = p.top_k();
  s.sampling.topP = p.top_p() == 0.0f ? 1.0f : p.top_p();
  s.sampling.typicalP = p.typical_p() == 0.0f ? 1.0f : p.typical_p();
  s.sampling.doSample = p.do_sample();
  s.sampling.seed = p.seed();
  s.sampling.repetitionPenalty = p.repetition_penalty() == 0.0f ? 1.0f : p.repetition_penalty();
  s.sampling.frequencyPenalty = p.frequency_penalty();
  s.sampling.presencePenalty = p.presence_penalty();
  for (const auto& [id, bias] : p.logit_bias()) s.sampling.logitBias[id] = bias;
  s.sampling.topNTokens = r.top_n_tokens();
  s.sampling.grammarType = grammarType;
  s.sampling.grammar = p.grammar();
  s.sampling.watermark = p.watermark();
  s.stopping.maxNewTokens = r.stopping_parameters().max_new_tokens();
  s.stopping.stopSequences.assign(r.stopping_parameters().stop_sequences().begin(),
                                  r.stopping_parameters().stop_sequences().end());
  s.stopping.ignoreEosToken = r.stopping_parameters().ignore_eos_token();
  s.prefillLogprobs = r.prefill_logprobs();
  s.blocks.assign(r.blocks().begin(), r.blocks().end());
  s.slots.assign(r.slots().begin(), r.slots().end());
  s.cacheLen = r.cache_len();
  if (r.has_chunk_len()) s.chunkLen = r.chunk_len();
  s.generatedTokens = r.generated_tokens();
  return s;
}

std::vector<BlockExtension> fromProto(
    const google::protobuf::RepeatedPtrField<pb::BlockExtension>& in) {
  std::vector<BlockExtension> out;
  out.reserve(in.size());
  for (const pb::BlockExtension& e : in)
    out.push_back({e.request_id(), std::vector<uint32_t>(e.blocks().begin(), e.blocks().end())});
  return out;
}

// A batch's requests; those that cannot be read are listed in `refused` when it is given (Prefill:
// they fail alone), else they fail the call (Warmup).
StatusOr<std::vector<RequestSpec>> fromProto(const pb::Batch& b,
                                             std::vector<GenerationResult>* refused = nullptr) {
  if (static_cast<int>(b.size()) != b.requests_size()) {
    return invalidArgumentError("batch " + std::to_string(b.id()) + ": size " +
                                std::to_string(b.size()) + " but " +
                                std::to_string(b.requests_size()) + " requests");
  }
  std::vector<RequestSpec> out;
  for (const pb::Request& r : b.requests()) {
    StatusOr<RequestSpec> s = fromProto(r);
    if (!s.ok() && refused) {
      refused->push_back(GenerationResult::refusal(r.id(), s.status().message()));
      continue;
    }
    if (!s.ok()) return s.status();
    out.push_back(std::move(*s));
  }
  return out;
}

void toProto(const TokenList& t, pb::Tokens* out) {
  for (size_t i = 0; i < t.ids.size(); ++i) {
    out->add_ids(t.ids[i]);
    out->add_logprobs(t.logprobs[i]);
    out->add_texts(t.texts[i]);
    out->add_is_special(t.isSpecial[i]);
  }
}

pb::FinishReason toProto(FinishReason r) {
  switch (r) {
    case FinishReason::kLength: return pb::FINISH_REASON_LENGTH;
    case FinishReason::kEosToken: return pb::FINISH_REASON_EOS_TOKEN;
    case FinishReason::kStopSequence: return pb::FINISH_REASON_STOP_SEQUENCE;
  }
  return pb::FINISH_REASON_UNSPECIFIED;
}

void toProto(const BatchInfo& b, pb::CachedBatch* out) {
  out->set_id(b.id);
  for (uint64_t id : b.requestIds) out->add_request_ids(id);
  out->set_size(static_cast<uint32_t>(b.requestIds.size()));
  out->set_max_tokens(b.maxTokens);
  out->set_current_tokens(b.currentTokens);
}

template <typename Response>
void toProto(const StepResult& s, Response* out) {
  for (const GenerationResult& g : s.generations) {
    pb::Generation* p = out->add_generations();
    p->set_request_id(g.requestId);
    if (g.error) {
      p->set_error(*g.error);
      continue;
    }
    if (g.prefillTokens) toProto(*g.prefillTokens, p->mutable_prefill_tokens());
    toProto(g.tokens, p->mutable_tokens());
    for (const TokenList& t : g.topTokens) toProto(t, p->add_top_tokens());
    if (g.finished) {
      auto* f = p->mutable_generated_text();
      f->set_text(g.finished->text);
      f->set_generated_tokens(g.finished->generatedTokens);
      f->set_finish_reason(toProto(g.finished->reason));
      if (g.finished->seed) f->set_seed(*g.finished->seed);
    }
  }
  if (s.batch) toProto(*s.batch, out->mutable_batch());
  out->set_forward_ns(s.forwardNs);
  out->set_decode_ns(s.decodeNs);
  out->set_total_ns(s.totalNs);
  if (s.concatNs) out->set_concat_ns(*s.concatNs);
}

class ShardService final : public pb::ShardService::Service {
 public:
  ShardService(Engine& engine, const Model& model, ShardServiceOptions options)
      : engine_(engine), model_(model), options_(std::move(options)) {}

  grpc::Status Info(grpc::ServerContext*, const pb::InfoRequest*, pb::InfoResponse* out) override {
    const ModelConfig& c = model_.config();
    out->set_requires_padding(false);
    out->set_dtype(options_.dtype);
    out->set_device_type(options_.deviceType);
    if (c.slidingWindow) out->set_window_size(static_cast<uint32_t>(*c.slidingWindow));
    out->set_speculate(static_cast<uint32_t>(engine_.options().speculate));
    // An encoder-decoder model encodes a prompt in one step, computed anew (Engine::validate).
    out->set_support_chunking(!c.isEncoderDecoder);
    out->set_use_prefix_caching(options_.prefixCaching && !c.isEncoderDecoder);
    out->set_ordered_decode(true);
    out->set_model_kind(c.isEncoderDecoder ? pb::MODEL_KIND_ENCODER_DECODER
                                           : pb::MODEL_KIND_DECODER_ONLY);
    out->set_attention_impl("paged");
    out->set_block_size(static_cast<uint32_t>(engine_.options().blockSize));
    out->set_max_position_embeddings(static_cast<uint32_t>(engine_.maxContext()));
    out->set_vocab_size(static_cast<uint32_t>(c.vocabSize));
    out->set_world_size(static_cast<uint32_t>(options_.worldSize));
    return grpc::Status::OK;
  }

  grpc::Status Health(grpc::ServerContext*, const pb::HealthRequest*,
                      pb::HealthResponse*) override {
    return grpc::Status::OK;
  }

  grpc::Status ServiceDiscovery(grpc::ServerContext*, const pb::ServiceDiscoveryRequest*,
                                pb::ServiceDiscoveryResponse* out) override {
    if (options_.rankUrls)
      for (const std::string& url : options_.rankUrls()) out->add_urls(url);
    return grpc::Status::OK;
  }

  grpc::Status ClearCache(grpc::ServerContext*, const pb::ClearCacheRequest* in,
                          pb::ClearCacheResponse*) override {
    std::lock_guard lock(mutex_);
    Ran ran(*this);
    engine_.clear(in->has_id() ? std::optional<uint64_t>(in->id()) : std::nullopt);
    return grpc::Status::OK;
  }

  grpc::Status FilterBatch(grpc::ServerContext*, const pb::FilterBatchRequest* in,
                           pb::FilterBatchResponse* out) override {
    std::lock_guard lock(mutex_);
    Ran ran(*this);
    auto b = engine_.filter(in->batch_id(), {in->request_ids().begin(), in->request_ids().end()});
    if (!b.ok()) return toGrpc(b.status());
    toProto(*b, out->mutable_batch());
    return grpc::Status::OK;
  }

  grpc::Status Warmup(grpc::ServerContext*, const pb::WarmupRequest* in,
                      pb::WarmupResponse* out) override {
    std::lock_guard lock(mutex_);
    Ran ran(*this);
    Watch watch(*this, "Warmup", options_.warmupTimeout);
    auto requests = fromProto(in->batch());
    if (!requests.ok()) return toGrpc(requests.status());
    auto w = engine_.warmup(
        in->batch().id(), std::move(*requests),
        in->has_max_input_tokens() ? std::optional<uint32_t>(in->max_input_tokens()) : std::nullopt,
        in->max_prefill_tokens(),
        in->has_max_total_tokens() ? std::optional<uint32_t>(in->max_total_tokens())
                                   : std::nullopt);
    if (!w.ok()) return failed("Warmup", w.status());
    out->set_max_supported_total_tokens(w->maxSupportedTotalTokens);
    out->set_max_input_tokens(w->maxInputTokens);
    out->set_max_total_tokens(w->maxTotalTokens);
    return grpc::Status::OK;
  }

  grpc::Status Prefill(grpc::ServerContext* ctx, const pb::PrefillRequest* in,
                       pb::PrefillResponse* out) override {
    StepSpan span(ctx, "prefill",
                  int64_t{in->batch().requests_size()} +
                      (in->has_cached_batch() ? int64_t{in->cached_batch().size()} : 0));
    std::lock_guard lock(mutex_);
    // Its caller gave up while it waited: run late, it would leave a batch the router no longer
    // knows of, holding blocks that router hands out again (the engine would refuse them).
    if (ctx && ctx->IsCancelled()) {
      span.fail("cancelled");
      return failed("Prefill", cancelledError("the caller gave up before the step ran"));
    }
    Ran ran(*this);
    Watch watch(*this, "Prefill", options_.stepTimeout);
    std::vector<GenerationResult> refused;
    auto requests = fromProto(in->batch(), &refused);
    if (!requests.ok()) {
      span.fail(requests.status().message());
      return toGrpc(requests.status());
    }
    const auto cached =
        in->has_cached_batch() ? std::optional<uint64_t>(in->cached_batch().id()) : std::nullopt;
    StepResult result;
    if (!requests->empty() || cached || refused.empty()) {
      auto s = engine_.prefill(in->batch().id(), std::move(*requests), cached,
                               fromProto(in->extensions()));
      if (!s.ok()) {
        span.fail(s.status().message());
        return failed("Prefill", s.status(), engine_.lastCallReachedForward());
      }
      result = std::move(*s);
    }
    for (GenerationResult& g : refused) result.generations.push_back(std::move(g));
    toProto(result, out);
    return grpc::Status::OK;
  }

  grpc::Status Decode(grpc::ServerContext* ctx, const pb::DecodeRequest* in,
                      pb::DecodeResponse* out) override {
    int64_t size = 0;
    for (const pb::CachedBatch& b : in->batches()) size += b.size();
    StepSpan span(ctx, "decode", size);
    // A pipelined call usually waits here, while the step it follows holds the engine.
    const auto arrived = Clock::now();
    Clock::duration queued{0};
    std::optional<StepResult> result;
    {
      std::unique_lock lock(mutex_);
      if (in->has_after_step()) {
        if (Status s = awaitStep(lock, ctx, in->step(), in->after_step()); !s.ok()) {
          span.fail(s.message());
          // ABORTED (the step it follows failed) is every rank's answer alike; the others (a
          // predecessor late or lost, a caller gone, too many waiting) depend on this rank's
          // timing, so its peers may run the step this rank skips.
          return s.code() == StatusCode::kAborted ? toGrpc(s) : failed("Decode", s);
        }
        queued = Clock::now() - arrived;
      }
      // Its client gave up while it waited: running it now could land between later calls.
      if (ctx && ctx->IsCancelled()) {
        span.fail("cancelled");
        return failed("Decode", cancelledError("the caller gave up before the step ran"));
      }
      Ran ran(*this);
      if (in->has_step()) ran.step = in->step();
      Watch watch(*this, "Decode", options_.stepTimeout);
      std::vector<uint64_t> ids;
      for (const pb::CachedBatch& b : in->batches()) ids.push_back(b.id());
      auto s = engine_.decode(std::move(ids), fromProto(in->extensions()), in->has_after_step());
      if (!s.ok()) {
        ran.failed = true;
        span.fail(s.status().message());
        return failed("Decode", s.status(), engine_.lastCallReachedForward());
      }
      result = std::move(*s);
    }
    // The engine is free: a step sent after this one starts while this answer is built.
    toProto(*result, out);
    out->set_queue_ns(static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(queued).count()));
    return grpc::Status::OK;
  }

 private:
  using Clock = std::chrono::steady_clock;

  // A call that failed as a whole (not a request refused alone): with peers, the group is out of
  // step from here on, unless the engine refused the call before its forward (every rank refuses
  // the same call alike, before any collective).
  grpc::Status failed(const char* what, const Status& s, bool reachedForward = true) {
    if (reachedForward && options_.worldSize > 1 && options_.onGroupFailure)
      options_.onGroupFailure(std::string(what) + " failed on this rank: " + s.toString());
    return toGrpc(s);
  }

  // Marks, under mutex_, the end of a call that changes the engine's batches: a pipelined Decode
  // (after_step) runs only right after the numbered Decode it follows.
  struct Ran {
    explicit Ran(ShardService& s) : s_(s) {}
    ~Ran() {
      s_.lastStep_ = step;
      s_.lastStepFailed_ = failed;
      ++s_.calls_;
      s_.stepCv_.notify_all();
    }
    Ran(const Ran&) = delete;
    Ran& operator=(const Ran&) = delete;
    std::optional<uint64_t> step;  // a numbered Decode
    bool failed = false;

   private:
    ShardService& s_;
  };

  // Waits (releasing `lock`) until Decode `after` has run, when it has not just run. OK when it was
  // the last call and succeeded; ABORTED when it failed; FAILED_PRECONDITION when another call
  // ran first, or when it did not arrive within kPredecessorWait (or the client's deadline; no wait
  // for a call made in process, without a context): a router sends it just before this one, so it
  // was lost. Such a refusal counts as a failed step, so that a call following this one is refused
  // at once (not when the caller gave up: nothing is recorded then). RESOURCE_EXHAUSTED when
  // kMaxWaiting calls wait already (a router has one in flight per rank). (While the step it
  // follows runs, this call waits for mutex_, not here.)
  static constexpr int kMaxWaiting = 4;
  static constexpr std::chrono::seconds kPredecessorWait{2};
  Status awaitStep(std::unique_lock<std::mutex>& lock, const grpc::ServerContext* ctx,
                   uint64_t step, uint64_t after) {
    const std::string self = "pipelined Decode " + std::to_string(step);
    if (lastStep_ != after) {
      if (waiting_ >= kMaxWaiting) {
        return resourceExhaustedError(self + ": " + std::to_string(waiting_) +
                                      " pipelined Decode calls wait already");
      }
      auto refuse = [&](std::string why) {
        Ran ran(*this);
        ran.step = step;
        ran.failed = true;
        return failedPreconditionError(std::move(why));
      };
      const uint64_t seen = calls_;
      const auto now = std::chrono::system_clock::now();
      const auto limit = ctx ? std::min(ctx->deadline(), now + kPredecessorWait) : now;
      ++waiting_;
      while (calls_ == seen) {
        if (ctx && ctx->IsCancelled()) {  // its caller gave up: nothing to record
          --waiting_;
          return failedPreconditionError(self + ": cancelled while Decode " +
                                         std::to_string(after) + ", which it follows, was awaited");
        }
        if (std::chrono::system_clock::now() >= limit) {
          --waiting_;
          return refuse(self + ": Decode " + std::to_string(after) +
                        ", which it follows, did not arrive in time");
        }
        stepCv_.wait_for(lock, std::chrono::milliseconds(50));
      }
      --waiting_;
      if (lastStep_ != after) {
        return refuse(self + ": another call ran before Decode " + std::to_string(after) +
                      ", which it follows");
      }
    }
    if (lastStepFailed_)
      return abortedError(self + ": Decode " + std::to_string(after) +
                          ", which it follows, failed");
    return okStatus();
  }

  // Arms the watchdog for one engine call (calls are serialised by mutex_).
  class Watch {
   public:
    Watch(ShardService& s, const char* what, std::chrono::milliseconds timeout) : s_(s) {
      if (timeout.count() <= 0 || !s.options_.onGroupFailure) return;
      std::lock_guard lock(s.watchMu_);
      s.watchWhat_ = what;
      s.watchTimeout_ = timeout;
      s.watchDeadline_ = Clock::now() + timeout;
      s.watchArmed_ = true;
      s.ensureWatchdog();
    }
    ~Watch() {
      std::lock_guard lock(s_.watchMu_);
      s_.watchArmed_ = false;
    }
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;

   private:
    ShardService& s_;
  };

  // Under watchMu_.
  void ensureWatchdog() {
    if (watchdog_.joinable()) return;
    watchdog_ = std::thread([this] {
      std::unique_lock lock(watchMu_);
      while (!watchStop_) {
        watchCv_.wait_for(lock, std::chrono::milliseconds(100));
        if (watchArmed_ && Clock::now() > watchDeadline_) {
          const std::string why = std::string(watchWhat_) + " did not finish within " +
                                  std::to_string(watchTimeout_.count()) +
                                  " ms: a tensor-parallel peer is gone or stuck";
          watchArmed_ = false;
          lock.unlock();
          options_.onGroupFailure(why);
          lock.lock();
        }
      }
    });
  }

 public:
  ~ShardService() override {
    {
      std::lock_guard lock(watchMu_);
      watchStop_ = true;
    }
    watchCv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
  }

 private:
  Engine& engine_;
  const Model& model_;
  ShardServiceOptions options_;
  std::mutex mutex_;
  // Under mutex_: the numbered Decode that ran last (none when another call did), whether it
  // failed, and calls run so far.
  std::optional<uint64_t> lastStep_;
  bool lastStepFailed_ = false;
  uint64_t calls_ = 0;
  int waiting_ = 0;  // pipelined Decode calls waiting for theirs
  std::condition_variable stepCv_;
  std::mutex watchMu_;
  std::condition_variable watchCv_;
  std::thread watchdog_;
  bool watchArmed_ = false, watchStop_ = false;
  const char* watchWhat_ = "";
  std::chrono::milliseconds watchTimeout_{0};
  Clock::time_point watchDeadline_;
};

}  // namespace

std::unique_ptr<grpc::Service> makeShardService(Engine& engine, const Model& model,
                                                ShardServiceOptions options) {
  return std::make_unique<ShardService>(engine, model, std::move(options));
}

}  // namespace textgen::runtime
