#include "layers/mlp.h"

namespace textgen::runtime {

StatusOr<Mlp> Mlp::load(const WeightLoader& w, const Weights& names, Activation activation) {
  const ModelConfig& c = w.config();
  const Partition& part = w.partition();
  const int64_t h = c.hiddenSize, inter = c.intermediateSize;
  Mlp m;
  m.activation_ = activation;
  TG_ASSIGN_OR_RETURN(
      m.up_, w.linear({{names.up, {inter, h}, part.column()}}, SplitKind::kColumn, names.bias));
  TG_ASSIGN_OR_RETURN(
      m.down_, w.linear({{names.down, {h, inter}, part.row()}}, SplitKind::kRow, names.bias));
  return m;
}

Status Mlp::forward(const ForwardContext& ctx, const void* in, void* out) const {
  const int64_t rows = ctx.rows();
  void* up = ctx.ws.act->data();  // [rows, intermediate share]
  TG_RETURN_IF_ERROR(ctx.backend.linear(up_, in, up, rows));
  TG_RETURN_IF_ERROR(ctx.backend.gatedActivation({.gateUp = up,
                                                  .out = up,
                                                  .rows = rows,
                                                  .n = ctx.partition.intermediate,
                                                  .dtype = ctx.dtype,
                                                  .activation = activation_,
                                                  .gated = false}));
  return ctx.backend.linear(down_, up, out, rows);
}

}  // namespace textgen::runtime
