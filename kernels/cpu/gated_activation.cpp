#include "textgen/kernels/gated_activation.h"

#include <cmath>

#include "elements.h"

namespace textgen::kernels {
namespace {

// act(x) in float, the formulas of the CUDA kernel (kernels/cuda/elementwise.cu).
template <Activation A>
float activate(float x) {
  if constexpr (A == Activation::kSilu) {
    return x / (1.0f + std::exp(-x));
  } else if constexpr (A == Activation::kGelu) {
    return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f));
  } else if constexpr (A == Activation::kGeluTanh) {
    return 0.5f * x * (1.0f + std::tanh(0.79788456080286536f * (x + 0.044715f * x * x * x)));
  } else {
    return x < 0.0f ? 0.0f : x;  // NaN passes through, as torch.relu
  }
}

template <Activation A>
void gatedActivation(const GatedActivationParams& p) {
  const Elements e{p.dtype};
  if (!p.gated && p.residual) {
    for (int64_t i = 0; i < p.rows * p.n; ++i) {
      e.store(p.out, i, e.load(p.residual, i) + e.round(activate<A>(e.load(p.gateUp, i))));
    }
    return;
  }
  if (!p.gated) {
    for (int64_t i = 0; i < p.rows * p.n; ++i) e.store(p.out, i, activate<A>(e.load(p.gateUp, i)));
    return;
  }
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t i = 0; i < p.n; ++i) {
      const float g = e.load(p.gateUp, r * 2 * p.n + i);
      const float u = e.load(p.gateUp, r * 2 * p.n + p.n + i);
      e.store(p.out, r * p.n + i, e.round(activate<A>(g)) * u);
    }
  }
}

}  // namespace

Status validateGatedActivation(const GatedActivationParams& p) {
  if (p.rows < 0 || p.n <= 0) return invalidArgumentError("gated_activation: bad shape");
  if (p.rows > 0 && (!p.gateUp || !p.out))
    return invalidArgumentError("gated_activation: gateUp and out are required");
  if (p.gated && p.residual)
    return invalidArgumentError("gated_activation: a residual is for the activation alone");
  switch (p.activation) {
    case Activation::kSilu:
    case Activation::kGelu:
    case Activation::kGeluTanh:
    case Activation::kRelu: return okStatus();
  }
  return invalidArgumentError("gated_activation: unknown activation");
}

Status gatedActivationReference(const GatedActivationParams& p) {
  TG_RETURN_IF_ERROR(validateGatedActivation(p));
  switch (p.activation) {
    case Activation::kSilu: gatedActivation<Activation::kSilu>(p); break;
    case Activation::kGelu: gatedActivation<Activation::kGelu>(p); break;
    case Activation::kGeluTanh: gatedActivation<Activation::kGeluTanh>(p); break;
    case Activation::kRelu: gatedActivation<Activation::kRelu>(p); break;
  }
  return okStatus();
}

}  // namespace textgen::kernels
