// The MLP's activation, as config.json's hidden_act names them (gelu_tanh: "gelu_pytorch_tanh").
#pragma once

#include <string_view>

namespace textgen::runtime {

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

}  // namespace textgen::runtime
