// Megatron's tensor-parallel split of a decoder over the ranks of one replica: attention heads and
// the MLP's intermediate columns divided (key/value heads replicated when there are fewer than
// ranks), the vocabulary split in padded parts.
#pragma once

#include <cstdint>

#include "textgen/base/status_or.h"
#include "textgen/runtime/model_config.h"
#include "textgen/runtime/weights.h"

namespace textgen::runtime {

struct Partition {
  int rank = 0, world = 1;
  // This rank's share: query heads, key/value heads, intermediate columns, vocabulary rows.
  int64_t heads = 0, kvHeads = 0, intermediate = 0, vocabPart = 0;
  Shard kvShard;  // the key/value projections' slice (several ranks share one when replicated)

  // INVALID_ARGUMENT naming the dimension that does not divide across `world` ranks.
  static StatusOr<Partition> split(const ModelConfig& config, int rank, int world);

  // Column-parallel weights split their output rows, row-parallel ones their input columns; the
  // embedding and the head the vocabulary (padded to equal parts).
  Shard column() const { return {0, rank, world}; }
  Shard row() const { return {1, rank, world}; }
  Shard vocab() const { return {0, rank, world, true}; }
};

}  // namespace textgen::runtime
