#include "textgen/kernels/bias_add.h"

#include "elements.h"

namespace textgen::kernels {

Status validateBiasAdd(const BiasAddParams& p) {
  if (p.rows < 0 || p.out <= 0) return invalidArgumentError("bias_add: bad shape");
  if (p.rows > 0 && (!p.y || !p.bias)) return invalidArgumentError("bias_add: y and bias required");
  return okStatus();
}

Status biasAddReference(const BiasAddParams& p) {
  TG_RETURN_IF_ERROR(validateBiasAdd(p));
  const Elements e{p.dtype};
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t j = 0; j < p.out; ++j)
      e.store(p.y, r * p.out + j, e.load(p.y, r * p.out + j) + e.load(p.bias, j));
  }
  return okStatus();
}

}  // namespace textgen::kernels
