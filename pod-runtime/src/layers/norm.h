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
  // The same where `input` is this rank's partial sum (a row-parallel layer's or the vocabulary-
  // parallel embedding's output): summed over the ranks first, in the norm's kernel where the
  // communicator fuses them. Without a residual `input` holds the sum afterwards; with one, its
  // contents are unspecified.
  Status forwardReduced(const ForwardContext& ctx, void* input, void* residual, void* output,
                        int64_t rows) const;

 private:
  kernels::RmsNormParams params(const ForwardContext& ctx, const void* input, void* residual,
                                void* output, int64_t rows) const;

  float eps_ = 1e-6f;
  std::unique_ptr<Buffer> weight_;  // [hidden]
};

}  // namespace textgen::runtime
