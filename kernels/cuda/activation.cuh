// Activation functions in float, shared by the elementwise kernels and the gemv kernel's gated
// epilogue so that both compute the same bits; the CPU reference (kernels/cpu/gated_activation.cpp)
// has the same formulas.
#pragma once

#include "textgen/kernels/activation.h"

namespace textgen::kernels::cuda {

template <Activation A>
__device__ __forceinline__ float activate(float x) {
  if constexpr (A == Activation::kSilu) {
    return x / (1.0f + expf(-x));
  } else if constexpr (A == Activation::kGelu) {
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
  } else if constexpr (A == Activation::kGeluTanh) {
    return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
  } else {
    return x < 0.0f ? 0.0f : x;  // NaN passes through, as torch.relu
  }
}

}  // namespace textgen::kernels::cuda
