// The Llama graph (Llama, Llama 2 and 3, Code Llama, Mistral): RMSNorm, RoPE (every scaling
// variant, partial rotary), grouped-query attention over the paged cache with an optional sliding
// window, a gated MLP with config.json's hidden_act (SiLU, GELU, GELU tanh, ReLU), optional biases
// on the attention and MLP projections (attention_bias, mlp_bias), sequential residual.
#include <vector>

#include "layers/attention.h"
#include "layers/embedding.h"
#include "layers/gated_mlp.h"
#include "layers/logits_head.h"
#include "layers/norm.h"
#include "models/architecture_graph.h"

namespace textgen::runtime {
namespace {

// The spec values this graph builds.
Status checkSpec(const ArchitectureSpec& s) {
  constexpr std::string_view g = "llama";
  TG_RETURN_IF_ERROR(requireValue(s, g, "norm", s.norm, {NormKind::kRms}));
  TG_RETURN_IF_ERROR(requireValue(
      s, g, "activation", s.activation,
      {Activation::kSilu, Activation::kGelu, Activation::kGeluTanh, Activation::kRelu}));
  TG_RETURN_IF_ERROR(requireValue(s, g, "gatedMlp", s.gatedMlp, {true}));
  TG_RETURN_IF_ERROR(requireValue(s, g, "parallelResidual", s.parallelResidual, {false}));
  TG_RETURN_IF_ERROR(requireValue(s, g, "position", s.position, {PositionKind::kRope}));
  // Any stored q/k/v layout: Attention::qkvParts reads each into the same [q; k; v].
  return requireValue(s, g, "qkvLayout", s.qkvLayout,
                      {QkvLayout::kSeparate, QkvLayout::kFused, QkvLayout::kFusedInterleavedPerHead,
                       QkvLayout::kFusedGrouped});
}

class LlamaGraph final : public ArchitectureGraph {
 public:
  explicit LlamaGraph(const ArchitectureSpec& spec) : spec_(spec) {}

  Status load(const WeightLoader& w) override {
    const ArchitectureSpec::Tensors& t = spec_.tensors;
    const ModelConfig& c = w.config();
    TG_ASSIGN_OR_RETURN(embedding_, Embedding::load(w, std::string(t.embed)));
    const Attention::Options attention{.slidingWindow =
                                           spec_.slidingWindow ? c.slidingWindow.value_or(0) : 0};
    // The spec's flags: the class always has them; else config.json switches them on.
    const bool attentionBias = spec_.attentionBias || c.attentionBias;
    const bool mlpBias = spec_.mlpBias || c.mlpBias;
    layers_.resize(c.numLayers);
    for (int64_t i = 0; i < c.numLayers; ++i) {
      Layer& l = layers_[i];
      TG_ASSIGN_OR_RETURN(l.inputNorm,
                          Norm::load(w, spec_.norm, layerName(t.inputNorm, i), c.rmsNormEps));
      TG_ASSIGN_OR_RETURN(l.attention, Attention::load(w,
                                                       {.layout = spec_.qkvLayout,
                                                        .q = layerName(t.q, i),
                                                        .k = layerName(t.k, i),
                                                        .v = layerName(t.v, i),
                                                        .qkv = layerName(t.qkv, i),
                                                        .o = layerName(t.o, i),
                                                        .bias = attentionBias},
                                                       attention));
      TG_ASSIGN_OR_RETURN(l.postNorm,
                          Norm::load(w, spec_.norm, layerName(t.postNorm, i), c.rmsNormEps));
      TG_ASSIGN_OR_RETURN(l.mlp, GatedMlp::load(w,
                                                {.gate = layerName(t.gate, i),
                                                 .up = layerName(t.up, i),
                                                 .down = layerName(t.down, i),
                                                 .bias = mlpBias},
                                                c.hiddenAct));
    }
    TG_ASSIGN_OR_RETURN(Norm finalNorm,
                        Norm::load(w, spec_.norm, std::string(t.finalNorm), c.rmsNormEps));
    TG_ASSIGN_OR_RETURN(head_,
                        LogitsHead::load(w, std::move(finalNorm), std::string(t.lmHead),
                                         spec_.tiedEmbeddings || c.tieWordEmbeddings, embedding_));
    return okStatus();
  }

  const LogitsHead* logitsHead() const override { return &head_; }

  Status build(const ForwardContext& ctx) const override {
    void* x = ctx.ws.residual->data();  // [rows, hidden]: the residual stream
    void* hs = ctx.ws.hidden->data();   // [rows, hidden]: each block's input and output
    TG_RETURN_IF_ERROR(embedding_.forward(ctx, x));
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& l = layers_[i];
      // Layer 0 normalises the embedding; later layers first add the previous MLP output. Each
      // norm first sums its input over the ranks (the embedding's, attention's and MLP's outputs
      // are per-rank partial sums), fused where the communicator can.
      TG_RETURN_IF_ERROR(l.inputNorm.forwardReduced(ctx, i == 0 ? x : hs, i == 0 ? nullptr : x, hs,
                                                    ctx.rows(), &l.attention.firstLinear()));
      TG_RETURN_IF_ERROR(l.attention.forward(ctx, static_cast<int64_t>(i), hs));
      TG_RETURN_IF_ERROR(
          l.postNorm.forwardReduced(ctx, hs, x, hs, ctx.rows(), &l.mlp.firstLinear()));
      TG_RETURN_IF_ERROR(l.mlp.forward(ctx, hs));
    }
    return head_.forward(ctx, hs, x);
  }

 private:
  struct Layer {
    Norm inputNorm;
    Attention attention;
    Norm postNorm;
    GatedMlp mlp;
  };

  ArchitectureSpec spec_;
  Embedding embedding_;
  std::vector<Layer> layers_;
  LogitsHead head_;
};

}  // namespace

StatusOr<std::unique_ptr<ArchitectureGraph>> makeLlamaGraph(const ArchitectureSpec& spec) {
  TG_RETURN_IF_ERROR(checkSpec(spec));
  return std::unique_ptr<ArchitectureGraph>(std::make_unique<LlamaGraph>(spec));
}

}  // namespace textgen::runtime
