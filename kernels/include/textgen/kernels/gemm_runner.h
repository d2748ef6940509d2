// GemmRunner: the GEMMs of gemm.h on the device, enqueued on one stream.
#pragma once

#include <cstddef>
#include <memory>

#include "textgen/base/status_or.h"
#include "textgen/kernels/activation.h"
#include "textgen/kernels/gemm.h"

namespace textgen::kernels {

// cuBLASLt on one stream (a handle, a workspace, and the heuristic's algorithm cached per shape),
// with the gemv kernel for decode-sized 16-bit problems (rows <= 8).
// fp32 GEMMs use fp32 math (no TF32), so they match the reference to rounding. Defined only in
// builds with CUDA.
class GemmRunner {
 public:
  static StatusOr<std::unique_ptr<GemmRunner>> create(Stream stream, size_t workspaceBytes,
                                                      bool smallBatchGemv = true);
  virtual ~GemmRunner() = default;
  // With smallBatchGemv, GEMMs of up to `rows` rows (1 to 8; 1 at first) take the gemv kernel when
  // their shape allows, every row computed exactly as a one-row call computes it (speculative
  // decoding's verification steps: 1 + speculate rows a sequence).
  virtual void setGemvRows(int64_t rows) = 0;
  virtual Status run(const GemmParams& p) = 0;
  // Where run() would take the gemv kernel and W is [gate; up] stacked ([2n, in]): y [rows, n] =
  // act(x gateᵀ) * (x upᵀ) in one kernel, bit for bit run() then the gated activation
  // (gated_activation.h) on its output. runGated is UNIMPLEMENTED where takesGated is false.
  virtual bool takesGated(const GemmParams& p) const = 0;
  virtual Status runGated(const GemmParams& p, Activation a) = 0;
  // y[rows, out] = sx * sw * x8[rows, in] · w8[out, in]ᵀ with float8 e4m3 operands (cuBLASLt FP8,
  // sm_89 and later), y in p.dtype (float16 or bfloat16); the scales are device pointers to one
  // float each. in and out must be multiples of 16.
  virtual Status runFp8(const GemmParams& p, const float* scaleW, const float* scaleX) = 0;
};

}  // namespace textgen::kernels
