// The SiLU-gated MLP activation: out[r, i] = silu(gate[r, i]) * up[r, i], with gate and up stored
// side by side ([rows, 2n]: one GEMM computes both). Rounding follows Hugging Face: silu's result
// is rounded to the dtype before the multiply.
#pragma once

#include <cstdint>

#include "textgen/base/status.h"
#include "textgen/kernels/dtype.h"
#include "textgen/kernels/stream.h"

namespace textgen::kernels {

struct SiluMulParams {
  const void* gateUp = nullptr;  // [rows, 2n]
  void* out = nullptr;           // [rows, n]
  int64_t rows = 0, n = 0;
  DType dtype = DType::kF32;
};

Status validateSiluMul(const SiluMulParams& p);
Status siluMulReference(const SiluMulParams& p);
Status invokeSiluMul(const SiluMulParams& p, Stream stream);

}  // namespace textgen::kernels
