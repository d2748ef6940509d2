// The batched operations a model is written against. A forward pass runs over a flattened batch of
// tokens from several sequences; keys and values live in a paged cache addressed by slots
// (slot = block * blockSize + offset), whose allocation the router owns. The CPU backend implements
// them on host memory (float32), the CUDA backend on the device (float32, float16, bfloat16), so
// there is one model, not two. Every pointer in the params — the batch metadata included — is
// backend memory, opaque to the model: it builds metadata on the host and uploads it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "textgen/base/status_or.h"
#include "textgen/kernels/argmax.h"
#include "textgen/kernels/bias_add.h"
#include "textgen/kernels/clamp.h"
#include "textgen/kernels/gated_activation.h"
#include "textgen/kernels/gather_rows.h"
#include "textgen/kernels/gemm.h"
#include "textgen/kernels/kv_write.h"
#include "textgen/kernels/layer_norm.h"
#include "textgen/kernels/paged_attention.h"
#include "textgen/kernels/position_embedding.h"
#include "textgen/kernels/quant_gemm.h"
#include "textgen/kernels/rms_norm.h"
#include "textgen/kernels/rope.h"
#include "textgen/kernels/rope_kv_write.h"
#include "textgen/kernels/sample.h"
#include "textgen/runtime/linear.h"

namespace textgen::runtime {

// Backend memory, freed with the object.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() = 0;
  virtual size_t bytes() const = 0;
  template <typename T>
  T* as() {
    return static_cast<T*>(data());
  }
};

// One sequence's rows of a flattened batch (host-side description).
struct SequenceRows {
  int64_t firstRow = 0;  // first row of the batch that belongs to this sequence
  int64_t numRows = 0;   // its new tokens in this forward
  int64_t startPos = 0;  // position of its first new token (tokens already in the cache)
  std::span<const uint32_t> blocks;  // the sequence's KV-cache block table
};

// A recorded sequence of operations, replayed with one launch (CUDA graphs). Its pointers are
// fixed at capture: replays see new data only through the same buffers.
class Graph {
 public:
  virtual ~Graph() = default;
};

struct MemoryInfo {
  size_t free = 0, total = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // OK when the backend computes in `dtype`; UNIMPLEMENTED naming what it supports otherwise.
  virtual Status supports(kernels::DType dtype) const = 0;
  // RESOURCE_EXHAUSTED naming the size when the memory is not there.
  virtual StatusOr<std::unique_ptr<Buffer>> allocate(size_t bytes) = 0;
  // Blocking copies (the upload is complete, the download's data present, on return).
  virtual Status upload(Buffer& dst, const void* src, size_t bytes, size_t dstOffset = 0) = 0;
  virtual Status download(void* dst, Buffer& src, size_t bytes) = 0;
  // Waits for queued work; reports an asynchronous device error.
  virtual Status synchronize() = 0;
  // Device memory, where the backend has its own (the KV pool is sized from it at Warmup).
  virtual std::optional<MemoryInfo> memoryInfo() const { return std::nullopt; }

  // Graph capture: operations enqueued between beginCapture and endCapture are recorded, not run.
  // Backends without graphs return UNIMPLEMENTED from beginCapture.
  virtual Status beginCapture() { return unimplementedError(std::string(name()) + ": no graphs"); }
  virtual StatusOr<std::unique_ptr<Graph>> endCapture() {
    return unimplementedError(std::string(name()) + ": no graphs");
  }
  virtual Status launch(Graph&) { return unimplementedError(std::string(name()) + ": no graphs"); }

  // Copies `height` rows of `widthBytes` between pitched regions of backend memory (enqueued).
  virtual Status copy2d(void* dst, size_t dstPitch, const void* src, size_t srcPitch,
                        size_t widthBytes, size_t height) = 0;

  virtual Status gatherRows(const kernels::GatherRowsParams& p) = 0;
  virtual Status rmsNorm(const kernels::RmsNormParams& p) = 0;
  virtual Status layerNorm(const kernels::LayerNormParams& p) = 0;
  // x += the learned position embedding of each row's position (GPT-2, OPT).
  virtual Status addPositionEmbedding(const kernels::PositionEmbeddingParams& p) = 0;
  // y[rows, out] = x[rows, in] · W[out, in]ᵀ on raw operands.
  virtual Status gemm(const kernels::GemmParams& p) = 0;
  // GEMMs of up to `rows` rows (1 to 8) compute every row exactly as a one-row GEMM does (the CUDA
  // backend's gemv kernel), so that speculative decoding's verification rows equal plain decode
  // rows bit for bit. The model runner sets it per forward; backends whose GEMM rows are
  // independent already ignore it.
  virtual void setGemvRows(int64_t rows) { (void)rows; }
  virtual Status biasAdd(const kernels::BiasAddParams& p) = 0;
  // x clamped into [-limit, limit] in place (MPT's clip_qkv).
  virtual Status clamp(const kernels::ClampParams& p) = 0;
  // A linear layer: x [rows, w.in] -> y [rows, w.out], bias added. The format picks the kernels;
  // UNIMPLEMENTED naming a format or part (scales, zero points) this backend cannot run.
  virtual Status linear(const Linear& w, const void* x, void* y, int64_t rows);
  // y = act(x) · deq(W)ᵀ for quantized weights (textgen/kernels/quant_gemm.h).
  virtual Status quantGemm(const kernels::QuantGemmParams& p) {
    (void)p;
    return unimplementedError(std::string(name()) + ": quantized weights are not implemented");
  }
  virtual Status rope(const kernels::RopeParams& p) = 0;
  virtual Status writeKv(const kernels::KvWriteParams& p) = 0;
  // rope then writeKv in one pass where the backend has a fused kernel.
  virtual Status ropeWriteKv(const kernels::RopeKvWriteParams& p) {
    TG_RETURN_IF_ERROR(kernels::validateRopeKvWrite(p));
    TG_RETURN_IF_ERROR(rope(p.rope));
    return writeKv(p.kv);
  }
  // The backend supplies the split-K workspace; every pointer, the optional ALiBi slopes included,
  // is in backend memory.
  virtual Status attention(kernels::PagedAttentionParams p) = 0;
  // act(gate) * up of the gated MLP.
  virtual Status gatedActivation(const kernels::GatedActivationParams& p) = 0;
  // The gated MLP's first layer and activation: y [rows, w.out / 2] = act(x gateᵀ) * (x upᵀ) for
  // W = [gate; up] stacked. linear() into `gateUp` ([rows, w.out], scratch) then
  // gatedActivation(), or, where the backend has one kernel for both (CUDA: the gemv kernel's
  // gated epilogue, for decode rows of dense 16-bit weights without a bias), that kernel, with the
  // same bits.
  virtual Status gatedLinear(const Linear& w, const void* x, void* gateUp, void* y, int64_t rows,
                             kernels::Activation a);
  virtual Status argmax(const kernels::ArgmaxParams& p) = 0;
  virtual Status sample(const kernels::SampleParams& p) = 0;

 private:
  Status dense(const Linear& w, const void* x, void* y, int64_t rows);
};

// Threads: 0 uses every core.
std::unique_ptr<Backend> makeCpuBackend(int threads = 0);

// The CUDA backend on `device`: FAILED_PRECONDITION when this build has no CUDA or there is no such
// device.
// smallBatchGemv: the gemv kernel for decode-sized GEMMs (off: cuBLASLt for every shape).
StatusOr<std::unique_ptr<Backend>> makeCudaBackend(int device = 0, bool smallBatchGemv = true);

}  // namespace textgen::runtime
