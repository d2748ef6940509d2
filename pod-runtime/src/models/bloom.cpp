// The BLOOM graph (BloomForCausalLM): a LayerNorm on the word embeddings, ALiBi instead of
// positions, one query_key_value tensor interleaving each head's q, k and v, LayerNorms with
// biases, a non-gated MLP (dense_h_to_4h, 4 x hidden, then dense_4h_to_h, biases everywhere) with
// BLOOM's tanh GELU, sequential residual, the head tied to the embeddings.
//
// What transformers 5.12.1's modeling_bloom.py does, checked there:
// - build_alibi_tensor gives the bias slope[h] * j for key position j (cumsum of the attention
//   mask minus one), the same for every query; attention adds it after the scale (baddbmm with
//   beta = 1, alpha = 1/sqrt(head_dim): scores = alibi + q·k / sqrt(d)). A bias constant along a
//   query's row does not change its softmax, so the paged kernels' slope * (j - i) (after the
//   same scale) is the same distribution. The bias is cast to the activation dtype
//   (alibi.to(dtype)); in half precision that rounds slope * j, which ours, computed in fp32,
//   does not.
// - _reshape views the fused output as [tokens, heads, 3, head_dim]: per head q, k, v
//   (QkvLayout::kFusedInterleavedPerHead).
// - bloom_gelu_forward is x * 0.5 * (1 + tanh(0.79788456 * x * (1 + 0.044715 x^2))): the tanh GELU
//   (kGeluTanh); the constant and the factoring differ from torch's in the last float bit only.
// - config.json has no hidden_act (the GELU is hard-coded: a hidden_act there is ignored, so we
//   overwrite it) and no max_position_embeddings (ALiBi has no table): as TGI's launcher, which
//   falls back to 4096 tokens when config.json gives none of max_position_embeddings,
//   max_seq_len or n_positions, the context limit is 4096.
// - apply_residual_connection_post_layernorm: the residual of each half is the LayerNorm's output
//   instead of its input; built here by copying the norm's output over the residual stream.
// - pretraining_tp with slow_but_exact sums the dense layers' products in slices: the same values
//   up to summation order; ignored.
// - Tensors are "transformer.*" as transformers saves them; BigScience's checkpoints
//   (bigscience/bloom-560m ...) store the same names without the prefix. The graph reads the
//   unprefixed names when the prefixed embedding is absent and the unprefixed one is present.
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "layers/alibi.h"
#include "layers/attention.h"
#include "layers/config_fields.h"
#include "layers/embedding.h"
#include "layers/logits_head.h"
#include "layers/mlp.h"
#include "layers/norm.h"
#include "models/architecture_graph.h"

namespace textgen::runtime {
namespace {

constexpr std::string_view kPrefix = "transformer.";
constexpr std::string_view kEmbeddingNorm = "transformer.word_embeddings_layernorm.weight";
// TGI's launcher's context when config.json names none (ALiBi models have no position table).
constexpr int64_t kDefaultContext = 4096;

Status checkSpec(const ArchitectureSpec& s) {
  constexpr std::string_view g = "bloom";
  TG_RETURN_IF_ERROR(requireValue(s, g, "norm", s.norm, {NormKind::kLayer}));
  TG_RETURN_IF_ERROR(requireValue(s, g, "activation", s.activation, {Activation::kGeluTanh}));
  TG_RETURN_IF_ERROR(requireValue(s, g, "gatedMlp", s.gatedMlp, {false}));
  TG_RETURN_IF_ERROR(requireValue(s, g, "parallelResidual", s.parallelResidual, {false}));
  TG_RETURN_IF_ERROR(requireValue(s, g, "position", s.position, {PositionKind::kAlibi}));
  TG_RETURN_IF_ERROR(requireValue(s, g, "attentionBias", s.attentionBias, {true}));
  TG_RETURN_IF_ERROR(requireValue(s, g, "mlpBias", s.mlpBias, {true}));
  return requireValue(s, g, "qkvLayout", s.qkvLayout, {QkvLayout::kFusedInterleavedPerHead});
}

class BloomGraph final : public ArchitectureGraph {
 public:
  explicit BloomGraph(const ArchitectureSpec& spec) : spec_(spec) {}

  Status load(const WeightLoader& w) override {
    const ArchitectureSpec::Tensors& t = spec_.tensors;
    const ModelConfig& c = w.config();
    const double eps = c.rmsNormEps;  // layer_norm_epsilon
    TG_ASSIGN_OR_RETURN(postLayerNormResidual_,
                        ConfigFields(c).boolean("apply_residual_connection_post_layernorm", false));
    // BigScience's checkpoints drop the "transformer." prefix.
    const std::string embed(t.embed);
    unprefixed_ = !w.contains(embed) && w.contains(strip(embed));
    TG_ASSIGN_OR_RETURN(embedding_, Embedding::load(w, name(t.embed)));
    TG_ASSIGN_OR_RETURN(embeddingNorm_, Norm::load(w, NormKind::kLayer, name(kEmbeddingNorm), eps,
                                                   NormBias::kRequired));
    const Attention::Options attention{.alibiSlopes = bloomAlibiSlopes(c.numHeads)};
    layers_.resize(c.numLayers);
    for (int64_t i = 0; i < c.numLayers; ++i) {
      Layer& l = layers_[i];
      TG_ASSIGN_OR_RETURN(l.inputNorm, Norm::load(w, NormKind::kLayer, name(t.inputNorm, i), eps,
                                                  NormBias::kRequired));
      TG_ASSIGN_OR_RETURN(l.attention, Attention::load(w,
                                                       {.layout = spec_.qkvLayout,
                                                        .q = {},
                                                        .k = {},
                                                        .v = {},
                                                        .qkv = name(t.qkv, i),
                                                        .o = name(t.o, i),
                                                        .bias = true},
                                                       attention));
      TG_ASSIGN_OR_RETURN(l.postNorm, Norm::load(w, NormKind::kLayer, name(t.postNorm, i), eps,
                                                 NormBias::kRequired));
      TG_ASSIGN_OR_RETURN(
          l.mlp,
          Mlp::load(w, {.up = name(t.up, i), .down = name(t.down, i), .bias = true}, c.hiddenAct));
    }
    TG_ASSIGN_OR_RETURN(Norm finalNorm, Norm::load(w, NormKind::kLayer, name(t.finalNorm), eps,
                                                   NormBias::kRequired));
    TG_ASSIGN_OR_RETURN(head_,
                        LogitsHead::load(w, std::move(finalNorm), name(t.lmHead),
                                         spec_.tiedEmbeddings || c.tieWordEmbeddings, embedding_));
    return okStatus();
  }

  const LogitsHead* logitsHead() const override { return &head_; }

  Status build(const ForwardContext& ctx) const override {
    void* x = ctx.ws.residual->data();  // [rows, hidden]: the residual stream
    void* hs = ctx.ws.hidden->data();   // [rows, hidden]: each block's input and output
    const int64_t rows = ctx.rows();
    TG_RETURN_IF_ERROR(embedding_.forward(ctx, x));
    // The embedding's partial sums reduced and normalised in place: the first residual.
    TG_RETURN_IF_ERROR(embeddingNorm_.forwardReduced(ctx, x, nullptr, x, rows));
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& l = layers_[i];
      // Layer 0 reads the (whole, already reduced) normalised embedding; later layers first add
      // the previous MLP's partial sums, reduced over the ranks.
      if (i == 0) {
        TG_RETURN_IF_ERROR(l.inputNorm.forward(ctx, x, nullptr, hs, rows));
      } else {
        TG_RETURN_IF_ERROR(l.inputNorm.forwardReduced(ctx, hs, x, hs, rows));
      }
      TG_RETURN_IF_ERROR(residualFromNorm(ctx, hs, x));
      TG_RETURN_IF_ERROR(l.attention.forward(ctx, static_cast<int64_t>(i), hs));
      TG_RETURN_IF_ERROR(l.postNorm.forwardReduced(ctx, hs, x, hs, rows));
      TG_RETURN_IF_ERROR(residualFromNorm(ctx, hs, x));
      TG_RETURN_IF_ERROR(l.mlp.forward(ctx, hs));
    }
    return head_.forward(ctx, hs, x);
  }

 private:
  struct Layer {
    Norm inputNorm;
    Attention attention;
    Norm postNorm;
    Mlp mlp;
  };

  static std::string strip(std::string_view name) {
    return std::string(name.starts_with(kPrefix) ? name.substr(kPrefix.size()) : name);
  }
  std::string name(std::string_view pattern, int64_t layer = 0) const {
    const std::string s = layerName(pattern, layer);
    return unprefixed_ ? strip(s) : s;
  }

  // apply_residual_connection_post_layernorm: the residual becomes the norm's output (whole on
  // every rank), instead of the norm's input.
  Status residualFromNorm(const ForwardContext& ctx, const void* normed, void* x) const {
    if (!postLayerNormResidual_) return okStatus();
    const size_t bytes = static_cast<size_t>(ctx.config.hiddenSize) * kernels::dtypeSize(ctx.dtype);
    return ctx.backend.copy2d(x, bytes, normed, bytes, bytes, static_cast<size_t>(ctx.rows()));
  }

  ArchitectureSpec spec_;
  bool unprefixed_ = false;
  bool postLayerNormResidual_ = false;
  Embedding embedding_;
  Norm embeddingNorm_;
  std::vector<Layer> layers_;
  LogitsHead head_;
};

}  // namespace

// BloomConfig's keys into the canonical ones: n_layer, n_head (aliases), layer_norm_epsilon as the
// norm epsilon (default 1e-5), the MLP 4 x hidden with the tanh GELU, a tied head (BloomConfig's
// default), TGI's default context.
Status prepareBloomConfig(nlohmann::json& config) {
  if (!config.contains("rms_norm_eps"))  // BloomConfig's default epsilon
    config["rms_norm_eps"] = config.value("layer_norm_epsilon", nlohmann::json(1e-5));
  if (!config.contains("hidden_size") && config.contains("n_embed"))
    config["hidden_size"] = config["n_embed"];  // BloomConfig's older spelling
  // BloomConfig's own names for what it must give (the canonical ones after the aliases).
  for (const auto& [canonical, key] :
       {std::pair{"num_hidden_layers", "n_layer"}, std::pair{"num_attention_heads", "n_head"},
        std::pair{"hidden_size", "hidden_size"}}) {
    const auto v = config.find(canonical);
    if (v == config.end() || !v->is_number_integer() || v->get<int64_t>() <= 0)
      return invalidArgumentError("config.json: '" + std::string(key) +
                                  "' must be a positive integer");
  }
  const int64_t hidden = config["hidden_size"].get<int64_t>();
  if (hidden > (int64_t{1} << 30))
    return invalidArgumentError("config.json: 'hidden_size' is too large");
  config["intermediate_size"] = 4 * hidden;
  config["hidden_act"] = "gelu_pytorch_tanh";  // bloom_gelu_forward, whatever config.json says
  if (!config.contains("max_position_embeddings") || config["max_position_embeddings"].is_null())
    config["max_position_embeddings"] = kDefaultContext;
  if (!config.contains("tie_word_embeddings")) config["tie_word_embeddings"] = true;
  const auto post = config.find("apply_residual_connection_post_layernorm");
  if (post != config.end() && !post->is_boolean())
    return invalidArgumentError(
        "config.json: 'apply_residual_connection_post_layernorm' must be a boolean");
  return okStatus();
}

StatusOr<std::unique_ptr<ArchitectureGraph>> makeBloomGraph(const ArchitectureSpec& spec) {
  TG_RETURN_IF_ERROR(checkSpec(spec));
  return std::unique_ptr<ArchitectureGraph>(std::make_unique<BloomGraph>(spec));
}

}  // namespace textgen::runtime
