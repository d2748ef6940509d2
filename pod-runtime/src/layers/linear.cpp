// Backend::linear: a Linear's format picks the operations (a GEMM, or a quantized GEMM), then the
// bias.
#include "textgen/runtime/backend.h"

namespace textgen::runtime {

Status Backend::linear(const Linear& w, const void* x, void* y, int64_t rows) {
  if (w.format == WeightFormat::kQuantized) {
    if (!w.weight || w.in <= 0 || w.out <= 0)
      return invalidArgumentError("linear: a weight and a positive shape are required");
    if (w.weight->bytes() < static_cast<size_t>(w.out * kernels::quantRowBytes(w.quant.code, w.in)))
      return invalidArgumentError("linear: the codes are smaller than the shape");
    TG_RETURN_IF_ERROR(quantGemm(
        {.x = x, .w = w.quant, .y = y, .rows = rows, .in = w.in, .out = w.out, .dtype = w.dtype}));
  } else {
    TG_RETURN_IF_ERROR(dense(w, x, y, rows));
  }
  if (!w.bias) return okStatus();
  return biasAdd({.y = y, .bias = w.bias->data(), .rows = rows, .out = w.out, .dtype = w.dtype});
}

Status Backend::gatedLinear(const Linear& w, const void* x, void* gateUp, void* y, int64_t rows,
                            kernels::Activation a) {
  if (w.out % 2 != 0) return invalidArgumentError("gated linear: an odd number of outputs");
  TG_RETURN_IF_ERROR(linear(w, x, gateUp, rows));
  return gatedActivation({.gateUp = gateUp,
                          .out = y,
                          .rows = rows,
                          .n = w.out / 2,
                          .dtype = w.dtype,
                          .activation = a});
}

Status Backend::dense(const Linear& w, const void* x, void* y, int64_t rows) {
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
  return gemm({x, w.weight->data(), y, rows, w.in, w.out, w.dtype});
}

}  // namespace textgen::runtime
