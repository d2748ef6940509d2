#include "layers/embedding.h"

namespace textgen::runtime {

StatusOr<Embedding> Embedding::load(const WeightLoader& w, const std::string& name, int64_t width) {
  const ModelConfig& c = w.config();
  if (width < 0) return invalidArgumentError("embedding '" + name + "': negative width");
  Embedding e;
  e.width_ = width == 0 ? c.hiddenSize : width;
  TG_ASSIGN_OR_RETURN(e.table_, w.upload({{name, {c.vocabSize, e.width_}, w.partition().vocab()}}));
  return e;
}

Status Embedding::forward(const ForwardContext& ctx, void* out) const {
  const Partition& part = ctx.partition;
  const int64_t rows = ctx.rows(), h = width_;
  return ctx.backend.gatherRows({.table = table_->data(),
                                 .ids = ctx.meta.ids,
                                 .out = out,
                                 .rows = rows,
                                 .width = h,
                                 .tableRows = part.vocabPart,
                                 .dtype = ctx.dtype,
                                 .idOffset = part.rank * part.vocabPart,
                                 .zeroOutside = part.world > 1});
}

}  // namespace textgen::runtime
