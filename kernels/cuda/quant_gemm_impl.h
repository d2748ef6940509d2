// invokeQuantGemm's kernels, with the GEMMs it runs on dense or fp8 operands passed in (the .cu
// file does not include GemmRunner: internal to kernels/).
#pragma once

#include <functional>

#include "textgen/kernels/gemm.h"
#include "textgen/kernels/quant_gemm.h"

namespace textgen::kernels {

struct QuantGemmCallbacks {
  std::function<Status(const GemmParams&)> dense;
  std::function<Status(const GemmParams&, const float* scaleW, const float* scaleX)> fp8;
};

Status invokeQuantGemmWith(const QuantGemmParams& p, void* workspace, size_t workspaceBytes,
                           const QuantGemmCallbacks& gemm, Stream stream);
Status invokeQuantGemmGatedWith(const QuantGemmParams& p, Activation a, void* workspace,
                                size_t workspaceBytes, const QuantGemmCallbacks& gemm,
                                Stream stream);

}  // namespace textgen::kernels
