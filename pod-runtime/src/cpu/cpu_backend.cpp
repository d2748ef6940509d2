// The CPU backend: OpenBLAS GEMMs, the kernels' CPU references for everything else; float32 only.
#include <cblas.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>
#include <vector>

#include "textgen/base/cpus.h"
#include "textgen/runtime/backend.h"

namespace textgen::runtime {
namespace {

// calloc, not std::vector: large blocks come from mmap as untouched zero pages, so a KV pool of
// gigabytes costs nothing until it is used (a vector writes every page: seconds at start-up).
class HostBuffer final : public Buffer {
 public:
  explicit HostBuffer(size_t bytes) : data_(std::calloc(bytes / 16 + 1, 16)), bytes_(bytes) {
    if (!data_) throw std::bad_alloc();
  }
  ~HostBuffer() override { std::free(data_); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  void* data() override { return data_; }
  size_t bytes() const override { return bytes_; }

 private:
  void* data_;
  size_t bytes_;
};

Status f32Only(kernels::DType dtype) {
  if (dtype == kernels::DType::kF32) return okStatus();
  return unimplementedError(std::string("the CPU backend computes in float32, not ") +
                            std::string(kernels::dtypeName(dtype)));
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) {
    openblas_set_num_threads(threads > 0 ? threads : usableCpus());
  }

  const char* name() const override { return "cpu"; }
  Status supports(kernels::DType dtype) const override { return f32Only(dtype); }

  StatusOr<std::unique_ptr<Buffer>> allocate(size_t bytes) override {
    try {
      return std::unique_ptr<Buffer>(std::make_unique<HostBuffer>(bytes));
    } catch (const std::bad_alloc&) {
      return resourceExhaustedError("cpu: cannot allocate " + std::to_string(bytes) + " bytes");
    }
  }

  Status upload(Buffer& dst, const void* src, size_t bytes, size_t dstOffset) override {
    if (dstOffset + bytes > dst.bytes()) return invalidArgumentError("upload past the buffer");
    std::memcpy(static_cast<char*>(dst.data()) + dstOffset, src, bytes);
    return okStatus();
  }

  Status download(void* dst, Buffer& src, size_t bytes) override {
    if (bytes > src.bytes()) return invalidArgumentError("download larger than the buffer");
    std::memcpy(dst, src.data(), bytes);
    return okStatus();
  }

  Status synchronize() override { return okStatus(); }

  Status gatherRows(const kernels::GatherRowsParams& p) override {
    return kernels::gatherRowsReference(p);
  }
  Status rmsNorm(const kernels::RmsNormParams& p) override {
    TG_RETURN_IF_ERROR(f32Only(p.dtype));
    return kernels::rmsNormReference(p);
  }
  Status layerNorm(const kernels::LayerNormParams& p) override {
    TG_RETURN_IF_ERROR(f32Only(p.dtype));
    return kernels::layerNormReference(p);
  }
  Status addPositionEmbedding(const kernels::PositionEmbeddingParams& p) override {
    TG_RETURN_IF_ERROR(f32Only(p.dtype));
    return kernels::positionEmbeddingReference(p);
  }

  Status biasAdd(const kernels::BiasAddParams& p) override {
    TG_RETURN_IF_ERROR(f32Only(p.dtype));
    return kernels::biasAddReference(p);
  }
  Status clamp(const kernels::ClampParams& p) override {
    TG_RETURN_IF_ERROR(f32Only(p.dtype));
    return kernels::clampReference(p);
  }

  Status gemm(const kernels::GemmParams& p) override {
    TG_RETURN_IF_ERROR(f32Only(p.dtype));
    TG_RETURN_IF_ERROR(kernels::validateGemm(p));
    if (p.rows == 0) return okStatus();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(p.rows),
                static_cast<blasint>(p.out), static_cast<blasint>(p.in), 1.0f,
                static_cast<const float*>(p.x), static_cast<blasint>(p.in),
                static_cast<const float*>(p.weight), static_cast<blasint>(p.in), 0.0f,
                static_cast<float*>(p.y), static_cast<blasint>(p.out));
    return okStatus();
  }

  // Dequantized weights and transformed activations (kernels/quant_gemm.h's definitions), then
  // one float32 GEMM.
  Status quantGemm(const kernels::QuantGemmParams& p) override {
    TG_RETURN_IF_ERROR(f32Only(p.dtype));
    TG_RETURN_IF_ERROR(kernels::validateQuantGemm(p));
    if (p.rows == 0) return okStatus();
    std::vector<float> w(static_cast<size_t>(p.out * p.in)), x(static_cast<size_t>(p.rows * p.in));
    TG_RETURN_IF_ERROR(kernels::dequantizeWeightReference(p.w, p.out, p.in, w.data()));
    TG_RETURN_IF_ERROR(kernels::quantizeActivationsReference(p, x.data()));
    return gemm({x.data(), w.data(), p.y, p.rows, p.in, p.out, p.dtype});
  }

  Status rope(const kernels::RopeParams& p) override {
    TG_RETURN_IF_ERROR(f32Only(p.dtype));
    return kernels::ropeReference(p);
  }
  Status writeKv(const kernels::KvWriteParams& p) override {
    TG_RETURN_IF_ERROR(f32Only(p.dtype));
    return kernels::kvWriteReference(p);
  }
  Status attention(kernels::PagedAttentionParams p) override {
    TG_RETURN_IF_ERROR(f32Only(p.dtype));
    return kernels::pagedAttentionReference(p);
  }
  Status gatedActivation(const kernels::GatedActivationParams& p) override {
    TG_RETURN_IF_ERROR(f32Only(p.dtype));
    return kernels::gatedActivationReference(p);
  }
  Status argmax(const kernels::ArgmaxParams& p) override { return kernels::argmaxReference(p); }
  Status sample(const kernels::SampleParams& p) override { return kernels::sampleReference(p); }
  Status copy2d(void* dst, size_t dstPitch, const void* src, size_t srcPitch, size_t widthBytes,
                size_t height) override {
    for (size_t r = 0; r < height; ++r) {
      std::memcpy(static_cast<char*>(dst) + r * dstPitch,
                  static_cast<const char*>(src) + r * srcPitch, widthBytes);
    }
    return okStatus();
  }
};

}  // namespace

std::unique_ptr<Backend> makeCpuBackend(int threads) {
  return std::make_unique<CpuBackend>(threads);
}

#ifndef TEXTGEN_HAVE_CUDA
StatusOr<std::unique_ptr<Backend>> makeCudaBackend(int, bool) {
  return failedPreconditionError("this build of textgen has no CUDA (nvcc was not found)");
}
#endif

}  // namespace textgen::runtime
