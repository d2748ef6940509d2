#include "textgen/kernels/layer_norm.h"

#include <cmath>
#include <limits>

#include "elements.h"

namespace textgen::kernels {

Status validateLayerNorm(const LayerNormParams& p) {
  if (p.numTokens < 0) return invalidArgumentError("layer_norm: numTokens must be >= 0");
  if (p.hiddenSize <= 0) return invalidArgumentError("layer_norm: hiddenSize must be > 0");
  if (p.hiddenSize > std::numeric_limits<int32_t>::max()) {
    return invalidArgumentError("layer_norm: hiddenSize exceeds 2^31-1");
  }
  if (p.numTokens > std::numeric_limits<int32_t>::max()) {
    return invalidArgumentError("layer_norm: numTokens exceeds 2^31-1");
  }
  if (!(p.eps >= 0.0f)) return invalidArgumentError("layer_norm: eps must be >= 0");
  if (p.numTokens == 0) return okStatus();
  if (!p.input) return invalidArgumentError("layer_norm: input is null");
  if (!p.output) return invalidArgumentError("layer_norm: output is null");
  if (!p.weight) return invalidArgumentError("layer_norm: weight is null");
  if ((p.residual == nullptr) != (p.residualOut == nullptr)) {
    return invalidArgumentError("layer_norm: residual and residualOut must be set together");
  }
  return okStatus();
}

Status layerNormReference(const LayerNormParams& p) {
  TG_RETURN_IF_ERROR(validateLayerNorm(p));
  const Elements e{p.dtype};
  const int64_t h = p.hiddenSize;
  const void* src = p.residual ? p.residualOut : p.input;
  for (int64_t t = 0; t < p.numTokens; ++t) {
    const int64_t row = t * h;
    double sum = 0.0;
    for (int64_t i = 0; i < h; ++i) {
      float x = e.load(p.input, row + i);
      if (p.residual) {
        x = e.round(x + e.load(p.residual, row + i));
        e.store(p.residualOut, row + i, x);
      }
      sum += x;
    }
    const double meanD = sum / static_cast<double>(h);
    double sumSq = 0.0;  // two passes: no cancellation
    for (int64_t i = 0; i < h; ++i) {
      const double d = e.load(src, row + i) - meanD;
      sumSq += d * d;
    }
    const auto mean = static_cast<float>(meanD);
    const float rstd = 1.0f / std::sqrt(static_cast<float>(sumSq / static_cast<double>(h)) + p.eps);
    for (int64_t i = 0; i < h; ++i) {
      const float b = p.bias ? e.load(p.bias, i) : 0.0f;
      e.store(p.output, row + i, (e.load(src, row + i) - mean) * rstd * e.load(p.weight, i) + b);
    }
  }
  return okStatus();
}

}  // namespace textgen::kernels
