// The token embedding, split over ranks by vocabulary (Megatron's VocabParallelEmbedding): each
// rank gathers the rows of its part of the vocabulary (zeros for the others' ids); the sum over
// ranks (the first norm's, Norm::forwardReduced) gives every rank the whole embedding.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "layers/forward_context.h"
#include "layers/weight_loader.h"

namespace textgen::runtime {

class Embedding {
 public:
  // The table [vocab, width]; width 0: the hidden size (OPT-350m's embeddings are narrower,
  // word_embed_proj_dim, and projected in).
  static StatusOr<Embedding> load(const WeightLoader& w, const std::string& name,
                                  int64_t width = 0);

  // out [rows, width]: the batch's token ids embedded (this rank's part on several ranks).
  Status forward(const ForwardContext& ctx, void* out) const;

  int64_t width() const { return width_; }

  // [vocabPart, width]: this rank's rows (a tied head reads them too).
  Buffer& table() const { return *table_; }

 private:
  std::unique_ptr<Buffer> table_;
  int64_t width_ = 0;
};

}  // namespace textgen::runtime
