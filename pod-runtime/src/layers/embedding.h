// The token embedding, split over ranks by vocabulary (Megatron's VocabParallelEmbedding): each
// rank gathers the rows of its part of the vocabulary (zeros for the others' ids); the sum over
// ranks (the first norm's, Norm::forwardReduced) gives every rank the whole embedding.
#pragma once

#include <memory>
#include <string>

#include "layers/forward_context.h"
#include "layers/weight_loader.h"

namespace textgen::runtime {

class Embedding {
 public:
  static StatusOr<Embedding> load(const WeightLoader& w, const std::string& name);

  // out [rows, hidden]: the batch's token ids embedded (this rank's part on several ranks).
  Status forward(const ForwardContext& ctx, void* out) const;

  // [vocabPart, hidden]: this rank's rows (a tied head reads them too).
  Buffer& table() const { return *table_; }

 private:
  std::unique_ptr<Buffer> table_;
};

}  // namespace textgen::runtime
