// Encoder-decoder cross-attention (T5's EncDecAttention), tensor-parallel as self-attention: the
// decoder's rows query the keys and values of their sequence's encoder output, which every decoder
// layer projects once (when the sequence starts) into the sequence's cross blocks of that layer's
// cache. q and the stacked [k; v] column-parallel, o row-parallel (this rank's partial sum, reduced
// by the norm that follows). No mask but the encoder's length, no position bias, no score scaling
// unless given.
#pragma once

#include <string>

#include "layers/forward_context.h"
#include "layers/weight_loader.h"

namespace textgen::runtime {

class CrossAttention {
 public:
  struct Weights {  // one layer's tensor names
    std::string q, k, v, o;
  };

  // scale multiplies q·k (T5: 1).
  static StatusOr<CrossAttention> load(const WeightLoader& w, const Weights& names, float scale);

  // `encoderOut` [encoder rows, hidden] (ctx is the encoder's context: ForwardContext::
  // encoderContext): this layer's keys and values of the encoding sequences, written into their
  // cross blocks of cache layer `layer`.
  Status writeKeysValues(const ForwardContext& encoder, int64_t layer,
                         const void* encoderOut) const;
  // `hs` [rows, hidden], normalised, in; the attention output projected out.
  Status forward(const ForwardContext& ctx, int64_t layer, void* hs) const;

 private:
  Linear q_;   // [heads * headDim, hidden]: this rank's heads
  Linear kv_;  // [2 * kvHeads * headDim, hidden]: this rank's k then v
  Linear o_;   // [hidden, heads * headDim]: this rank's columns
  float scale_ = 1.0f;
};

}  // namespace textgen::runtime
