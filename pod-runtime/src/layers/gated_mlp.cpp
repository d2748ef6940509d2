#include "layers/gated_mlp.h"

namespace textgen::runtime {

StatusOr<GatedMlp> GatedMlp::load(const WeightLoader& w, const Weights& names,
                                  Activation activation) {
  const ModelConfig& c = w.config();
  const Partition& part = w.partition();
  const int64_t h = c.hiddenSize, inter = c.intermediateSize;
  GatedMlp m;
  m.activation_ = activation;
  // Gate and up stacked: one GEMM yields [rows, 2 * intermediate] (this rank's columns).
  TG_ASSIGN_OR_RETURN(m.gateUp_, w.linear({{names.gate, {inter, h}, part.column()},
                                           {names.up, {inter, h}, part.column()}},
                                          SplitKind::kColumn, names.bias));
  TG_ASSIGN_OR_RETURN(
      m.down_, w.linear({{names.down, {h, inter}, part.row()}}, SplitKind::kRow, names.bias));
  return m;
}

Status GatedMlp::forward(const ForwardContext& ctx, void* hs) const {
  const int64_t rows = ctx.rows();
  void* gateUp = ctx.ws.gateUp->data();
  void* act = ctx.ws.act->data();
  TG_RETURN_IF_ERROR(ctx.backend.gatedLinear(gateUp_, hs, gateUp, act, rows, activation_));
  return ctx.backend.linear(down_, act, hs, rows);
}

}  // namespace textgen::runtime
