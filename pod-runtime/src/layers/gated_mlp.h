// The gated MLP (Llama's SwiGLU, GeGLU, ReGLU): gate and up column-parallel in one GEMM,
// act(gate) * up, down row-parallel: each rank's output is its partial sum, reduced by the norm
// that follows; optional biases (Llama's mlp_bias; down's is added by rank 0 only).
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
    bool bias = false;  // gate, up and down each with a bias (biasName)
  };

  static StatusOr<GatedMlp> load(const WeightLoader& w, const Weights& names,
                                 Activation activation);

  // `hs` [rows, hidden], normalised, in; the MLP's output out (this rank's partial sum on several
  // ranks).
  Status forward(const ForwardContext& ctx, void* hs) const;
  const Linear& firstLinear() const { return gateUp_; }  // the first weights forward reads

 private:
  Linear gateUp_;  // [2 * intermediate, hidden]: this rank's rows of each (column-parallel)
  Linear down_;    // [hidden, intermediate]: this rank's columns (row-parallel)
  Activation activation_ = Activation::kSilu;
};

}  // namespace textgen::runtime
