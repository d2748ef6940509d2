// T5's relative position bias (transformers' T5Attention.relative_attention_bias): a
// [buckets, heads] table on block 0 of each stack that every layer of the stack adds to its
// self-attention scores, by the bucket of key position - query position
// (textgen/kernels/relative_position.h). Each rank keeps its heads' columns, in float32.
#pragma once

#include <memory>
#include <string>

#include "layers/weight_loader.h"

namespace textgen::runtime {

struct RelativeBias {
  std::shared_ptr<Buffer> table;  // [buckets, this rank's heads] fp32
  int32_t buckets = 0, maxDistance = 0;
  bool bidirectional = false;

  // NOT_FOUND / INVALID_ARGUMENT naming a missing or misshapen table; INVALID_ARGUMENT for a
  // bucket configuration the bucket function cannot compute.
  static StatusOr<RelativeBias> load(const WeightLoader& w, const std::string& name,
                                     int64_t buckets, int64_t maxDistance, bool bidirectional);
};

}  // namespace textgen::runtime
