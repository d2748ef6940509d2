// The step loop behind the shard's RPCs. The router owns KV allocation (blocks and slots) and batch
// composition; the engine keeps each cached batch's request state, runs mixed prefill/decode
// forwards, samples, detokenizes and applies the stopping criteria. Not thread-safe: the service
// serialises calls, as a shard processes one RPC at a time.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "textgen/base/status_or.h"
#include "textgen/base/watermark.h"
#include "textgen/runtime/model.h"
#include "textgen/runtime/sampler.h"
#include "textgen/runtime/sampling.h"
#include "textgen/runtime/stopping.h"
#include "textgen/tokenizer/tokenizer.h"

namespace textgen::grammar {
class GrammarCache;
}  // namespace textgen::grammar

namespace textgen::runtime {

class HostWorkers;

struct RequestSpec {
  uint64_t id = 0;
  std::vector<uint32_t> inputIds;
  SamplingParams sampling;
  StoppingParams stopping;
  bool prefillLogprobs = false;
  std::vector<uint32_t> blocks;
  std::vector<uint32_t> slots;  // empty: derived from blocks
  uint32_t cacheLen = 0;
  std::optional<uint32_t> chunkLen;
  // Resumed after preemption: the last generatedTokens of inputIds are this request's output so
  // far (they count for max_new_tokens and the stop sequences, and its seeded draws continue).
  uint32_t generatedTokens = 0;
  // Positions the request can reach: its prompt (before any generated tokens) + max_new_tokens.
  int64_t maxLength() const {
    return static_cast<int64_t>(inputIds.size()) - generatedTokens + stopping.maxNewTokens;
  }
};

// Blocks appended to a running request's table before a step (the router allocates as the request
// grows instead of reserving prompt + max_new_tokens up front).
struct BlockExtension {
  uint64_t requestId = 0;
  std::vector<uint32_t> blocks;
};

struct TokenList {
  std::vector<uint32_t> ids;
  std::vector<float> logprobs;
  std::vector<std::string> texts;
  std::vector<bool> isSpecial;
};

struct FinishedText {
  std::string text;
  uint32_t generatedTokens = 0;
  FinishReason reason = FinishReason::kLength;
  std::optional<uint64_t> seed;
};

struct GenerationResult {
  uint64_t requestId = 0;
  std::optional<TokenList> prefillTokens;
  TokenList tokens;
  std::optional<FinishedText> finished;
  std::vector<TokenList> topTokens;  // one per token in `tokens`
  // Prefill refused this request alone (the reason); nothing else is set and it is not batched.
  std::optional<std::string> error;

  static GenerationResult refusal(uint64_t id, std::string why) {
    GenerationResult g;
    g.requestId = id;
    g.error = std::move(why);
    return g;
  }
};

struct BatchInfo {
  uint64_t id = 0;
  std::vector<uint64_t> requestIds;
  uint32_t maxTokens = 0;
  uint32_t currentTokens = 0;
};

struct StepResult {
  std::vector<GenerationResult> generations;
  std::optional<BatchInfo> batch;  // absent when every request finished
  uint64_t forwardNs = 0, decodeNs = 0, totalNs = 0;
  std::optional<uint64_t> concatNs;
};

struct WarmupResult {
  uint32_t maxSupportedTotalTokens = 0;
  uint32_t maxInputTokens = 0;
  uint32_t maxTotalTokens = 0;
};

struct EngineOptions {
  int64_t blockSize = 16;
  // KV pool budget in bytes. 0: sized at Warmup from the device's free memory (backends with
  // their own memory only).
  int64_t kvCacheBytes = 0;
  double memoryFraction = 1.0;   // share of the device this process may use (TGI's
                                 // --cuda-memory-fraction)
  double safetyFraction = 0.93;  // of the remaining memory given to the KV pool (TGI's wiggle room)
  // Tensor parallelism: the ranks agree on the KV pool size through it (null: one rank).
  Communicator* comm = nullptr;
  // How the KV pool stores keys and values (TGI's --kv-cache-dtype): the model's dtype, or fp8
  // codes at one byte an element (twice the blocks of a 16-bit cache in the same memory).
  kernels::KvCacheDType kvCacheDtype = kernels::KvCacheDType::kAuto;
  // Speculative decoding (TGI's --speculate): up to this many tokens proposed per decoding request
  // and step by prompt lookup (n-gram), verified in the same forward; 0: off.
  int64_t speculate = 0;
  // The watermark's green-list share and bias (TGI's --watermark-gamma / --watermark-delta).
  double watermarkGamma = 0.5, watermarkDelta = 2.0;
  // Threads for a step's per-request host work (tokens, text, stopping), the caller included.
  // 0: HostWorkers' default (half the cores, at most 8); 1: all on the engine's thread.
  int updateThreads = 0;
};

// A step speculates only while its rows, proposals included, stay within this many.
inline constexpr int64_t kMaxSpeculativeRows = 128;

// Proposes up to `k` tokens to follow `tokens` by prompt lookup: the latest earlier occurrence of
// its last n tokens (n from 3 down to 1, within the last 4096 tokens), and what followed it,
// repeated with its period when it runs into the end. Empty when nothing matches.
std::vector<uint32_t> proposeNgram(std::span<const uint32_t> tokens, int64_t k);

// Speculation counters since the engine started: decoding steps of requests that had a proposal,
// tokens proposed, and proposed tokens accepted.
struct SpeculationStats {
  uint64_t steps = 0, proposed = 0, accepted = 0;
};

class Engine {
 public:
  Engine(Model& model, const tokenizer::Tokenizer& tokenizer, Backend& backend,
         EngineOptions options);
  ~Engine();

  StatusOr<WarmupResult> warmup(uint64_t batchId, std::vector<RequestSpec> requests,
                                std::optional<uint32_t> maxInputTokens, uint32_t maxPrefillTokens,
                                std::optional<uint32_t> maxTotalTokens);
  // A request that fails validation is refused alone (a GenerationResult with `error`); the others
  // run. Errors of the call itself (no KV cache, unknown cached batch) fail it whole.
  // `extensions` name requests of the cached batch (Prefill) or of `batchIds` (Decode); a bad one
  // fails the call before anything changes.
  StatusOr<StepResult> prefill(uint64_t batchId, std::vector<RequestSpec> requests,
                               std::optional<uint64_t> cachedBatchId,
                               const std::vector<BlockExtension>& extensions = {});
  // `followsStep`: the call was planned while the step before it ran (a pipelined Decode), so
  // batches and requests that step finished are skipped, with their extensions; with nothing left
  // it steps nothing.
  StatusOr<StepResult> decode(std::vector<uint64_t> batchIds,
                              std::vector<BlockExtension> extensions = {},
                              bool followsStep = false);
  StatusOr<BatchInfo> filter(uint64_t batchId, const std::vector<uint64_t>& keep);
  void clear(std::optional<uint64_t> batchId);

  const EngineOptions& options() const { return options_; }
  const SpeculationStats& speculationStats() const { return specStats_; }
  int64_t maxContext() const;  // longest prompt + generation the model allows
  // Whether the last prefill or decode reached the model's forward. A call refused before it (a
  // bad batch id, a request id in use, a bad block extension) ran no collective and did nothing
  // that differs between ranks: the ranks of a tensor-parallel group, given the same call, refuse
  // it alike and stay in step. One that failed in or after the forward may have left them out of
  // step.
  bool lastCallReachedForward() const { return reachedForward_; }
  // For tests and fuzzers (a walk over every live table): INTERNAL when the per-block holder
  // counts differ from the live tables, or a block one live request may still write is in
  // another's table.
  Status auditBlocks() const;

 private:
  struct Request;
  struct Batch;
  struct StepPlan;
  struct StepOutputs;
  struct RequestUpdate;
  Status validate(const RequestSpec& r) const;
  // The request's grammar matcher, compiled or from the cache (INVALID_ARGUMENT: a bad grammar).
  Status attachGrammar(Request& r);
  // This step's proposal for a decoding request (Request::draft), within its blocks and
  // max_new_tokens, cut where its grammar would refuse a token.
  void propose(Request& r) const;
  // The watermark's green list after `previous` (the engine's gamma, the model's vocabulary).
  std::span<const uint32_t> greenList(uint32_t previous);
  // Per KV block: how many live requests' tables hold it (a request counts from its acceptance
  // until it is destroyed), and the last request that took it to write, with its place in that
  // request's table (still writing it while the place is at or past its firstWritable()).
  struct BlockUse {
    uint32_t holders = 0;
    const Request* writer = nullptr;
    uint32_t index = 0;
  };
  const BlockUse& use(uint32_t block) const;
  // INVALID_ARGUMENT unless `r` may take its table: the blocks it writes are nobody else's, and its
  // cached prefix is no live request's still to write.
  Status checkTable(const Request& r) const;
  // Appends each extension's blocks to its request in `batchIds`, all or none.
  Status extend(const std::vector<uint64_t>& batchIds, const std::vector<BlockExtension>& ext);
  // One step: schedule (the forward's rows and how tokens are chosen) -> execute (the model's
  // forward, then the sampler's choice) -> update (tokens, text, stopping; finished requests leave
  // the batch).
  StatusOr<StepResult> step(std::unique_ptr<Batch> batch);
  StepPlan schedule(Batch& batch);
  StatusOr<StepOutputs> execute(const StepPlan& plan);
  StepResult update(Batch& batch, const StepPlan& plan, StepOutputs& outputs);
  // Request `i` of the step's batch: independent of the others (the host workers run several).
  RequestUpdate updateRequest(Request& r, size_t i, const StepPlan& plan, StepOutputs& outputs);
  BatchInfo info(const Batch& b) const;
  // Every decode graph of the model captured (and its GEMMs tuned) at Warmup, as TGI does, rather
  // than in the first step of each batch size that some request takes.
  Status captureDecodeGraphs();

  Model& model_;
  const tokenizer::Tokenizer& tokenizer_;
  Backend& backend_;
  EngineOptions options_;
  Sampler sampler_;  // token choice over the model's logits, where they are
  // Compiled grammars and their token masks over this model's vocabulary (built on first use).
  std::unique_ptr<grammar::GrammarCache> grammars_;
  // A background thread computing a new grammar's masks ahead of its requests' steps.
  class GrammarWarmer;
  std::unique_ptr<GrammarWarmer> warmer_;
  std::unique_ptr<KvCache> cache_;
  // Indexed by block (a Request keeps its counts while it lives; declared before batches_, which
  // it outlives).
  std::vector<BlockUse> blockUses_;
  std::map<uint64_t, std::unique_ptr<Batch>> batches_;
  std::unique_ptr<GreenListCache> greens_;
  SpeculationStats specStats_;
  bool reachedForward_ = false;           // lastCallReachedForward()
  std::unique_ptr<HostWorkers> workers_;  // null: one thread
};

}  // namespace textgen::runtime
