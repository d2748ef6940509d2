#include "layers/partition.h"

#include <algorithm>
#include <string>

namespace textgen::runtime {

StatusOr<Partition> Partition::split(const ModelConfig& c, int rank, int world) {
  auto refuse = [&](const char* what, int64_t n) {
    return invalidArgumentError(std::string(what) + " (" + std::to_string(n) +
                                ") does not divide across " + std::to_string(world) +
                                " tensor-parallel ranks");
  };
  if (c.numHeads % world != 0) return refuse("num_attention_heads", c.numHeads);
  if (c.intermediateSize % world != 0) return refuse("intermediate_size", c.intermediateSize);
  if (c.numKvHeads >= world ? c.numKvHeads % world != 0 : world % c.numKvHeads != 0)
    return refuse("num_key_value_heads", c.numKvHeads);
  Partition p;
  p.rank = rank;
  p.world = world;
  p.heads = c.numHeads / world;
  p.kvHeads = std::max<int64_t>(c.numKvHeads / world, 1);
  p.intermediate = c.intermediateSize / world;
  p.vocabPart = (c.vocabSize + world - 1) / world;
  // Rank r's query heads [r*heads, (r+1)*heads) read key/value head r*heads / (heads per group).
  p.kvShard = c.numKvHeads >= world ? Shard{0, rank, world}
                                    : Shard{0, rank / (world / static_cast<int>(c.numKvHeads)),
                                            static_cast<int>(c.numKvHeads)};
  return p;
}

}  // namespace textgen::runtime
