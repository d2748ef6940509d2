// Normalisation of the residual stream, fused with the residual add: RMSNorm (Llama) or LayerNorm
// with or without a bias (GPT-NeoX, Falcon, Bloom, OPT, GPT-BigCode; MPT without).
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

// Whether a LayerNorm has a bias tensor (biasName(weight): "x.weight" -> "x.bias"): the graph
// knows for its architecture (kRequired, kAbsent), or lets the checkpoint say (kOptional: loaded
// when present). RMSNorm has none.
enum class NormBias { kAbsent, kRequired, kOptional };

class Norm {
 public:
  // NOT_FOUND / INVALID_ARGUMENT naming a missing or misshapen weight or required bias;
  // INVALID_ARGUMENT for an RMSNorm given a bias.
  // `weightScale` multiplies the weight as it loads (a constant factor on the output folded in:
  // T5's decoder output scaled by d_model^-0.5; exact in every dtype for a power of two).
  static StatusOr<Norm> load(const WeightLoader& w, NormKind kind, const std::string& weight,
                             double eps, NormBias bias = NormBias::kAbsent,
                             float weightScale = 1.0f);

  // output = norm(input + residual) [rows, hidden], the sum kept in `residual`; with no residual
  // (the first layer) output = norm(input).
  Status forward(const ForwardContext& ctx, const void* input, void* residual, void* output,
                 int64_t rows) const;
  // The same where `input` is this rank's partial sum (a row-parallel layer's or the vocabulary-
  // parallel embedding's output): summed over the ranks first, in the norm's kernel where the
  // communicator fuses them (RMSNorm), else by an all-reduce in place before it (LayerNorm).
  // Without a residual `input` holds the sum afterwards; with one, its contents are unspecified.
  // `next`: the layer whose weights are read next (its first GEMV); where the reduction waits on
  // its peers, the tail of those weights is requested into the L2 cache meanwhile
  // (TEXTGEN_PREFETCH_NEXT_KB bytes at most).
  Status forwardReduced(const ForwardContext& ctx, void* input, void* residual, void* output,
                        int64_t rows, const Linear* next = nullptr) const;

  NormKind kind() const { return kind_; }
  bool hasBias() const { return bias_ != nullptr; }

 private:
  kernels::RmsNormParams rmsParams(const ForwardContext& ctx, const void* input, void* residual,
                                   void* output, int64_t rows) const;
  kernels::LayerNormParams layerParams(const ForwardContext& ctx, const void* input, void* residual,
                                       void* output, int64_t rows) const;

  NormKind kind_ = NormKind::kRms;
  float eps_ = 1e-6f;
  std::unique_ptr<Buffer> weight_;  // [hidden]
  std::unique_ptr<Buffer> bias_;    // [hidden], or null
};

}  // namespace textgen::runtime
