// A loaded model: one forward over a flattened batch of new tokens of several sequences, writing
// their keys and values into the paged KV cache and leaving the logits of the requested rows where
// they are computed. Choosing tokens from them is the next stage's (sampler.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "textgen/base/status_or.h"
#include "textgen/kernels/kv_cache_dtype.h"
#include "textgen/runtime/backend.h"
#include "textgen/runtime/communicator.h"
#include "textgen/runtime/model_config.h"
#include "textgen/runtime/quantization_config.h"

namespace textgen::runtime {

// What one rank keeps per cached token and layer: its share of the key/value heads.
struct KvShape {
  int64_t layers = 0, kvHeads = 0, headDim = 0;
};

// Paged keys and values of every layer: [numBlocks * blockSize slots, kvHeads, headDim] each,
// for a model computing in `dtype`, stored in it or as fp8 codes (cacheDtype,
// textgen/kernels/kv_cache_dtype.h: one byte an element).
class KvCache {
 public:
  static StatusOr<std::unique_ptr<KvCache>> create(
      Backend& backend, const KvShape& shape, int64_t numBlocks, int64_t blockSize,
      kernels::DType dtype = kernels::DType::kF32,
      kernels::KvCacheDType cacheDtype = kernels::KvCacheDType::kAuto);
  // Bytes one block takes across all layers (keys and values).
  static int64_t bytesPerBlock(const KvShape& shape, int64_t blockSize,
                               kernels::DType dtype = kernels::DType::kF32,
                               kernels::KvCacheDType cacheDtype = kernels::KvCacheDType::kAuto);

  int64_t numBlocks() const { return numBlocks_; }
  int64_t blockSize() const { return blockSize_; }
  int64_t numSlots() const { return numBlocks_ * blockSize_; }
  kernels::DType dtype() const { return dtype_; }  // the model's compute dtype
  kernels::KvCacheDType cacheDtype() const { return cacheDtype_; }
  uint64_t id() const { return id_; }  // unique per cache created (graphs are bound to one)
  void* keys(int64_t layer) { return keys_[layer]->data(); }
  void* values(int64_t layer) { return values_[layer]->data(); }

 private:
  int64_t numBlocks_ = 0, blockSize_ = 0;
  uint64_t id_ = 0;
  kernels::DType dtype_ = kernels::DType::kF32;
  kernels::KvCacheDType cacheDtype_ = kernels::KvCacheDType::kAuto;
  std::vector<std::unique_ptr<Buffer>> keys_, values_;
};

// An encoder-decoder sequence's cross-attention context: the encoder's output over its prompt,
// kept as every decoder layer's cross keys and values in positions [0, encoderLen) of `blocks`
// (its own blocks, apart from those of its decoder self-attention). A sequence that starts this
// step (`encode`) has its prompt run through the encoder first, which writes them.
struct CrossContext {
  int64_t encoderLen = 0;
  bool encode = false;
  std::span<const uint32_t> blocks;
};

struct ForwardBatch {
  std::vector<uint32_t> tokenIds;       // [rows]
  std::vector<uint32_t> slots;          // [rows]: where each row's key and value go
  std::vector<SequenceRows> sequences;  // which rows belong to which sequence
  std::vector<int64_t> logitRows;       // rows whose logits are wanted
  // Every sequence decodes (its last token, and with speculative decoding the tokens proposed after
  // it): no prompt rows. Such a step's rows are each computed as a one-row decode computes them
  // (Backend::setGemvRows up to ModelOptions::graphRowsPerSequence rows).
  bool decode = false;
  // Encoder-decoder models only (ModelConfig::isEncoderDecoder): one per sequence, and the
  // prompts of the sequences that encode this step, one after another in sequence order.
  std::vector<CrossContext> cross;
  std::vector<uint32_t> encoderTokenIds;
};

// A step's logits where the model computed them: [rows, vocab] in `dtype` at the start of
// `buffer`, backend memory (device memory on CUDA, host memory on the CPU backend). Valid until the
// model's next forward; on a tensor-parallel rank, every vocabulary column (whole rows).
struct LogitsView {
  Buffer* buffer = nullptr;
  int64_t rows = 0, vocab = 0;
  kernels::DType dtype = kernels::DType::kF32;
  const void* data() const { return buffer->data(); }
};

// The view's rows on the host as float32 (a blocking download, widened from float16/bfloat16).
StatusOr<std::vector<float>> downloadLogits(Backend& backend, const LogitsView& logits);

struct ModelOptions {
  // Tensor parallelism: this process's rank of the group (Megatron splits; every rank returns
  // the same logits). Null: the whole model on one rank.
  Communicator* comm = nullptr;
  // Weights, activations and the KV cache (unless the engine stores it in fp8:
  // EngineOptions::kvCacheDtype).
  kernels::DType dtype = kernels::DType::kF32;
  // Decode steps of up to these many sequences replay a captured graph (padded to the next
  // size), on backends with graphs; empty: never (TGI's --cuda-graphs).
  std::vector<int64_t> graphBatchSizes;
  // Decode steps whose sequences each bring the same number of rows, up to this many (1 + TGI's
  // --speculate: the last token and the proposed ones), replay graphs too.
  int64_t graphRowsPerSequence = 1;
  // --quantize's load-time formats: the dense checkpoint's linear layers quantized as they load
  // (a pre-quantized checkpoint's layers are read in their own format, without any option).
  LoadQuantization quantize = LoadQuantization::kNone;
  // Medusa heads (layers/medusa.h) read from this directory's medusa_lm_head.safetensors: the
  // first `medusaHeads` heads (TGI's --speculate), each of `medusaLayers` residual blocks. Empty:
  // none.
  std::string medusaDir = {};
  int64_t medusaHeads = 0, medusaLayers = 1;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  virtual kernels::DType dtype() const = 0;
  // This rank's share of the KV cache.
  virtual KvShape kvShape() const = 0;
  // Enqueues the forward on the backend's stream and returns the logits of batch.logitRows, in
  // that order, where they are computed (no stream synchronisation; nothing crosses to the host):
  // token choice is the Sampler's (sampler.h). INVALID_ARGUMENT for an inconsistent batch (a slot
  // or token id out of range, rows not covered by the sequences).
  virtual StatusOr<LogitsView> forwardLogits(const ForwardBatch& batch, KvCache& cache) = 0;
  // forwardLogits, then downloadLogits: [logitRows.size(), vocab] on the host (tests, benches).
  virtual StatusOr<std::vector<float>> forward(const ForwardBatch& batch, KvCache& cache) = 0;
  // Buffers for forwards of up to `rows` rows that want up to `logitRows` logit rows (a decode of
  // that many sequences, or a prefill with its prompt's log-probabilities) allocated now: at
  // Warmup, before the KV pool takes the free memory, so that no later step allocates them (or, by
  // moving them, drops the captured graphs).
  virtual Status reserveRows(int64_t rows, int64_t logitRows) {
    (void)rows;
    (void)logitRows;
    return okStatus();
  }
  // The batch sizes whose decode steps replay a captured graph (ModelOptions::graphBatchSizes,
  // ascending); empty when none do.
  virtual std::vector<int64_t> graphBatchSizes() const { return {}; }
  // Medusa heads loaded with the model (ModelOptions::medusaDir), 0 without.
  virtual int64_t speculativeHeads() const { return 0; }
  // After a forward, each head's arg-max at each of its logit rows: [heads][logitRows] (a blocking
  // download). Empty without heads, or for a step of more than 128 logit rows (none computed).
  virtual StatusOr<std::vector<uint32_t>> speculativeIds() { return std::vector<uint32_t>(); }
};

// Loads a Hugging Face model directory (config.json, generation_config.json, safetensors).
StatusOr<std::unique_ptr<Model>> loadModel(const std::string& modelDir, Backend& backend,
                                           const ModelOptions& options = {});

// A model directory's config.json as loadModel reads it: its class ("architectures"[0]) looked up
// in the architecture registry, its keys as that class spells them. UNIMPLEMENTED naming an
// unregistered class and the registered ones.
StatusOr<ModelConfig> loadArchitectureConfig(const std::string& modelDir);

}  // namespace textgen::runtime
