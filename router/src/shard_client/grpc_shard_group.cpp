#include <grpcpp/grpcpp.h>

#include <future>

#include "textgen/router/shard_client.h"
#include "textgen/shard/v1/shard.grpc.pb.h"
#include "textgen/tracing/tracing.h"

namespace textgen::router {
namespace {

namespace pb = textgen::shard::v1;

Status fromGrpc(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return okStatus();
  return Status(static_cast<StatusCode>(s.error_code()), what + ": " + s.error_message());
}

TokenList fromProto(const pb::Tokens& t) {
  TokenList out;
  out.ids.assign(t.ids().begin(), t.ids().end());
  out.logprobs.assign(t.logprobs().begin(), t.logprobs().end());
  out.texts.assign(t.texts().begin(), t.texts().end());
  out.isSpecial.assign(t.is_special().begin(), t.is_special().end());
  return out;
}

CachedBatch fromProto(const pb::CachedBatch& b) {
  return {
      b.id(), {b.request_ids().begin(), b.request_ids().end()}, b.max_tokens(), b.current_tokens()};
}

void toProto(const CachedBatch& b, pb::CachedBatch* out) {
  out->set_id(b.id);
  for (uint64_t id : b.requestIds) out->add_request_ids(id);
  out->set_size(static_cast<uint32_t>(b.requestIds.size()));
  out->set_max_tokens(b.maxTokens);
  out->set_current_tokens(b.currentTokens);
}

void toProto(uint64_t batchId, const std::vector<BatchEntry>& batch, pb::Batch* out) {
  out->set_id(batchId);
  uint32_t maxTokens = 0, maxBlocks = 0;
  for (const BatchEntry& e : batch) {
    const ValidRequest& v = e.entry.request;
    pb::Request* r = out->add_requests();
    r->set_id(e.entry.id);
    for (uint32_t id : v.inputIds) r->add_input_ids(id);
    r->set_inputs(v.inputs);
    auto* p = r->mutable_parameters();
    p->set_temperature(v.temperature);
    p->set_top_k(v.topK);
    p->set_top_p(v.topP);
    p->set_typical_p(v.typicalP);
    p->set_do_sample(v.doSample);
    p->set_seed(v.seed);
    p->set_repetition_penalty(v.repetitionPenalty);
    p->set_frequency_penalty(v.frequencyPenalty);
    p->set_presence_penalty(v.presencePenalty);
    p->set_watermark(v.watermark);
    if (v.grammar) {
      p->set_grammar(v.grammar->value);
      p->set_grammar_type(v.grammar->type == Grammar::Type::kJson ? pb::GRAMMAR_TYPE_JSON
                                                                  : pb::GRAMMAR_TYPE_REGEX);
    }
    auto* s = r->mutable_stopping_parameters();
    s->set_max_new_tokens(v.maxNewTokens);
    for (const std::string& stop : v.stop) s->add_stop_sequences(stop);
    r->set_prefill_logprobs(v.decoderInputDetails);
    r->set_top_n_tokens(v.topNTokens);
    for (uint32_t b : e.blocks.blocks) r->add_blocks(b);
    for (uint32_t sl : e.blocks.slots) r->add_slots(sl);
    r->set_add_special_tokens(v.addSpecialTokens);
    r->set_cache_len(e.blocks.cacheLen);
    if (e.chunkLen) r->set_chunk_len(*e.chunkLen);
    r->set_generated_tokens(e.entry.generated);
    maxTokens += v.inputLength - e.entry.generated + v.maxNewTokens;
    maxBlocks = std::max<uint32_t>(maxBlocks, static_cast<uint32_t>(e.blocks.blocks.size()));
  }
  out->set_size(static_cast<uint32_t>(batch.size()));
  out->set_max_tokens(maxTokens);
  out->set_max_blocks(maxBlocks);
}

void toProto(const std::vector<BlockExtension>& in,
             google::protobuf::RepeatedPtrField<pb::BlockExtension>* out) {
  for (const BlockExtension& e : in) {
    pb::BlockExtension* x = out->Add();
    x->set_request_id(e.requestId);
    for (uint32_t b : e.blocks) x->add_blocks(b);
  }
}

template <typename Response>
StepOutput stepFromProto(const Response& r) {
  StepOutput out;
  for (const pb::Generation& g : r.generations()) {
    Generation gen;
    gen.requestId = g.request_id();
    if (g.has_error()) gen.error = g.error();
    if (g.has_prefill_tokens() && g.prefill_tokens().ids_size() > 0)
      gen.prefillTokens = fromProto(g.prefill_tokens());
    gen.tokens = fromProto(g.tokens());
    for (const pb::Tokens& t : g.top_tokens()) gen.topTokens.push_back(fromProto(t));
    if (g.has_generated_text()) {
      const auto& t = g.generated_text();
      GeneratedText text{t.text(), t.generated_tokens(), FinishReason::kLength, std::nullopt};
      if (t.finish_reason() == pb::FINISH_REASON_EOS_TOKEN) text.reason = FinishReason::kEosToken;
      if (t.finish_reason() == pb::FINISH_REASON_STOP_SEQUENCE)
        text.reason = FinishReason::kStopSequence;
      if (t.has_seed()) text.seed = t.seed();
      gen.generatedText = std::move(text);
    }
    out.generations.push_back(std::move(gen));
  }
  if (r.has_batch()) out.batch = fromProto(r.batch());
  out.forward = std::chrono::nanoseconds(r.forward_ns());
  out.decode = std::chrono::nanoseconds(r.decode_ns());
  out.total = std::chrono::nanoseconds(r.total_ns());
  if (r.has_concat_ns()) out.concat = std::chrono::nanoseconds(r.concat_ns());
  return out;
}

using Deadline = std::chrono::microseconds;

class GrpcShardGroup final : public ShardGroup {
 public:
  GrpcShardGroup(std::vector<std::string> urls,
                 std::vector<std::unique_ptr<pb::ShardService::Stub>> stubs,
                 ShardDeadlines deadlines)
      : urls_(std::move(urls)), stubs_(std::move(stubs)), deadlines_(deadlines) {}

  const std::vector<std::string>& urls() const override { return urls_; }

  StatusOr<ShardInfo> info() override {
    pb::InfoResponse r;
    TG_RETURN_IF_ERROR(fanOut<pb::InfoRequest, pb::InfoResponse>(&pb::ShardService::Stub::Info, {},
                                                                 &r, "Info", deadlines_.control));
    ShardInfo i;
    i.requiresPadding = r.requires_padding();
    i.dtype = r.dtype();
    i.deviceType = r.device_type();
    if (r.has_window_size()) i.windowSize = r.window_size();
    i.speculate = r.speculate();
    i.supportChunking = r.support_chunking();
    i.usePrefixCaching = r.use_prefix_caching();
    i.orderedDecode = r.ordered_decode();
    i.attentionImpl = r.attention_impl();
    i.blockSize = r.block_size();
    i.maxPositionEmbeddings = r.max_position_embeddings();
    i.vocabSize = r.vocab_size();
    i.worldSize = r.world_size();
    i.encoderDecoder = r.model_kind() == pb::MODEL_KIND_ENCODER_DECODER;
    return i;
  }

  Status health() override {
    pb::HealthResponse r;
    return fanOut<pb::HealthRequest, pb::HealthResponse>(&pb::ShardService::Stub::Health, {}, &r,
                                                         "Health", deadlines_.health);
  }

  Status clearCache(std::optional<uint64_t> batchId) override {
    pb::ClearCacheRequest req;
    if (batchId) req.set_id(*batchId);
    pb::ClearCacheResponse r;
    return fanOut(&pb::ShardService::Stub::ClearCache, req, &r, "ClearCache", deadlines_.control);
  }

  StatusOr<WarmupOutput> warmup(uint64_t batchId, const std::vector<BatchEntry>& batch,
                                std::optional<uint32_t> maxInputTokens, uint32_t maxPrefillTokens,
                                std::optional<uint32_t> maxTotalTokens) override {
    pb::WarmupRequest req;
    toProto(batchId, batch, req.mutable_batch());
    if (maxInputTokens) req.set_max_input_tokens(*maxInputTokens);
    req.set_max_prefill_tokens(maxPrefillTokens);
    if (maxTotalTokens) req.set_max_total_tokens(*maxTotalTokens);
    pb::WarmupResponse r;
    TG_RETURN_IF_ERROR(
        fanOut(&pb::ShardService::Stub::Warmup, req, &r, "Warmup", deadlines_.warmup));
    WarmupOutput w;
    if (r.has_max_supported_total_tokens())
      w.maxSupportedTotalTokens = r.max_supported_total_tokens();
    w.maxInputTokens = r.max_input_tokens();
    w.maxTotalTokens = r.max_total_tokens();
    return w;
  }

  StatusOr<StepOutput> prefill(uint64_t batchId, const std::vector<BatchEntry>& batch,
                               const std::optional<CachedBatch>& cached,
                               const std::vector<BlockExtension>& extensions) override {
    pb::PrefillRequest req;
    toProto(batchId, batch, req.mutable_batch());
    if (cached) toProto(*cached, req.mutable_cached_batch());
    toProto(extensions, req.mutable_extensions());
    pb::PrefillResponse r;
    uint64_t tokens = 0;
    for (const BatchEntry& e : batch)
      tokens += e.chunkLen ? *e.chunkLen : e.entry.request.inputIds.size();
    if (cached) tokens += std::max<uint64_t>(cached->currentTokens, cached->requestIds.size());
    TG_RETURN_IF_ERROR(
        fanOut(&pb::ShardService::Stub::Prefill, req, &r, "Prefill", stepDeadline(tokens)));
    return stepFromProto(r);
  }

  StatusOr<StepOutput> decode(const std::vector<CachedBatch>& batches,
                              const std::vector<BlockExtension>& extensions,
                              const DecodeOrder& order) override {
    pb::DecodeRequest req;
    for (const CachedBatch& b : batches) toProto(b, req.add_batches());
    toProto(extensions, req.mutable_extensions());
    if (order.step) req.set_step(*order.step);
    if (order.after) req.set_after_step(*order.after);
    pb::DecodeResponse r;
    // The rows the step computes: one per request, more for a request still prefilling in chunks
    // (its next chunk runs in this Decode).
    uint64_t tokens = 0;
    for (const CachedBatch& b : batches)
      tokens += std::max<uint64_t>(b.currentTokens, b.requestIds.size());
    // A pipelined step may wait for its predecessor, about as large, before it runs.
    if (order.after) tokens *= 2;
    Deadline deadline = stepDeadline(tokens);
    if (order.after) deadline += deadlines_.step;
    TG_RETURN_IF_ERROR(fanOut(&pb::ShardService::Stub::Decode, req, &r, "Decode", deadline));
    StepOutput out = stepFromProto(r);
    out.queue = std::chrono::nanoseconds(r.queue_ns());
    return out;
  }

  StatusOr<CachedBatch> filter(uint64_t batchId, const std::vector<uint64_t>& keep) override {
    pb::FilterBatchRequest req;
    req.set_batch_id(batchId);
    for (uint64_t id : keep) req.add_request_ids(id);
    pb::FilterBatchResponse r;
    TG_RETURN_IF_ERROR(
        fanOut(&pb::ShardService::Stub::FilterBatch, req, &r, "FilterBatch", deadlines_.control));
    return fromProto(r.batch());
  }

 private:
  Deadline stepDeadline(uint64_t tokens) const {
    return Deadline(deadlines_.step) + deadlines_.perToken * static_cast<int64_t>(tokens);
  }

  // Calls every rank in parallel, each call bounded by `deadline`; rank 0's response is kept; the
  // first error wins (DEADLINE_EXCEEDED names the call and the shard).
  template <typename Req, typename Resp>
  Status fanOut(grpc::Status (pb::ShardService::Stub::*method)(grpc::ClientContext*, const Req&,
                                                               Resp*),
                const Req& req, Resp* rank0, const char* what, Deadline deadline) {
    std::vector<std::future<grpc::Status>> calls;
    std::vector<Resp> others(stubs_.size());
    const auto until = std::chrono::system_clock::now() + deadline;
    // A traced step's context, for the shards' spans (W3C trace context in gRPC metadata).
    const std::optional<tracing::SpanContext> trace = tracing::currentContext();
    const std::string traceparent = trace ? tracing::formatTraceparent(*trace) : std::string();
    auto one = [&](size_t i, Resp* out) {
      grpc::ClientContext ctx;
      ctx.set_deadline(until);
      if (!traceparent.empty()) ctx.AddMetadata("traceparent", traceparent);
      return (stubs_[i].get()->*method)(&ctx, req, out);
    };
    // Ranks 1.. on their own threads, rank 0 on this one (a single rank costs no thread).
    for (size_t i = 1; i < stubs_.size(); ++i)
      calls.push_back(std::async(std::launch::async, one, i, &others[i]));
    Status first = fromGrpc(one(0, rank0), std::string(what) + " on " + urls_[0]);
    for (size_t i = 1; i < stubs_.size(); ++i) {
      Status s = fromGrpc(calls[i - 1].get(), std::string(what) + " on " + urls_[i]);
      if (first.ok() && !s.ok()) first = s;
    }
    return first;
  }

  std::vector<std::string> urls_;
  std::vector<std::unique_ptr<pb::ShardService::Stub>> stubs_;
  ShardDeadlines deadlines_;
};

std::shared_ptr<grpc::Channel> channel(const std::string& url) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 * 1024 * 1024);
  args.SetMaxSendMessageSize(256 * 1024 * 1024);
  return grpc::CreateCustomChannel(url, grpc::InsecureChannelCredentials(), args);
}

}  // namespace

StatusOr<std::unique_ptr<ShardGroup>> connectShardGroup(const std::string& master,
                                                        std::chrono::milliseconds deadline,
                                                        ShardDeadlines deadlines) {
  auto stub = pb::ShardService::NewStub(channel(master));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  ctx.set_wait_for_ready(true);  // the master may still be starting
  pb::ServiceDiscoveryResponse d;
  grpc::Status s = stub->ServiceDiscovery(&ctx, {}, &d);
  if (!s.ok())
    return unavailableError("shard master " + master +
                            ": ServiceDiscovery failed: " + s.error_message());
  if (d.urls_size() == 0) return unavailableError("shard master " + master + " listed no ranks");
  std::vector<std::string> urls(d.urls().begin(), d.urls().end());
  std::vector<std::unique_ptr<pb::ShardService::Stub>> stubs;
  for (const std::string& url : urls) stubs.push_back(pb::ShardService::NewStub(channel(url)));
  return std::unique_ptr<ShardGroup>(
      std::make_unique<GrpcShardGroup>(std::move(urls), std::move(stubs), deadlines));
}

}  // namespace textgen::router
