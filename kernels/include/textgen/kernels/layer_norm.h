// LayerNorm with an optional fused residual add, as the decoder layers of GPT-NeoX, Falcon, Bloom,
// OPT and GPT-BigCode use nn.LayerNorm (and MPT a LayerNorm without bias):
//
//   sum         = input + residual                       (rounded to dtype; skipped without
//   residual) residualOut = sum mean        = mean(sum),  var = mean((sum - mean)^2)  (biased
//   variance; fp32 statistics) output      = round((sum - mean) * rsqrt(var + eps) * weight + bias)
//   (no bias: + 0)
//
// The rounding follows torch.nn.functional.layer_norm on CUDA in float16/bfloat16: statistics
// and the affine transform in fp32, one rounding at the end. (Unlike LlamaRMSNorm, rms_norm.h,
// which rounds the normalised value before the weight multiply.) output may alias input, and
// residualOut may alias residual (in-place use).
#pragma once

#include <cstdint>

#include "textgen/base/status.h"
#include "textgen/kernels/dtype.h"
#include "textgen/kernels/stream.h"

namespace textgen::kernels {

struct LayerNormParams {
  const void* input = nullptr;     // [numTokens, hiddenSize]
  const void* residual = nullptr;  // [numTokens, hiddenSize], or null for plain LayerNorm
  void* residualOut = nullptr;     // [numTokens, hiddenSize]; required exactly when residual is set
  void* output = nullptr;          // [numTokens, hiddenSize]
  const void* weight = nullptr;    // [hiddenSize]; required
  const void* bias = nullptr;      // [hiddenSize], or null (MPT)
  int64_t numTokens = 0;
  int64_t hiddenSize = 0;
  float eps = 1e-5f;  // nn.LayerNorm's default
  DType dtype = DType::kF32;
};

// INVALID_ARGUMENT naming the first bad field, or OK.
Status validateLayerNorm(const LayerNormParams& params);

// CPU reference on host memory; the readable definition the CUDA kernel is tested against.
Status layerNormReference(const LayerNormParams& params);

// CUDA kernel on device memory, enqueued on `stream`. Defined only in builds with CUDA.
Status invokeLayerNorm(const LayerNormParams& params, Stream stream);

}  // namespace textgen::kernels
