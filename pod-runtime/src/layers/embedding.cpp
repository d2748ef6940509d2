#include "layers/embedding.h"

namespace textgen::runtime {

StatusOr<Embedding> Embedding::load(const WeightLoader& w, const std::string& name) {
  const ModelConfig& c = w.config();
  Embedding e;
  TG_ASSIGN_OR_RETURN(e.table_,
                      w.upload({{name, {c.vocabSize, c.hiddenSize}, w.partition().vocab()}}));
  return e;
}

Status Embedding::forward(const ForwardContext& ctx, void* out) const {
  const Partition& part = ctx.partition;
  const int64_t rows = ctx.rows(), h = ctx.config.hiddenSize;
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
