#include "layers/gated_mlp.h"

namespace textgen::runtime {

StatusOr<GatedMlp> GatedMlp::load(const WeightLoader& w, const Weights& names,
                                  Activation activation) {
  if (activation != Activation::kSilu) {
    return unimplementedError("gated MLP activation '" + std::string(toString(activation)) +
                              "' is not implemented");
  }
  const ModelConfig& c = w.config();
  const Partition& part = w.partition();
  const int64_t h = c.hiddenSize, inter = c.intermediateSize;
  GatedMlp m;
  // Gate and up stacked: one GEMM yields [rows, 2 * intermediate] (this rank's columns).
  TG_ASSIGN_OR_RETURN(m.gateUp_, w.upload({{names.gate, {inter, h}, part.column()},
                                           {names.up, {inter, h}, part.column()}}));
  TG_ASSIGN_OR_RETURN(m.down_, w.upload({{names.down, {h, inter}, part.row()}}));
  return m;
}

Status GatedMlp::forward(const ForwardContext& ctx, void* hs) const {
  const int64_t rows = ctx.rows(), h = ctx.config.hiddenSize, inter = ctx.partition.intermediate;
  void* gateUp = ctx.ws.gateUp->data();
  void* act = ctx.ws.act->data();
  TG_RETURN_IF_ERROR(
      ctx.backend.linear({hs, gateUp_->data(), gateUp, rows, h, 2 * inter, ctx.dtype}));
  TG_RETURN_IF_ERROR(ctx.backend.siluMul({gateUp, act, rows, inter, ctx.dtype}));
  TG_RETURN_IF_ERROR(ctx.backend.linear({act, down_->data(), hs, rows, inter, h, ctx.dtype}));
  return ctx.allReduceSum(hs, rows * h);
}

}  // namespace textgen::runtime
