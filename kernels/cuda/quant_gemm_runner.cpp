#include "quant_gemm_impl.h"
#include "textgen/kernels/gemm_runner.h"

namespace textgen::kernels {

Status invokeQuantGemm(const QuantGemmParams& p, void* workspace, size_t workspaceBytes,
                       GemmRunner& gemm, Stream stream) {
  return invokeQuantGemmWith(p, workspace, workspaceBytes,
                             {.dense = [&](const GemmParams& g) { return gemm.run(g); },
                              .fp8 = [&](const GemmParams& g, const float* sw,
                                         const float* sx) { return gemm.runFp8(g, sw, sx); }},
                             stream);
}

}  // namespace textgen::kernels
