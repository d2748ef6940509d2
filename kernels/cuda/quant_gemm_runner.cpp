#include "quant_gemm_impl.h"
#include "textgen/kernels/gemm_runner.h"

namespace textgen::kernels {

namespace {

QuantGemmCallbacks callbacksOf(GemmRunner& gemm) {
  return {.dense = [&gemm](const GemmParams& g) { return gemm.run(g); },
          .fp8 = [&gemm](const GemmParams& g, const float* sw,
                         const float* sx) { return gemm.runFp8(g, sw, sx); }};
}

}  // namespace

Status invokeQuantGemm(const QuantGemmParams& p, void* workspace, size_t workspaceBytes,
                       GemmRunner& gemm, Stream stream) {
  return invokeQuantGemmWith(p, workspace, workspaceBytes, callbacksOf(gemm), stream);
}

Status invokeQuantGemmGated(const QuantGemmParams& p, Activation a, void* workspace,
                            size_t workspaceBytes, GemmRunner& gemm, Stream stream) {
  return invokeQuantGemmGatedWith(p, a, workspace, workspaceBytes, callbacksOf(gemm), stream);
}

}  // namespace textgen::kernels
