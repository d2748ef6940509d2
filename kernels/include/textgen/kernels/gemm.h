// y[rows, out] = x[rows, in] · W[out, in]ᵀ, the layout of every linear layer (Hugging Face stores
// weights [out, in]). fp32 accumulation; the result is rounded once to the dtype.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "textgen/base/status_or.h"
#include "textgen/kernels/dtype.h"
#include "textgen/kernels/stream.h"

namespace textgen::kernels {

struct GemmParams {
  const void* x = nullptr;       // [rows, in]
  const void* weight = nullptr;  // [out, in]
  void* y = nullptr;             // [rows, out]
  int64_t rows = 0, in = 0, out = 0;
  DType dtype = DType::kF32;
};

Status validateGemm(const GemmParams& p);
// Plain loops, fp32 accumulation: the readable definition, for tests.
Status gemmReference(const GemmParams& p);

// cuBLASLt on one stream: a handle, a workspace, and the heuristic's algorithm cached per shape.
// fp32 GEMMs use fp32 math (no TF32), so they match the reference to rounding. Defined only in
// builds with CUDA.
class GemmRunner {
 public:
  static StatusOr<std::unique_ptr<GemmRunner>> create(Stream stream, size_t workspaceBytes);
  virtual ~GemmRunner() = default;
  virtual Status run(const GemmParams& p) = 0;
};

}  // namespace textgen::kernels
