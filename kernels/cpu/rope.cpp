#include "textgen/kernels/rope.h"

#include <cmath>
#include <vector>

#include "elements.h"

namespace textgen::kernels {

Status validateRope(const RopeParams& p) {
  if (p.rows < 0 || p.numHeads <= 0 || p.numKvHeads < 0 || p.headDim <= 0)
    return invalidArgumentError("rope: bad shape");
  if (p.rotaryDim <= 0 || p.rotaryDim > p.headDim || p.rotaryDim % 2 != 0)
    return invalidArgumentError("rope: rotaryDim must be even and in (0, headDim]");
  if (p.qRowStride < p.numHeads * p.headDim || p.kRowStride < p.numKvHeads * p.headDim)
    return invalidArgumentError("rope: a row stride is shorter than the row");
  if (p.rows > 0 && (!p.q || (p.numKvHeads > 0 && !p.k) || !p.invFreq || !p.positions))
    return invalidArgumentError("rope: q, k, invFreq and positions are required");
  return okStatus();
}

Status ropeReference(const RopeParams& p) {
  TG_RETURN_IF_ERROR(validateRope(p));
  const Elements e{p.dtype};
  const int64_t half = p.rotaryDim / 2;
  std::vector<float> cosv(half), sinv(half);
  for (int64_t r = 0; r < p.rows; ++r) {
    const auto pos = static_cast<float>(p.positions[r]);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = pos * p.invFreq[r * half + i];
      cosv[i] = e.round(std::cos(angle) * p.attentionScaling);
      sinv[i] = e.round(std::sin(angle) * p.attentionScaling);
    }
    auto rotate = [&](void* base, int64_t offset) {
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = e.load(base, offset + i), x2 = e.load(base, offset + i + half);
        e.store(base, offset + i, e.round(x1 * cosv[i]) - e.round(x2 * sinv[i]));
        e.store(base, offset + i + half, e.round(x2 * cosv[i]) + e.round(x1 * sinv[i]));
      }
    };
    for (int64_t h = 0; h < p.numHeads; ++h) rotate(p.q, r * p.qRowStride + h * p.headDim);
    for (int64_t h = 0; h < p.numKvHeads; ++h) rotate(p.k, r * p.kRowStride + h * p.headDim);
  }
  return okStatus();
}

}  // namespace textgen::kernels
