#include "textgen/kernels/silu_mul.h"

#include <cmath>

#include "elements.h"

namespace textgen::kernels {

Status validateSiluMul(const SiluMulParams& p) {
  if (p.rows < 0 || p.n <= 0) return invalidArgumentError("silu_mul: bad shape");
  if (p.rows > 0 && (!p.gateUp || !p.out))
    return invalidArgumentError("silu_mul: gateUp and out are required");
  return okStatus();
}

Status siluMulReference(const SiluMulParams& p) {
  TG_RETURN_IF_ERROR(validateSiluMul(p));
  const Elements e{p.dtype};
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t i = 0; i < p.n; ++i) {
      const float g = e.load(p.gateUp, r * 2 * p.n + i);
      const float u = e.load(p.gateUp, r * 2 * p.n + p.n + i);
      e.store(p.out, r * p.n + i, e.round(g / (1.0f + std::exp(-g))) * u);
    }
  }
  return okStatus();
}

}  // namespace textgen::kernels
