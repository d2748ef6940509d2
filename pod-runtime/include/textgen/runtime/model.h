// A loaded model: one forward over a flattened batch of new tokens of several sequences, writing
// their keys and values into the paged KV cache and returning logits for the requested rows.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "textgen/base/status_or.h"
#include "textgen/runtime/backend.h"
#include "textgen/runtime/communicator.h"
#include "textgen/runtime/model_config.h"

namespace textgen::runtime {

// What one rank keeps per cached token and layer: its share of the key/value heads.
struct KvShape {
  int64_t layers = 0, kvHeads = 0, headDim = 0;
};

// Paged keys and values of every layer: [numBlocks * blockSize slots, kvHeads, headDim] each.
class KvCache {
 public:
  static StatusOr<std::unique_ptr<KvCache>> create(Backend& backend, const KvShape& shape,
                                                   int64_t numBlocks, int64_t blockSize,
                                                   kernels::DType dtype = kernels::DType::kF32);
  // Bytes one block takes across all layers (keys and values).
  static int64_t bytesPerBlock(const KvShape& shape, int64_t blockSize,
                               kernels::DType dtype = kernels::DType::kF32);

  int64_t numBlocks() const { return numBlocks_; }
  int64_t blockSize() const { return blockSize_; }
  int64_t numSlots() const { return numBlocks_ * blockSize_; }
  kernels::DType dtype() const { return dtype_; }
  uint64_t id() const { return id_; }  // unique per cache created (graphs are bound to one)
  void* keys(int64_t layer) { return keys_[layer]->data(); }
  void* values(int64_t layer) { return values_[layer]->data(); }

 private:
  int64_t numBlocks_ = 0, blockSize_ = 0;
  uint64_t id_ = 0;
  kernels::DType dtype_ = kernels::DType::kF32;
  std::vector<std::unique_ptr<Buffer>> keys_, values_;
};

struct ForwardBatch {
  std::vector<uint32_t> tokenIds;       // [rows]
  std::vector<uint32_t> slots;          // [rows]: where each row's key and value go
  std::vector<SequenceRows> sequences;  // which rows belong to which sequence
  std::vector<int64_t> logitRows;       // rows whose logits are wanted
};

// A greedy choice made where the logits are: the arg-max and its log-probability.
struct GreedyToken {
  uint32_t id = 0;
  float logprob = 0.0f;
};

// Per logit row, what kernels::sample needs (row ranges index the shared arrays).
struct SampleBatch {
  std::vector<kernels::SampleRow> rows;
  std::vector<int32_t> historyTokens, historyCounts, biasTokens;
  std::vector<float> biasValues;
  int64_t maxTopN = 0;
};

// A token chosen where the logits are, with its top-n alternatives (best first).
struct SampledToken {
  uint32_t id = 0;
  float logprob = 0.0f;
  std::vector<std::pair<uint32_t, float>> top;
};

struct ModelOptions {
  // Tensor parallelism: this process's rank of the group (Megatron splits; every rank returns
  // the same logits). Null: the whole model on one rank.
  Communicator* comm = nullptr;
  kernels::DType dtype = kernels::DType::kF32;  // weights, activations and KV cache
  // Decode steps of up to these many sequences replay a captured graph (padded to the next
  // size), on backends with graphs; empty: never (TGI's --cuda-graphs).
  std::vector<int64_t> graphBatchSizes;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  virtual kernels::DType dtype() const = 0;
  // This rank's share of the KV cache.
  virtual KvShape kvShape() const = 0;
  // Logits [logitRows.size(), vocab] on the host. INVALID_ARGUMENT for an inconsistent batch
  // (a slot or token id out of range, rows not covered by the sequences).
  virtual StatusOr<std::vector<float>> forward(const ForwardBatch& batch, KvCache& cache) = 0;
  // The same forward, returning only each logit row's greedy token (no logits cross to the host).
  virtual StatusOr<std::vector<GreedyToken>> forwardGreedy(const ForwardBatch& batch,
                                                           KvCache& cache) = 0;
  // The same forward, then each logit row's token chosen by kernels::sample where the logits are.
  virtual StatusOr<std::vector<SampledToken>> forwardSample(const ForwardBatch& batch,
                                                            KvCache& cache,
                                                            const SampleBatch& sampling) = 0;
};

// Loads a Hugging Face model directory (config.json, generation_config.json, safetensors).
StatusOr<std::unique_ptr<Model>> loadModel(const std::string& modelDir, Backend& backend,
                                           const ModelOptions& options = {});

// A model directory's config.json as loadModel reads it: its class ("architectures"[0]) looked up
// in the architecture registry, its keys as that class spells them. UNIMPLEMENTED naming an
// unregistered class and the registered ones.
StatusOr<ModelConfig> loadArchitectureConfig(const std::string& modelDir);

}  // namespace textgen::runtime
