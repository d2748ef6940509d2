// Clamps every element into [-limit, limit] in place: MPT's clip_qkv on its fused q/k/v
// projection (torch.clamp(min=-limit, max=limit)). The output is the input or a bound rounded to
// the dtype; NaN stays NaN, as torch.clamp propagates it.
#pragma once

#include <cstdint>

#include "textgen/base/status.h"
#include "textgen/kernels/dtype.h"
#include "textgen/kernels/stream.h"

namespace textgen::kernels {

struct ClampParams {
  void* x = nullptr;  // [rows, cols] with rows `rowStride` elements apart, in place
  int64_t rows = 0, cols = 0, rowStride = 0;
  float limit = 0;  // > 0 and finite
  DType dtype = DType::kF32;
};

Status validateClamp(const ClampParams& p);
Status clampReference(const ClampParams& p);
Status invokeClamp(const ClampParams& p, Stream stream);

}  // namespace textgen::kernels
