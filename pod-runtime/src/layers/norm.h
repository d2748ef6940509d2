// Normalisation of the residual stream, fused with the residual add: RMSNorm (Llama) now,
// LayerNorm (GPT-2, Falcon) declared for the specs that will need it.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "layers/forward_context.h"
#include "layers/weight_loader.h"

namespace textgen::runtime {

enum class NormKind { kRms, kLayer };

constexpr std::string_view toString(NormKind k) {
  switch (k) {
    case NormKind::kRms: return "rms";
    case NormKind::kLayer: return "layer";
  }
  return "?";
}

class Norm {
 public:
  // UNIMPLEMENTED for a kind without a kernel (LayerNorm).
  static StatusOr<Norm> load(const WeightLoader& w, NormKind kind, const std::string& weight,
                             double eps);

  // output = norm(input + residual) [rows, hidden], the sum kept in `residual`; with no residual
  // (the first layer) output = norm(input).
  Status forward(const ForwardContext& ctx, const void* input, void* residual, void* output,
                 int64_t rows) const;

 private:
  float eps_ = 1e-6f;
  std::unique_ptr<Buffer> weight_;  // [hidden]
};

}  // namespace textgen::runtime
