// Rotary position embedding, rotate-half layout (Llama/NeoX), in place on the first rotaryDim
// dimensions of every head of q and k. Each row has its own position and inverse frequencies, so
// every scaling variant (linear, dynamic NTK per sequence length, Llama 3, YaRN) is a choice of
// invFreq and attentionScaling made by the model.
//
// Rounding follows Hugging Face: angle = position * invFreq and cos/sin in fp32, scaled, rounded
// to the dtype; then out1 = x1*cos - x2*sin, out2 = x2*cos + x1*sin with each product and the sum
// rounded to the dtype.
#pragma once

#include <cstdint>

#include "textgen/base/status.h"
#include "textgen/kernels/dtype.h"
#include "textgen/kernels/stream.h"

namespace textgen::kernels {

struct RopeParams {
  void* q = nullptr;  // [rows, numHeads, headDim], rows qRowStride elements apart
  void* k = nullptr;  // [rows, numKvHeads, headDim], rows kRowStride apart
  int64_t qRowStride = 0, kRowStride = 0;
  const float* invFreq = nullptr;      // [rows, rotaryDim / 2]
  const int32_t* positions = nullptr;  // [rows]
  int64_t rows = 0, numHeads = 0, numKvHeads = 0, headDim = 0, rotaryDim = 0;
  float attentionScaling = 1.0f;  // multiplies cos and sin (YaRN); 1 otherwise
  DType dtype = DType::kF32;
};

Status validateRope(const RopeParams& p);
Status ropeReference(const RopeParams& p);
Status invokeRope(const RopeParams& p, Stream stream);

}  // namespace textgen::kernels
