// The gated MLP (Llama's SwiGLU): gate and up column-parallel in one GEMM, act(gate) * up, down
// row-parallel: each rank's output is its partial sum, reduced by the norm that follows.
#pragma once

#include <memory>
#include <string>

#include "layers/activation.h"
#include "layers/forward_context.h"
#include "layers/weight_loader.h"

namespace textgen::runtime {

class GatedMlp {
 public:
  struct Weights {  // one layer's tensor names
    std::string gate, up, down;
  };

  // UNIMPLEMENTED for an activation without a fused kernel (only SiLU has one).
  static StatusOr<GatedMlp> load(const WeightLoader& w, const Weights& names,
                                 Activation activation);

  // `hs` [rows, hidden], normalised, in; the MLP's output out (this rank's partial sum on several
  // ranks).
  Status forward(const ForwardContext& ctx, void* hs) const;

 private:
  Linear gateUp_;  // [2 * intermediate, hidden]: this rank's rows of each (column-parallel)
  Linear down_;    // [hidden, intermediate]: this rank's columns (row-parallel)
};

}  // namespace textgen::runtime
