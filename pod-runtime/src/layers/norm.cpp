#include "layers/norm.h"

namespace textgen::runtime {

StatusOr<Norm> Norm::load(const WeightLoader& w, NormKind kind, const std::string& weight,
                          double eps, NormBias bias, float weightScale) {
  if (kind == NormKind::kRms && bias != NormBias::kAbsent)
    return invalidArgumentError("norm '" + weight + "': RMSNorm has no bias");
  Norm n;
  n.kind_ = kind;
  n.eps_ = static_cast<float>(eps);
  const int64_t hidden = w.config().hiddenSize;
  if (weightScale != 1.0f && bias != NormBias::kAbsent)
    return invalidArgumentError("norm '" + weight + "': a scaled weight takes no bias");
  TG_ASSIGN_OR_RETURN(n.weight_, w.upload({{weight, {hidden}, {}}}, weightScale));
  const std::string biasTensor = biasName(weight);
  if (bias == NormBias::kRequired || (bias == NormBias::kOptional && w.contains(biasTensor))) {
    TG_ASSIGN_OR_RETURN(n.bias_, w.upload({{biasTensor, {hidden}, {}}}));
  }
  return n;
}

Status Norm::forward(const ForwardContext& ctx, const void* input, void* residual, void* output,
                     int64_t rows) const {
  if (kind_ == NormKind::kLayer)
    return ctx.backend.layerNorm(layerParams(ctx, input, residual, output, rows));
  return ctx.backend.rmsNorm(rmsParams(ctx, input, residual, output, rows));
}

Status Norm::forwardReduced(const ForwardContext& ctx, void* input, void* residual, void* output,
                            int64_t rows) const {
  if (kind_ == NormKind::kLayer) {
    // No fused all-reduce + LayerNorm kernel: the plain all-reduce, then the norm.
    TG_RETURN_IF_ERROR(ctx.allReduceSum(input, rows * ctx.config.hiddenSize));
    return forward(ctx, input, residual, output, rows);
  }
  const kernels::RmsNormParams p = rmsParams(ctx, input, residual, output, rows);
  return ctx.partition.world == 1 ? ctx.backend.rmsNorm(p)
                                  : ctx.comm->allReduceRmsNorm(ctx.backend, p);
}

kernels::RmsNormParams Norm::rmsParams(const ForwardContext& ctx, const void* input, void* residual,
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

kernels::LayerNormParams Norm::layerParams(const ForwardContext& ctx, const void* input,
                                           void* residual, void* output, int64_t rows) const {
  return {.input = input,
          .residual = residual,
          .residualOut = residual,
          .output = output,
          .weight = weight_->data(),
          .bias = bias_ ? bias_->data() : nullptr,
          .numTokens = rows,
          .hiddenSize = ctx.config.hiddenSize,
          .eps = eps_,
          .dtype = ctx.dtype};
}

}  // namespace textgen::runtime
