// RMSNorm with an optional fused residual add, as in Llama's decoder layers:
//
//   sum         = input + residual                 (rounded to dtype; skipped without residual)
//   residualOut = sum
//   output      = weight * round(sum * rsqrt(mean(sum^2) + eps))
//
// The rounding steps follow Hugging Face's LlamaRMSNorm (statistics in fp32, the normalised value
// cast back to the model dtype before the weight multiply), so outputs match it in every dtype.
// output may alias input, and residualOut may alias residual (in-place use).
#pragma once

#include <cstdint>

#include "textgen/base/status.h"
#include "textgen/kernels/dtype.h"
#include "textgen/kernels/stream.h"

namespace textgen::kernels {

struct RmsNormParams {
  const void* input = nullptr;     // [numTokens, hiddenSize]
  const void* residual = nullptr;  // [numTokens, hiddenSize], or null for plain RMSNorm
  void* residualOut = nullptr;     // [numTokens, hiddenSize]; required exactly when residual is set
  void* output = nullptr;          // [numTokens, hiddenSize]
  const void* weight = nullptr;    // [hiddenSize]
  int64_t numTokens = 0;
  int64_t hiddenSize = 0;
  float eps = 1e-6f;
  DType dtype = DType::kF32;
  // Optional hint: weights a later kernel reads and no kernel writes (the next GEMV's). A kernel
  // that would leave memory idle while it waits (the fused all-reduce's wait for its peers) pulls
  // these bytes into the L2 cache meanwhile. No effect on results; an unaligned start or length
  // is trimmed to 16-byte units.
  const void* prefetch = nullptr;
  size_t prefetchBytes = 0;
};

// INVALID_ARGUMENT naming the first bad field, or OK.
Status validateRmsNorm(const RmsNormParams& params);

// CPU reference on host memory; the readable definition the CUDA kernel is tested against.
Status rmsNormReference(const RmsNormParams& params);

// CUDA kernel on device memory, enqueued on `stream`. Defined only in builds with CUDA.
Status invokeRmsNorm(const RmsNormParams& params, Stream stream);

}  // namespace textgen::kernels
