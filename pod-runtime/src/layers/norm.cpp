#include "layers/norm.h"

#include <algorithm>
#include <cstdlib>

#include "textgen/base/log.h"

namespace textgen::runtime {

namespace {

// TEXTGEN_PREFETCH_NEXT_KB: how much of the next GEMV's weights a fused all-reduce + RMSNorm
// requests into L2 while it waits for its peers (0: none). The default, 16 MiB, measured best of
// 4, 8, 16 and 32 on two H100s at TP=2 (bench/README.md "bench_tp").
size_t prefetchNextBytes() {
  static const size_t bytes = [] {
    size_t kb = 16 << 10;
    if (const char* v = std::getenv("TEXTGEN_PREFETCH_NEXT_KB"); v && *v) {
      char* end = nullptr;
      const long n = std::strtol(v, &end, 10);
      if (*end == '\0' && n >= 0 && n <= (1 << 20)) {
        kb = static_cast<size_t>(n);
      } else {
        spdlog::warn("TEXTGEN_PREFETCH_NEXT_KB={} ignored (0 to 1048576)", v);
      }
    }
    return kb << 10;
  }();
  return bytes;
}

}  // namespace

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
                            int64_t rows, const Linear* next) const {
  if (kind_ == NormKind::kLayer) {
    // No fused all-reduce + LayerNorm kernel: the plain all-reduce, then the norm.
    TG_RETURN_IF_ERROR(ctx.allReduceSum(input, rows * ctx.config.hiddenSize));
    return forward(ctx, input, residual, output, rows);
  }
  kernels::RmsNormParams p = rmsParams(ctx, input, residual, output, rows);
  if (next && next->weight && prefetchNextBytes() > 0) {
    // The tail: the GEMV's first blocks request their rows themselves as they start.
    const size_t size = next->weight->bytes(), n = std::min(size, prefetchNextBytes());
    p.prefetch = static_cast<const char*>(next->weight->data()) + (size - n);
    p.prefetchBytes = n;
  }
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
