#include "textgen/kernels/clamp.h"

#include <cmath>

#include "elements.h"

namespace textgen::kernels {

Status validateClamp(const ClampParams& p) {
  if (p.rows < 0 || p.cols <= 0 || p.rowStride < p.cols)
    return invalidArgumentError("clamp: bad shape");
  if (!std::isfinite(p.limit) || p.limit <= 0)
    return invalidArgumentError("clamp: the limit must be positive and finite");
  if (p.rows > 0 && !p.x) return invalidArgumentError("clamp: x is required");
  return okStatus();
}

Status clampReference(const ClampParams& p) {
  TG_RETURN_IF_ERROR(validateClamp(p));
  const Elements e{p.dtype};
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t c = 0; c < p.cols; ++c) {
      const int64_t i = r * p.rowStride + c;
      const float v = e.load(p.x, i);
      // Comparisons are false for NaN: it passes through unchanged.
      if (v > p.limit)
        e.store(p.x, i, p.limit);
      else if (v < -p.limit)
        e.store(p.x, i, -p.limit);
    }
  }
  return okStatus();
}

}  // namespace textgen::kernels
