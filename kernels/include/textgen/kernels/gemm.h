// y[rows, out] = x[rows, in] · W[out, in]ᵀ, the layout of every linear layer (Hugging Face stores
// weights [out, in]). fp32 accumulation; the result is rounded once to the dtype.
#pragma once

#include <cstddef>
#include <cstdint>

#include "textgen/base/status.h"
#include "textgen/kernels/dtype.h"
#include "textgen/kernels/stream.h"

namespace textgen::kernels {

struct GemmParams {
  const void* x = nullptr;       // [rows, in]
  const void* weight = nullptr;  // [out, in]
  void* y = nullptr;             // [rows, out]
  int64_t rows = 0, in = 0, out = 0;
  DType dtype = DType::kF32;
  // The weights were written by the kernel just before this GEMM (a quantized layer dequantized
  // into a workspace): the GEMV may not load them ahead of its dependency wait, as it does
  // weights that no kernel writes (programmatic dependent launch).
  bool weightsFromPrimary = false;
};

Status validateGemm(const GemmParams& p);
// Plain loops, fp32 accumulation: the readable definition, for tests.
Status gemmReference(const GemmParams& p);

}  // namespace textgen::kernels
