// The end of every graph: the final norm of the rows whose logits are wanted (only those), then the
// head, split over ranks by vocabulary. It writes ctx.headOut(): the whole logit rows on one rank,
// else this rank's part, which the model runner all-gathers into whole rows.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "layers/embedding.h"
#include "layers/forward_context.h"
#include "layers/norm.h"
#include "layers/weight_loader.h"

namespace textgen::runtime {

class LogitsHead {
 public:
  // The head is `head`'s tensor, or the embedding's table when `tied` (or when `head` is absent
  // and tied: NOT_FOUND naming it when it is absent and not tied). `embedding` must outlive it.
  // Optional: no final norm (post-LayerNorm OPT, whose last layer ends in its own norm), and a
  // replicated `projection` [width, hidden] between the norm and a head of that width (OPT's
  // project_out to word_embed_proj_dim; width <= hidden).
  static StatusOr<LogitsHead> load(const WeightLoader& w, std::optional<Norm> finalNorm,
                                   const std::string& head, bool tied, const Embedding& embedding,
                                   std::optional<Linear> projection = std::nullopt);

  // `hs` (the last layer's output, this rank's partial sum on several ranks) and `residual`
  // [rows, hidden]: the logit rows picked, summed over ranks, normalised with their residual
  // added, and projected. Without a final norm `hs` must be the whole sum on every rank and
  // `residual` is not read.
  Status forward(const ForwardContext& ctx, const void* hs, const void* residual) const;

  // The head's layer, and whether a projection comes before it (its input is then not the
  // normalised hidden state that forward() leaves in ws.pickedHidden).
  const Linear& linear() const { return head_; }
  bool projects() const { return projection_.has_value(); }

 private:
  std::optional<Norm> finalNorm_;
  std::optional<Linear> projection_;  // [width, hidden], replicated
  Linear head_;  // [vocabPart, width]: this rank's part of the vocabulary (a view when tied)
};

}  // namespace textgen::runtime
