// The activations of a gated MLP, as config.json's hidden_act names them (transformers' ACT2FN):
// silu ("silu", "swish"), gelu (the exact erf form, "gelu"), gelu_tanh (the tanh approximation:
// "gelu_pytorch_tanh", "gelu_new", "gelu_fast"), relu.
#pragma once

#include <cmath>
#include <string_view>

namespace textgen::kernels {

enum class Activation { kSilu, kGelu, kGeluTanh, kRelu };

constexpr std::string_view toString(Activation a) {
  switch (a) {
    case Activation::kSilu: return "silu";
    case Activation::kGelu: return "gelu";
    case Activation::kGeluTanh: return "gelu_tanh";
    case Activation::kRelu: return "relu";
  }
  return "?";
}

}  // namespace textgen::kernels
