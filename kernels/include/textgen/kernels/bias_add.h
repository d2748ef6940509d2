// A linear layer's bias: y[r, j] += bias[j] (rounded once to the dtype, as PyTorch's addmm rounds
// the biased product).
#pragma once

#include <cstdint>

#include "textgen/base/status.h"
#include "textgen/kernels/dtype.h"
#include "textgen/kernels/stream.h"

namespace textgen::kernels {

struct BiasAddParams {
  void* y = nullptr;           // [rows, out], in place
  const void* bias = nullptr;  // [out]
  int64_t rows = 0, out = 0;
  DType dtype = DType::kF32;
};

Status validateBiasAdd(const BiasAddParams& p);
Status biasAddReference(const BiasAddParams& p);
Status invokeBiasAdd(const BiasAddParams& p, Stream stream);

}  // namespace textgen::kernels
