#include "textgen/kernels/rms_norm.h"

#include <cmath>
#include <limits>

#include "elements.h"

namespace textgen::kernels {

Status validateRmsNorm(const RmsNormParams& p) {
  if (p.numTokens < 0) return invalidArgumentError("rms_norm: numTokens must be >= 0");
  if (p.hiddenSize <= 0) return invalidArgumentError("rms_norm: hiddenSize must be > 0");
  if (p.hiddenSize > std::numeric_limits<int32_t>::max()) {
    return invalidArgumentError("rms_norm: hiddenSize exceeds 2^31-1");
  }
  if (p.numTokens > std::numeric_limits<int32_t>::max()) {
    return invalidArgumentError("rms_norm: numTokens exceeds 2^31-1");
  }
  if (!(p.eps >= 0.0f)) return invalidArgumentError("rms_norm: eps must be >= 0");
  if (p.numTokens == 0) return okStatus();
  if (!p.input) return invalidArgumentError("rms_norm: input is null");
  if (!p.output) return invalidArgumentError("rms_norm: output is null");
  if (!p.weight) return invalidArgumentError("rms_norm: weight is null");
  if ((p.residual == nullptr) != (p.residualOut == nullptr)) {
    return invalidArgumentError("rms_norm: residual and residualOut must be set together");
  }
  return okStatus();
}

Status rmsNormReference(const RmsNormParams& p) {
  TG_RETURN_IF_ERROR(validateRmsNorm(p));
  const Elements e{p.dtype};
  const int64_t h = p.hiddenSize;
  for (int64_t t = 0; t < p.numTokens; ++t) {
    const int64_t row = t * h;
    double sumSq = 0.0;
    for (int64_t i = 0; i < h; ++i) {
      float x = e.load(p.input, row + i);
      if (p.residual) {
        x = e.round(x + e.load(p.residual, row + i));
        e.store(p.residualOut, row + i, x);
      }
      sumSq += static_cast<double>(x) * x;
    }
    const float mean = static_cast<float>(sumSq / static_cast<double>(h));
    const float inv = 1.0f / std::sqrt(mean + p.eps);
    const void* src = p.residual ? p.residualOut : p.input;
    for (int64_t i = 0; i < h; ++i) {
      const float normed = e.round(e.load(src, row + i) * inv);
      e.store(p.output, row + i, e.load(p.weight, i) * normed);
    }
  }
  return okStatus();
}

}  // namespace textgen::kernels
