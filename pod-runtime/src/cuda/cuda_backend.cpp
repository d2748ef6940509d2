// The CUDA backend: device buffers, one non-blocking stream, cuBLASLt GEMMs and the kernels of
// kernels/cuda. Operations are enqueued and return at once; download and synchronize wait, and
// report any asynchronous device error.
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "textgen/kernels/gemm_runner.h"
#include "textgen/runtime/backend.h"

namespace textgen::runtime {
namespace {

constexpr size_t kGemmWorkspaceBytes = 32u << 20;
constexpr size_t kAttentionWorkspaceBytes = 64u << 20;

Status cudaStatus(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return okStatus();
  if (err == cudaErrorMemoryAllocation)
    return resourceExhaustedError("cuda: " + what + ": out of device memory");
  return internalError("cuda: " + what + ": " + cudaGetErrorString(err));
}

std::string mib(size_t bytes) {
  return std::to_string(bytes >> 20) + " MiB";
}

class DeviceBuffer final : public Buffer {
 public:
  DeviceBuffer(void* ptr, size_t bytes) : ptr_(ptr), bytes_(bytes) {}
  ~DeviceBuffer() override { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* data() override { return ptr_; }
  size_t bytes() const override { return bytes_; }

 private:
  void* ptr_;
  size_t bytes_;
};

class CudaGraph final : public Graph {
 public:
  explicit CudaGraph(cudaGraphExec_t exec) : exec_(exec) {}
  ~CudaGraph() override { cudaGraphExecDestroy(exec_); }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  cudaGraphExec_t exec() const { return exec_; }

 private:
  cudaGraphExec_t exec_;
};

class CudaBackend final : public Backend {
 public:
  ~CudaBackend() override {
    gemm_.reset();
    attentionWorkspace_.reset();
    quantWorkspace_.reset();
    retiredQuantWorkspaces_.clear();
    if (stream_) cudaStreamDestroy(stream_);
  }

  Status init(int device, bool smallBatchGemv) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
      return failedPreconditionError("cuda: no CUDA device is visible");
    if (device < 0 || device >= count) {
      return failedPreconditionError("cuda: device " + std::to_string(device) + " requested, " +
                                     std::to_string(count) + " visible");
    }
    device_ = device;
    TG_RETURN_IF_ERROR(cudaStatus(cudaSetDevice(device), "set device"));
    TG_RETURN_IF_ERROR(
        cudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "create stream"));
    TG_ASSIGN_OR_RETURN(gemm_,
                        kernels::GemmRunner::create(stream_, kGemmWorkspaceBytes, smallBatchGemv));
    TG_ASSIGN_OR_RETURN(attentionWorkspace_, allocate(kAttentionWorkspaceBytes));
    // Split-K arrival counters must start at zero (kernels leave them zero).
    TG_RETURN_IF_ERROR(cudaStatus(
        cudaMemset(attentionWorkspace_->data(), 0, kAttentionWorkspaceBytes), "clear workspace"));
    return okStatus();
  }

  const char* name() const override { return "cuda"; }
  Status supports(kernels::DType) const override { return okStatus(); }

  StatusOr<std::unique_ptr<Buffer>> allocate(size_t bytes) override {
    void* ptr = nullptr;
    const cudaError_t err = cudaMalloc(&ptr, bytes == 0 ? 256 : bytes);
    if (err != cudaSuccess) {
      cudaGetLastError();  // allocation failures are not sticky: clear it
      size_t free = 0, total = 0;
      cudaMemGetInfo(&free, &total);
      if (err == cudaErrorMemoryAllocation) {
        return resourceExhaustedError("cuda: out of device memory allocating " + mib(bytes) + " (" +
                                      mib(free) + " free of " + mib(total) + ")");
      }
      return cudaStatus(err, "allocate " + mib(bytes));
    }
    return std::unique_ptr<Buffer>(std::make_unique<DeviceBuffer>(ptr, bytes));
  }

  Status upload(Buffer& dst, const void* src, size_t bytes, size_t dstOffset) override {
    if (dstOffset + bytes > dst.bytes()) return invalidArgumentError("upload past the buffer");
    // From pageable memory the call returns once `src` has been staged: safe to reuse.
    return cudaStatus(cudaMemcpyAsync(static_cast<char*>(dst.data()) + dstOffset, src, bytes,
                                      cudaMemcpyHostToDevice, stream_),
                      "upload");
  }

  Status download(void* dst, Buffer& src, size_t bytes) override {
    if (bytes > src.bytes()) return invalidArgumentError("download larger than the buffer");
    TG_RETURN_IF_ERROR(cudaStatus(
        cudaMemcpyAsync(dst, src.data(), bytes, cudaMemcpyDeviceToHost, stream_), "download"));
    return synchronize();
  }

  Status synchronize() override { return cudaStatus(cudaStreamSynchronize(stream_), "stream"); }

  std::optional<MemoryInfo> memoryInfo() const override {
    MemoryInfo m;
    if (cudaMemGetInfo(&m.free, &m.total) != cudaSuccess) return std::nullopt;
    return m;
  }

  Status beginCapture() override {
    quantWorkspaceCaptured_ = true;
    return cudaStatus(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
                      "begin graph capture");
  }

  StatusOr<std::unique_ptr<Graph>> endCapture() override {
    cudaGraph_t graph = nullptr;
    TG_RETURN_IF_ERROR(cudaStatus(cudaStreamEndCapture(stream_, &graph), "end graph capture"));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    TG_RETURN_IF_ERROR(cudaStatus(err, "instantiate graph"));
    return std::unique_ptr<Graph>(std::make_unique<CudaGraph>(exec));
  }

  Status launch(Graph& graph) override {
    return cudaStatus(cudaGraphLaunch(static_cast<CudaGraph&>(graph).exec(), stream_),
                      "launch graph");
  }

  Status gatherRows(const kernels::GatherRowsParams& p) override {
    return kernels::invokeGatherRows(p, stream_);
  }
  Status rmsNorm(const kernels::RmsNormParams& p) override {
    return kernels::invokeRmsNorm(p, stream_);
  }
  Status layerNorm(const kernels::LayerNormParams& p) override {
    return kernels::invokeLayerNorm(p, stream_);
  }
  Status addPositionEmbedding(const kernels::PositionEmbeddingParams& p) override {
    return kernels::invokePositionEmbedding(p, stream_);
  }
  Status gemm(const kernels::GemmParams& p) override { return gemm_->run(p); }
  void setGemvRows(int64_t rows) override { gemm_->setGemvRows(rows); }
  Status quantGemm(const kernels::QuantGemmParams& p) override {
    TG_RETURN_IF_ERROR(kernels::validateQuantGemm(p));
    TG_RETURN_IF_ERROR(reserveQuantWorkspace(kernels::quantGemmWorkspaceBytes(p)));
    return kernels::invokeQuantGemm(p, quantWorkspace_->data(), quantWorkspace_->bytes(), *gemm_,
                                    stream_);
  }
  Status biasAdd(const kernels::BiasAddParams& p) override {
    return kernels::invokeBiasAdd(p, stream_);
  }
  Status clamp(const kernels::ClampParams& p) override { return kernels::invokeClamp(p, stream_); }
  Status rope(const kernels::RopeParams& p) override { return kernels::invokeRope(p, stream_); }
  Status writeKv(const kernels::KvWriteParams& p) override {
    return kernels::invokeKvWrite(p, stream_);
  }
  Status ropeWriteKv(const kernels::RopeKvWriteParams& p) override {
    return kernels::invokeRopeKvWrite(p, stream_);
  }
  Status attention(kernels::PagedAttentionParams p) override {
    p.workspace = attentionWorkspace_->data();
    p.workspaceBytes = attentionWorkspace_->bytes();
    return kernels::invokePagedAttention(p, stream_);
  }
  Status gatedActivation(const kernels::GatedActivationParams& p) override {
    return kernels::invokeGatedActivation(p, stream_);
  }
  Status gatedLinear(const Linear& w, const void* x, void* gateUp, void* y, int64_t rows,
                     kernels::Activation a) override {
    if (w.format == WeightFormat::kDense && !w.bias && !w.scales && !w.zeros && w.weight) {
      const kernels::GemmParams p{x, w.weight->data(), y, rows, w.in, w.out, w.dtype};
      if (gemm_->takesGated(p) &&
          w.weight->bytes() >= static_cast<size_t>(w.in * w.out) * kernels::dtypeSize(w.dtype))
        return gemm_->runGated(p, a);
    }
    // Quantized decode-sized batches of 4-bit codes: the activation in the tensor-core GEMV's
    // epilogue. H100, Llama-2-7B shape, batch-1 decode: GPT-Q 4-bit 2.43 -> 2.33 ms, nf4 2.89 ->
    // 2.85; 8-bit codes lose (eetq 3.34 -> 3.41, fp8 3.32 -> 3.33; not understood: perhaps that a
    // block's 8 gate and 8 up rows lie apart where the plain GEMV's 16 are adjacent), so they
    // keep the activation kernel. TEXTGEN_QUANT_GATED=0 turns it off for comparison.
    if (w.format == WeightFormat::kQuantized && kernels::quantBits(w.quant.code) == 4 && !w.bias &&
        w.weight && w.in > 0 && w.out > 0 &&
        w.weight->bytes() >=
            static_cast<size_t>(w.out * kernels::quantRowBytes(w.quant.code, w.in))) {
      const kernels::QuantGemmParams p{
          .x = x, .w = w.quant, .y = y, .rows = rows, .in = w.in, .out = w.out, .dtype = w.dtype};
      if (kernels::quantGemmGatedTakes(p) && fusedQuantGated()) {
        TG_RETURN_IF_ERROR(kernels::validateQuantGemm(p));
        TG_RETURN_IF_ERROR(reserveQuantWorkspace(kernels::quantGemmWorkspaceBytes(p)));
        return kernels::invokeQuantGemmGated(p, a, quantWorkspace_->data(),
                                             quantWorkspace_->bytes(), *gemm_, stream_);
      }
    }
    return Backend::gatedLinear(w, x, gateUp, y, rows, a);
  }
  Status argmax(const kernels::ArgmaxParams& p) override {
    return kernels::invokeArgmax(p, stream_);
  }
  Status sample(const kernels::SampleParams& p) override {
    return kernels::invokeSample(p, stream_);
  }
  Status copy2d(void* dst, size_t dstPitch, const void* src, size_t srcPitch, size_t widthBytes,
                size_t height) override {
    if (height == 0 || widthBytes == 0) return okStatus();
    return cudaStatus(cudaMemcpy2DAsync(dst, dstPitch, src, srcPitch, widthBytes, height,
                                        cudaMemcpyDeviceToDevice, stream_),
                      "copy2d");
  }

  cudaStream_t stream() const { return stream_; }

 private:
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<kernels::GemmRunner> gemm_;
  std::unique_ptr<Buffer> attentionWorkspace_;
  // Quantized GEMMs' dequantized weights and transformed activations: grown to the largest need,
  // which Warmup's largest prefill reaches before any graph is captured (a capture cannot
  // allocate). One a graph may have captured (a runner used without Warmup, a later call larger)
  // is kept when it is replaced, not freed: the graph still points at it.
  std::unique_ptr<Buffer> quantWorkspace_;
  bool quantWorkspaceCaptured_ = false;  // a capture began since quantWorkspace_ was allocated
  std::vector<std::unique_ptr<Buffer>> retiredQuantWorkspaces_;

  // TEXTGEN_QUANT_GATED=0: quantized gated projections run the GEMV, then the activation kernel
  // (for comparison).
  static bool fusedQuantGated() {
    static const bool on = [] {
      const char* v = std::getenv("TEXTGEN_QUANT_GATED");
      return !(v && std::string_view(v) == "0");
    }();
    return on;
  }

  Status reserveQuantWorkspace(size_t bytes) {
    if (quantWorkspace_ && quantWorkspace_->bytes() >= bytes) return okStatus();
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    TG_RETURN_IF_ERROR(cudaStatus(cudaStreamIsCapturing(stream_, &capturing), "capture status"));
    if (capturing != cudaStreamCaptureStatusNone)
      return failedPreconditionError("quantized GEMM: the workspace needs " + mib(bytes) +
                                     " inside a graph capture; run a larger batch first");
    if (quantWorkspaceCaptured_ && quantWorkspace_)
      retiredQuantWorkspaces_.push_back(std::move(quantWorkspace_));
    quantWorkspace_.reset();  // cudaFree waits for the work that uses it
    TG_ASSIGN_OR_RETURN(quantWorkspace_, allocate(bytes));
    quantWorkspaceCaptured_ = false;
    return okStatus();
  }
};

}  // namespace

// The stream the backend's work goes to (NCCL enqueues collectives on it).
cudaStream_t cudaBackendStream(Backend& backend) {
  return static_cast<CudaBackend&>(backend).stream();
}

StatusOr<std::unique_ptr<Backend>> makeCudaBackend(int device, bool smallBatchGemv) {
  auto backend = std::make_unique<CudaBackend>();
  TG_RETURN_IF_ERROR(backend->init(device, smallBatchGemv));
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace textgen::runtime
