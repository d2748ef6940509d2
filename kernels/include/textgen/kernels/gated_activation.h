// The gated MLP's activation: out[r, i] = act(gate[r, i]) * up[r, i], with gate and up stored side
// by side ([rows, 2n]: one GEMM computes both). Not gated (GPT-NeoX, Falcon, BLOOM, OPT, MPT and
// GPT-BigCode's MLPs): out[r, i] = act(x[r, i]) over [rows, n], rounded once; out may be x. Not
// gated with a residual (Medusa's residual blocks): out[r, i] = residual[r, i] + act(x[r, i]), act
// rounded before the add as PyTorch's x + act(linear(x)) rounds; out may be x or residual. act is
// computed in float and rounded to the dtype before the multiply, as PyTorch's act_fn(gate) * up
// rounds (SiLU: x / (1 + e^-x); GELU: x/2 (1 + erf(x / sqrt 2)); GELU tanh: x/2 (1 +
// tanh(sqrt(2/pi) (x + 0.044715 x^3))); ReLU).
#pragma once

#include <cstdint>

#include "textgen/base/status.h"
#include "textgen/kernels/activation.h"
#include "textgen/kernels/dtype.h"
#include "textgen/kernels/stream.h"

namespace textgen::kernels {

struct GatedActivationParams {
  const void* gateUp = nullptr;  // [rows, 2n]; not gated: x [rows, n]
  void* out = nullptr;           // [rows, n]
  int64_t rows = 0, n = 0;
  DType dtype = DType::kF32;
  Activation activation = Activation::kSilu;
  bool gated = true;
  const void* residual = nullptr;  // not gated only: [rows, n] added to act(x)
};

Status validateGatedActivation(const GatedActivationParams& p);
Status gatedActivationReference(const GatedActivationParams& p);
Status invokeGatedActivation(const GatedActivationParams& p, Stream stream);

}  // namespace textgen::kernels
