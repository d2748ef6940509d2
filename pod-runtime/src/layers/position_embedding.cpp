#include "layers/position_embedding.h"

#include <algorithm>

namespace textgen::runtime {

StatusOr<PositionEmbedding> PositionEmbedding::load(const WeightLoader& w, const std::string& name,
                                                    int64_t tableRows, int64_t offset) {
  const ModelConfig& c = w.config();
  if (offset < 0) return invalidArgumentError("position embedding '" + name + "': offset < 0");
  if (tableRows < c.maxContext() + offset) {
    return invalidArgumentError("position embedding '" + name + "': " + std::to_string(tableRows) +
                                " rows cannot hold a context of " + std::to_string(c.maxContext()) +
                                " positions at offset " + std::to_string(offset));
  }
  PositionEmbedding e;
  e.tableRows_ = tableRows;
  e.offset_ = offset;
  TG_ASSIGN_OR_RETURN(e.table_, w.upload({{name, {tableRows, c.hiddenSize}, {}}}));
  return e;
}

Status PositionEmbedding::forward(const ForwardContext& ctx, void* hidden) const {
  if (ctx.partition.rank != 0) return okStatus();  // a partial sum: rank 0 holds the positions
  return ctx.backend.addPositionEmbedding(
      {.x = hidden,
       .table = table_->data(),
       .positions = ctx.meta.positions,
       .rows = ctx.rows(),
       .width = ctx.config.hiddenSize,
       .tableRows = tableRows_,
       .offset = offset_,
       // Every position is below the longest context of the batch (or of the graph's shape).
       .maxPosition = std::max<int64_t>(ctx.meta.layout.maxContext - 1, 0),
       .dtype = ctx.dtype});
}

}  // namespace textgen::runtime
