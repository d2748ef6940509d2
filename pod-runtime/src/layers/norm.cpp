#include "layers/norm.h"

namespace textgen::runtime {

StatusOr<Norm> Norm::load(const WeightLoader& w, NormKind kind, const std::string& weight,
                          double eps) {
  if (kind != NormKind::kRms)
    return unimplementedError("norm '" + std::string(toString(kind)) + "' is not implemented");
  Norm n;
  n.eps_ = static_cast<float>(eps);
  TG_ASSIGN_OR_RETURN(n.weight_, w.upload({{weight, {w.config().hiddenSize}, {}}}));
  return n;
}

Status Norm::forward(const ForwardContext& ctx, const void* input, void* residual, void* output,
                     int64_t rows) const {
  return ctx.backend.rmsNorm(params(ctx, input, residual, output, rows));
}

Status Norm::forwardReduced(const ForwardContext& ctx, void* input, void* residual, void* output,
                            int64_t rows) const {
  const kernels::RmsNormParams p = params(ctx, input, residual, output, rows);
  return ctx.partition.world == 1 ? ctx.backend.rmsNorm(p)
                                  : ctx.comm->allReduceRmsNorm(ctx.backend, p);
}

kernels::RmsNormParams Norm::params(const ForwardContext& ctx, const void* input, void* residual,
                                    void* output, int64_t rows) const {
  return {.input = input,
          .residual = residual,
          .residualOut = residual,
          .output = output,
          .weight = weight_->data(),
          .numTokens = rows,
          .hiddenSize = ctx.config.hiddenSize,
          .eps = eps_,
          .dtype = ctx.dtype};
}

}  // namespace textgen::runtime
