// Learned absolute position embeddings (GPT-2, OPT, GPT-BigCode: PositionKind::kLearned): a table
// [tableRows, hidden], replicated on every rank, whose row position + offset is added to each
// token's embedding (OPT's offset is 2). The positions are the batch's (BatchMetadata::positions,
// the ones RoPE reads).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "layers/forward_context.h"
#include "layers/weight_loader.h"

namespace textgen::runtime {

class PositionEmbedding {
 public:
  // The tensor `name` of shape [tableRows, hidden]. INVALID_ARGUMENT when the table cannot hold
  // the model's longest context (config.maxContext() + offset rows); NOT_FOUND / INVALID_ARGUMENT
  // naming a missing or misshapen tensor.
  static StatusOr<PositionEmbedding> load(const WeightLoader& w, const std::string& name,
                                          int64_t tableRows, int64_t offset = 0);

  // hidden [rows, hidden] += table[position + offset], for the token embedding's output before
  // the first norm's Norm::forwardReduced: on several ranks `hidden` is a partial sum (each id's
  // row on one rank, zeros on the others), so rank 0 alone adds the table and the sum holds it
  // once. INVALID_ARGUMENT when the batch's context (meta.layout.maxContext) exceeds the table.
  Status forward(const ForwardContext& ctx, void* hidden) const;

 private:
  int64_t tableRows_ = 0, offset_ = 0;
  std::unique_ptr<Buffer> table_;  // [tableRows, hidden]
};

}  // namespace textgen::runtime
