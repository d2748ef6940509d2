// The batched operations a model is written against. A forward pass runs over a flattened batch of
// tokens from several sequences; keys and values live in a paged cache addressed by slots
// (slot = block * blockSize + offset), whose allocation the router owns. The CPU backend implements
// these on host memory; the CUDA backend (later) implements the same operations on the device, so
// there is one model, not two. Pointers are backend memory, opaque to the model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "textgen/base/status_or.h"
#include "textgen/kernels/rms_norm.h"

namespace textgen::runtime {

// Backend memory, freed with the object.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() = 0;
  virtual size_t bytes() const = 0;
  float* f32() { return static_cast<float*>(data()); }
};

// One sequence's rows of a flattened batch.
struct SequenceRows {
  int64_t firstRow = 0;  // first row of the batch that belongs to this sequence
  int64_t numRows = 0;   // its new tokens in this forward
  int64_t startPos = 0;  // position of its first new token (tokens already in the cache)
  std::span<const uint32_t> blocks;  // the sequence's KV-cache block table
};

struct EmbeddingParams {
  const float* table = nullptr;   // [vocab, hidden]
  const uint32_t* ids = nullptr;  // [rows]
  float* out = nullptr;           // [rows, hidden]
  int64_t rows = 0, hidden = 0, vocab = 0;
};

// y[rows, out] = x[rows, in] · W[out, in]ᵀ
struct LinearParams {
  const float* x = nullptr;
  const float* weight = nullptr;
  float* y = nullptr;
  int64_t rows = 0, in = 0, out = 0;
};

// Rotates, in place, the first rotaryDim dimensions of every head of q and k (rotate-half layout).
struct RopeParams {
  float* q = nullptr;                  // [rows, numHeads, headDim]
  float* k = nullptr;                  // [rows, numKvHeads, headDim]
  const float* invFreq = nullptr;      // [rows, rotaryDim / 2]: each row's frequencies
  const int64_t* positions = nullptr;  // [rows]
  int64_t rows = 0, numHeads = 0, numKvHeads = 0, headDim = 0, rotaryDim = 0;
};

// Writes each row's k and v into the cache at its slot.
struct KvWriteParams {
  const float* k = nullptr;  // [rows, numKvHeads, headDim]
  const float* v = nullptr;
  float* kCache = nullptr;  // [numSlots, numKvHeads, headDim]
  float* vCache = nullptr;
  const uint32_t* slots = nullptr;  // [rows]
  int64_t rows = 0, numKvHeads = 0, headDim = 0, numSlots = 0;
};

// Causal attention of each sequence's new rows over its cached keys (positions 0..pos), optionally
// limited to the last `slidingWindow` positions; grouped-query heads share a KV head.
struct AttentionParams {
  const float* q = nullptr;  // [rows, numHeads, headDim]
  const float* kCache = nullptr;
  const float* vCache = nullptr;
  float* out = nullptr;  // [rows, numHeads, headDim]
  std::span<const SequenceRows> sequences;
  int64_t numHeads = 0, numKvHeads = 0, headDim = 0, blockSize = 0;
  int64_t slidingWindow = 0;  // 0: none
  float scale = 1.0f;
};

// out[rows, n] = silu(gateUp[:, :n]) * gateUp[:, n:]  (gate and up projections stored side by side)
struct SiluMulParams {
  const float* gateUp = nullptr;  // [rows, 2n]
  float* out = nullptr;           // [rows, n]
  int64_t rows = 0, n = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // RESOURCE_EXHAUSTED when the memory is not there.
  virtual StatusOr<std::unique_ptr<Buffer>> allocate(size_t bytes) = 0;
  virtual Status upload(Buffer& dst, const void* src, size_t bytes) = 0;
  virtual Status download(void* dst, const Buffer& src, size_t bytes) = 0;

  virtual Status embedding(const EmbeddingParams& p) = 0;
  virtual Status rmsNorm(const kernels::RmsNormParams& p) = 0;  // float32 on this backend
  virtual Status linear(const LinearParams& p) = 0;
  virtual Status rope(const RopeParams& p) = 0;
  virtual Status writeKv(const KvWriteParams& p) = 0;
  virtual Status attention(const AttentionParams& p) = 0;
  virtual Status siluMul(const SiluMulParams& p) = 0;
};

// Threads: 0 uses every core.
std::unique_ptr<Backend> makeCpuBackend(int threads = 0);

}  // namespace textgen::runtime
