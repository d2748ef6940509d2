// Backend::linear: a Linear's format picks the operations. Dense: one GEMM, then the bias.
#include "textgen/runtime/backend.h"

namespace textgen::runtime {

Status Backend::linear(const Linear& w, const void* x, void* y, int64_t rows) {
  if (w.format != WeightFormat::kDense) {
    return unimplementedError(std::string(name()) + ": " + std::string(toString(w.format)) +
                              " weights are not implemented");
  }
  if (w.scales || w.zeros)
    return unimplementedError(std::string(name()) + ": dense weights carry no scales");
  if (!w.weight || w.in <= 0 || w.out <= 0)
    return invalidArgumentError("linear: a weight and a positive shape are required");
  if (w.weight->bytes() < static_cast<size_t>(w.in * w.out) * kernels::dtypeSize(w.dtype))
    return invalidArgumentError("linear: the weight is smaller than its shape");
  TG_RETURN_IF_ERROR(gemm({x, w.weight->data(), y, rows, w.in, w.out, w.dtype}));
  if (!w.bias) return okStatus();
  return biasAdd({.y = y, .bias = w.bias->data(), .rows = rows, .out = w.out, .dtype = w.dtype});
}

}  // namespace textgen::runtime
