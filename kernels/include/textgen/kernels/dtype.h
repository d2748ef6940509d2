// Element types of tensors that kernels read and write.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace textgen::kernels {

enum class DType : uint8_t { kF32, kF16, kBF16 };

constexpr size_t dtypeSize(DType dtype) {
  return dtype == DType::kF32 ? 4 : 2;
}

// Names as Hugging Face writes them in config.json ("torch_dtype") and TGI reports them in /info.
constexpr std::string_view dtypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "float32";
    case DType::kF16: return "float16";
    case DType::kBF16: return "bfloat16";
  }
  return "unknown";
}

}  // namespace textgen::kernels
