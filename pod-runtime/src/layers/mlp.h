// The plain (not gated) MLP of GPT-NeoX, Falcon, BLOOM, OPT, MPT and GPT-BigCode: up
// column-parallel, act(up), down row-parallel: each rank's output is its partial sum, reduced by
// the norm that follows (as GatedMlp); optional biases (down's added by rank 0 only).
#pragma once

#include <string>

#include "layers/activation.h"
#include "layers/forward_context.h"
#include "layers/weight_loader.h"

namespace textgen::runtime {

class Mlp {
 public:
  struct Weights {  // one layer's tensor names
    std::string up, down;
    bool bias = false;  // up and down each with a bias (biasName)
  };

  // [intermediate, hidden] and [hidden, intermediate], intermediate = ModelConfig's.
  static StatusOr<Mlp> load(const WeightLoader& w, const Weights& names, Activation activation);

  // `hs` [rows, hidden], normalised, in; the MLP's output out (this rank's partial sum on several
  // ranks).
  Status forward(const ForwardContext& ctx, void* hs) const { return forward(ctx, hs, hs); }
  // The same from `in` into `out` ([rows, hidden] each; they may be the same buffer).
  Status forward(const ForwardContext& ctx, const void* in, void* out) const;

 private:
  Linear up_;    // [intermediate, hidden]: this rank's rows (column-parallel)
  Linear down_;  // [hidden, intermediate]: this rank's columns (row-parallel)
  Activation activation_ = Activation::kGelu;
};

}  // namespace textgen::runtime
