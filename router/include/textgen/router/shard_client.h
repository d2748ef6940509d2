// The router's view of one replica: a group of shards (one per tensor-parallel rank) reached
// through the master's ServiceDiscovery. Every RPC goes to every rank, in parallel; rank 0's answer
// is used. These types keep the scheduler free of protobuf: shard_client is the router's only proto
// user.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "textgen/base/status_or.h"
#include "textgen/router/queue.h"

namespace textgen::router {

struct ShardInfo {
  bool requiresPadding = false;
  std::string dtype;
  std::string deviceType;
  std::optional<uint32_t> windowSize;
  uint32_t speculate = 0;
  bool supportChunking = false;
  bool usePrefixCaching = false;
  bool orderedDecode = false;  // Decode honours step / after_step
  std::string attentionImpl;
  uint32_t blockSize = 16;
  uint32_t maxPositionEmbeddings = 0;
  uint32_t vocabSize = 0;
  uint32_t worldSize = 1;
  // T5: the prompt is the encoder's; its blocks come before the decoder's (shard.proto ModelKind).
  bool encoderDecoder = false;
};

struct CachedBatch {
  uint64_t id = 0;
  std::vector<uint64_t> requestIds;
  uint32_t maxTokens = 0;
  uint32_t currentTokens = 0;
};

struct TokenList {
  std::vector<uint32_t> ids;
  std::vector<float> logprobs;
  std::vector<std::string> texts;
  std::vector<bool> isSpecial;
};

enum class FinishReason { kLength, kEosToken, kStopSequence };

struct GeneratedText {
  std::string text;
  uint32_t generatedTokens = 0;
  FinishReason reason = FinishReason::kLength;
  std::optional<uint64_t> seed;
};

struct Generation {
  uint64_t requestId = 0;
  std::optional<TokenList> prefillTokens;
  TokenList tokens;
  std::vector<TokenList> topTokens;
  std::optional<GeneratedText> generatedText;
  // Set when the shard refused this request alone (it is not in the returned batch).
  std::optional<std::string> error;
};

struct StepOutput {
  std::vector<Generation> generations;
  std::optional<CachedBatch> batch;
  std::chrono::nanoseconds forward{0}, decode{0}, total{0};
  std::optional<std::chrono::nanoseconds> concat;
  // A pipelined Decode's wait on the shard for the step it follows.
  std::chrono::nanoseconds queue{0};
};

// A Decode's place in the router's sequence of steps (DecodeRequest's step and after_step): a
// pipelined one runs on the shards right after step `after`, which is still running or in flight
// when it is sent.
struct DecodeOrder {
  std::optional<uint64_t> step;
  std::optional<uint64_t> after;
};

// Blocks appended to a running request's table before a step (Prefill's cached batch or Decode).
struct BlockExtension {
  uint64_t requestId = 0;
  std::vector<uint32_t> blocks;
};

struct WarmupOutput {
  std::optional<uint32_t> maxSupportedTotalTokens;
  uint32_t maxInputTokens = 0;
  uint32_t maxTotalTokens = 0;
};

// What the batcher needs from a replica; a fake implements it in the scheduler's unit tests.
class ShardGroup {
 public:
  virtual ~ShardGroup() = default;
  virtual StatusOr<ShardInfo> info() = 0;
  virtual Status health() = 0;
  virtual Status clearCache(std::optional<uint64_t> batchId) = 0;
  virtual StatusOr<WarmupOutput> warmup(uint64_t batchId, const std::vector<BatchEntry>& batch,
                                        std::optional<uint32_t> maxInputTokens,
                                        uint32_t maxPrefillTokens,
                                        std::optional<uint32_t> maxTotalTokens) = 0;
  // `extensions` name requests of `cached` (Prefill) or of `batches` (Decode).
  virtual StatusOr<StepOutput> prefill(uint64_t batchId, const std::vector<BatchEntry>& batch,
                                       const std::optional<CachedBatch>& cached,
                                       const std::vector<BlockExtension>& extensions = {}) = 0;
  virtual StatusOr<StepOutput> decode(const std::vector<CachedBatch>& batches,
                                      const std::vector<BlockExtension>& extensions = {},
                                      const DecodeOrder& order = {}) = 0;
  virtual StatusOr<CachedBatch> filter(uint64_t batchId, const std::vector<uint64_t>& keep) = 0;
  // Every rank's address, rank 0 first.
  virtual const std::vector<std::string>& urls() const = 0;
};

// Every RPC to a shard has a deadline, so a frozen shard (stopped, deadlocked, partitioned) fails
// the calls it holds within seconds instead of hanging the replica and /health; the replica
// recovers (ClearCache + Warmup) once the shard answers again. Prefill and Decode get a deadline
// derived from their batch: `step` plus `perToken` for each token the call computes (prompt tokens
// for Prefill, one per request for Decode).
struct ShardDeadlines {
  std::chrono::milliseconds health{2'000};
  std::chrono::milliseconds control{10'000};  // Info, ClearCache, FilterBatch
  std::chrono::milliseconds warmup{600'000};  // sizes the KV cache, captures graphs
  std::chrono::milliseconds step{10'000};
  std::chrono::microseconds perToken{50'000};
};

// Connects to the master ("unix:///path" or "host:port"), discovers the ranks and connects to each.
// UNAVAILABLE when the master does not answer before `deadline`.
StatusOr<std::unique_ptr<ShardGroup>> connectShardGroup(const std::string& master,
                                                        std::chrono::milliseconds deadline,
                                                        ShardDeadlines deadlines = {});

}  // namespace textgen::router
