#include "textgen/kernels/gemm.h"

#include "elements.h"

namespace textgen::kernels {

Status validateGemm(const GemmParams& p) {
  if (p.rows < 0 || p.in <= 0 || p.out <= 0) return invalidArgumentError("gemm: bad shape");
  if (p.rows > 0 && (!p.x || !p.weight || !p.y))
    return invalidArgumentError("gemm: x, weight and y are required");
  return okStatus();
}

Status gemmReference(const GemmParams& p) {
  TG_RETURN_IF_ERROR(validateGemm(p));
  const Elements e{p.dtype};
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t o = 0; o < p.out; ++o) {
      float acc = 0.0f;
      for (int64_t i = 0; i < p.in; ++i)
        acc += e.load(p.x, r * p.in + i) * e.load(p.weight, o * p.in + i);
      e.store(p.y, r * p.out + o, acc);
    }
  }
  return okStatus();
}

}  // namespace textgen::kernels
