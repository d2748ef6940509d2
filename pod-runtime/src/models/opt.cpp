// The OPT graph (OPTForCausalLM: OPT 125m to 66B, OPT-350m, Galactica): learned positions with
// OPT's offset of 2, LayerNorm with bias (eps 1e-5), q/k/v/out projections and a non-gated MLP
// (fc1 -> config.json's activation_function -> fc2) with biases as enable_bias says, a head tied to
// the token embedding; pre-LayerNorm blocks with a final norm (do_layer_norm_before, most sizes)
// or post-LayerNorm blocks without one (OPT-350m), and an embedding narrower than the hidden size
// projected in and out (word_embed_proj_dim: OPT-350m's 512 for 1024).
//
// What transformers 5.12.1's modeling_opt.py does, verified there (it wrote the fixtures):
// - OPTLearnedPositionalEmbedding has max_position_embeddings + 2 rows and reads row
//   cumsum(attention_mask) - 1 + 2: an unpadded sequence's position p reads row p + 2.
// - Positions are [hidden]-wide and added after project_in: inputs = project_in(embed(ids)) + pos.
// - The query is scaled by head_dim^-0.5 after q_proj (bias included) and the attention runs with
//   scaling 1.0; the kernel here scales the scores q·k instead. The same in exact arithmetic, and
//   bit for bit when head_dim^-0.5 is a power of two (head_dim 16 in the fixtures, 64 for OPT
//   125m to 1.3B); for 2.7B's 80 and 6.7B-175B's 128 the two orders differ by rounding only.
// - No config field sets the norms' eps: nn.LayerNorm's default 1e-5, for every LayerNorm.
// - do_layer_norm_before false (post-LayerNorm): x = LN(x + attn(x)), x = LN(x + mlp(x)), and the
//   decoder has NO final_layer_norm (it is built only when do_layer_norm_before is true and
//   _remove_final_layer_norm false); the per-layer norms keep their names (self_attn_layer_norm,
//   final_layer_norm) in both modes.
// - project_in / project_out exist exactly when word_embed_proj_dim != hidden_size, without bias;
//   project_out follows the final norm (when there is one), and lm_head [vocab,
//   word_embed_proj_dim] is tied to embed_tokens (tie_word_embeddings defaults to true for OPT).
// - The tokenizer (GPT2Tokenizer, add_bos_token) prepends </s> (id 2) as BOS: the fixtures'
//   tokenizer.json does it with a TemplateProcessing post-processor; eos is id 2 too.
#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "layers/attention.h"
#include "layers/config_fields.h"
#include "layers/embedding.h"
#include "layers/logits_head.h"
#include "layers/mlp.h"
#include "layers/norm.h"
#include "layers/position_embedding.h"
#include "models/architecture_graph.h"

namespace textgen::runtime {
namespace {

constexpr int64_t kPositionOffset = 2;  // OPTLearnedPositionalEmbedding.offset
constexpr double kLayerNormEps = 1e-5;  // nn.LayerNorm's default; OPTConfig has no eps field
// Not in ArchitectureSpec::Tensors (no other class has them).
constexpr std::string_view kProjectIn = "model.decoder.project_in.weight";
constexpr std::string_view kProjectOut = "model.decoder.project_out.weight";

Status checkSpec(const ArchitectureSpec& s) {
  constexpr std::string_view g = "opt";
  TG_RETURN_IF_ERROR(requireValue(s, g, "norm", s.norm, {NormKind::kLayer}));
  TG_RETURN_IF_ERROR(requireValue(s, g, "gatedMlp", s.gatedMlp, {false}));
  TG_RETURN_IF_ERROR(requireValue(s, g, "parallelResidual", s.parallelResidual, {false}));
  TG_RETURN_IF_ERROR(requireValue(s, g, "position", s.position, {PositionKind::kLearned}));
  return requireValue(s, g, "qkvLayout", s.qkvLayout, {QkvLayout::kSeparate});
}

class OptGraph final : public ArchitectureGraph {
 public:
  explicit OptGraph(const ArchitectureSpec& spec) : spec_(spec) {}

  Status load(const WeightLoader& w) override {
    const ArchitectureSpec::Tensors& t = spec_.tensors;
    const ModelConfig& c = w.config();
    const ConfigFields fields(c);
    TG_ASSIGN_OR_RETURN(preNorm_, fields.boolean("do_layer_norm_before", true));
    TG_ASSIGN_OR_RETURN(const int64_t width,
                        fields.integer("word_embed_proj_dim", c.hiddenSize, c.hiddenSize));
    // facebook/opt-* checkpoints saved from OPTModel name their tensors "decoder.*", without the
    // "model." that OPTForCausalLM's state dict (and the spec) has: read whichever is stored.
    const std::string embed(t.embed);
    bare_ = !w.contains(embed) && embed.starts_with("model.") && w.contains(embed.substr(6));
    TG_ASSIGN_OR_RETURN(embedding_, Embedding::load(w, name(t.embed), width));
    if (width != c.hiddenSize) {
      TG_ASSIGN_OR_RETURN(projectIn_, w.linear({{name(kProjectIn), {c.hiddenSize, width}, {}}},
                                               SplitKind::kReplicated));
    }
    TG_ASSIGN_OR_RETURN(
        positions_,
        PositionEmbedding::load(w, name(t.positionEmbed), c.maxPositionEmbeddings + kPositionOffset,
                                kPositionOffset));
    layers_.resize(c.numLayers);
    for (int64_t i = 0; i < c.numLayers; ++i) {
      Layer& l = layers_[i];
      TG_ASSIGN_OR_RETURN(l.attentionNorm, Norm::load(w, NormKind::kLayer, name(t.inputNorm, i),
                                                      c.rmsNormEps, NormBias::kRequired));
      TG_ASSIGN_OR_RETURN(l.attention, Attention::load(w,
                                                       {.layout = QkvLayout::kSeparate,
                                                        .q = name(t.q, i),
                                                        .k = name(t.k, i),
                                                        .v = name(t.v, i),
                                                        .qkv = "",
                                                        .o = name(t.o, i),
                                                        .bias = c.attentionBias},
                                                       {.rope = false}));
      TG_ASSIGN_OR_RETURN(l.mlpNorm, Norm::load(w, NormKind::kLayer, name(t.postNorm, i),
                                                c.rmsNormEps, NormBias::kRequired));
      TG_ASSIGN_OR_RETURN(
          l.mlp, Mlp::load(w, {.up = name(t.up, i), .down = name(t.down, i), .bias = c.mlpBias},
                           c.hiddenAct));
    }
    std::optional<Norm> finalNorm;
    if (preNorm_) {
      TG_ASSIGN_OR_RETURN(finalNorm, Norm::load(w, NormKind::kLayer, name(t.finalNorm),
                                                c.rmsNormEps, NormBias::kRequired));
    }
    std::optional<Linear> projectOut;
    if (width != c.hiddenSize) {
      TG_ASSIGN_OR_RETURN(projectOut, w.linear({{name(kProjectOut), {width, c.hiddenSize}, {}}},
                                               SplitKind::kReplicated));
    }
    TG_ASSIGN_OR_RETURN(head_, LogitsHead::load(w, std::move(finalNorm), name(t.lmHead),
                                                spec_.tiedEmbeddings || c.tieWordEmbeddings,
                                                embedding_, std::move(projectOut)));
    return okStatus();
  }

  const LogitsHead* logitsHead() const override { return &head_; }

  Status build(const ForwardContext& ctx) const override {
    void* x = ctx.ws.residual->data();  // [rows, hidden]: the residual stream
    void* hs = ctx.ws.hidden->data();   // [rows, hidden]: each block's input and output
    TG_RETURN_IF_ERROR(embed(ctx, x, hs));
    return preNorm_ ? buildPreNorm(ctx, x, hs) : buildPostNorm(ctx, x, hs);
  }

 private:
  struct Layer {
    Norm attentionNorm;  // self_attn_layer_norm
    Attention attention;
    Norm mlpNorm;  // the layer's final_layer_norm
    Mlp mlp;
  };

  // A spec tensor name for layer `layer`, as this checkpoint spells it.
  std::string name(std::string_view pattern, int64_t layer = 0) const {
    std::string s = layerName(pattern, layer);
    return bare_ && s.starts_with("model.") ? s.substr(6) : s;
  }

  // x [rows, hidden] = project_in(embed(ids)) + positions: this rank's partial sum (the embedding
  // is vocabulary-parallel; project_in is linear without bias, so projecting each rank's part and
  // summing is projecting the sum; rank 0 alone adds the positions).
  Status embed(const ForwardContext& ctx, void* x, void* hs) const {
    if (projectIn_) {
      TG_RETURN_IF_ERROR(embedding_.forward(ctx, hs));  // [rows, word_embed_proj_dim]
      TG_RETURN_IF_ERROR(ctx.backend.linear(*projectIn_, hs, x, ctx.rows()));
    } else {
      TG_RETURN_IF_ERROR(embedding_.forward(ctx, x));
    }
    return positions_.forward(ctx, x);
  }

  // x = x + attn(LN(x)); x = x + mlp(LN(x)); logits of LN(x): Llama's order, each norm summing
  // the partial sums over the ranks and adding the residual.
  Status buildPreNorm(const ForwardContext& ctx, void* x, void* hs) const {
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& l = layers_[i];
      TG_RETURN_IF_ERROR(l.attentionNorm.forwardReduced(ctx, i == 0 ? x : hs, i == 0 ? nullptr : x,
                                                        hs, ctx.rows()));
      TG_RETURN_IF_ERROR(l.attention.forward(ctx, static_cast<int64_t>(i), hs));
      TG_RETURN_IF_ERROR(l.mlpNorm.forwardReduced(ctx, hs, x, hs, ctx.rows()));
      TG_RETURN_IF_ERROR(l.mlp.forward(ctx, hs));
    }
    return head_.forward(ctx, hs, x);
  }

  // x = LN(x + attn(x)); x = LN(x + mlp(x)); logits of x (no final norm). The normalised value is
  // both the next block's input (overwritten by it) and its residual, so it is copied into x after
  // each norm (the norm leaves the un-normalised sum there).
  Status buildPostNorm(const ForwardContext& ctx, void* x, void* hs) const {
    const int64_t rows = ctx.rows();
    const size_t rowBytes =
        static_cast<size_t>(ctx.config.hiddenSize) * kernels::dtypeSize(ctx.dtype);
    auto copy = [&](void* dst, const void* src) {  // [rows, hidden]
      return ctx.backend.copy2d(dst, rowBytes, src, rowBytes, rowBytes, static_cast<size_t>(rows));
    };
    TG_RETURN_IF_ERROR(ctx.allReduceSum(x, rows * ctx.config.hiddenSize));
    TG_RETURN_IF_ERROR(copy(hs, x));
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& l = layers_[i];
      TG_RETURN_IF_ERROR(l.attention.forward(ctx, static_cast<int64_t>(i), hs));
      TG_RETURN_IF_ERROR(l.attentionNorm.forwardReduced(ctx, hs, x, hs, rows));
      TG_RETURN_IF_ERROR(copy(x, hs));
      TG_RETURN_IF_ERROR(l.mlp.forward(ctx, hs));
      TG_RETURN_IF_ERROR(l.mlpNorm.forwardReduced(ctx, hs, x, hs, rows));
      if (i + 1 < layers_.size()) TG_RETURN_IF_ERROR(copy(x, hs));
    }
    return head_.forward(ctx, hs, nullptr);  // hs: the whole sum on every rank
  }

  ArchitectureSpec spec_;
  bool preNorm_ = true;
  bool bare_ = false;  // tensor names without "model."
  Embedding embedding_;
  std::optional<Linear> projectIn_;  // [hidden, word_embed_proj_dim], replicated
  PositionEmbedding positions_;
  std::vector<Layer> layers_;
  LogitsHead head_;
};

// A boolean field of OPTConfig, `fallback` when absent or null.
StatusOr<bool> optBoolean(const nlohmann::json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean())
    return invalidArgumentError("config.json: '" + std::string(key) + "' must be true or false");
  return it->get<bool>();
}

}  // namespace

// OPTConfig's fields in the canonical keys (ffn_dim and activation_function are the spec's key
// aliases): enable_bias for attention_bias and mlp_bias, tie_word_embeddings true when absent, the
// LayerNorm eps; OPT's own fields validated here, read again by the graph.
Status prepareOptConfig(nlohmann::json& j) {
  TG_ASSIGN_OR_RETURN(const bool bias, optBoolean(j, "enable_bias", true));
  j["attention_bias"] = bias;
  j["mlp_bias"] = bias;
  TG_ASSIGN_OR_RETURN(const bool tied, optBoolean(j, "tie_word_embeddings", true));
  j["tie_word_embeddings"] = tied;
  j["rms_norm_eps"] = kLayerNormEps;
  TG_ASSIGN_OR_RETURN(const bool preNorm, optBoolean(j, "do_layer_norm_before", true));
  TG_ASSIGN_OR_RETURN(const bool removeFinal, optBoolean(j, "_remove_final_layer_norm", false));
  if (preNorm && removeFinal)
    return unimplementedError(
        "config.json: '_remove_final_layer_norm' true with do_layer_norm_before (a pre-LayerNorm "
        "OPT without its final norm) is not supported");
  TG_ASSIGN_OR_RETURN(const bool affine, optBoolean(j, "layer_norm_elementwise_affine", true));
  if (!affine)
    return unimplementedError(
        "config.json: 'layer_norm_elementwise_affine' false (LayerNorms without weights) is not "
        "supported");
  auto width = j.find("word_embed_proj_dim");
  if (width != j.end() && !width->is_null()) {
    auto hidden = j.find("hidden_size");
    if (!width->is_number_integer() || width->get<int64_t>() <= 0)
      return invalidArgumentError("config.json: 'word_embed_proj_dim' must be a positive integer");
    if (hidden != j.end() && hidden->is_number_integer() &&
        width->get<int64_t>() > hidden->get<int64_t>())
      return unimplementedError("config.json: 'word_embed_proj_dim' (" + width->dump() +
                                ") above hidden_size is not supported");
  }
  return okStatus();
}

StatusOr<std::unique_ptr<ArchitectureGraph>> makeOptGraph(const ArchitectureSpec& spec) {
  TG_RETURN_IF_ERROR(checkSpec(spec));
  return std::unique_ptr<ArchitectureGraph>(std::make_unique<OptGraph>(spec));
}

}  // namespace textgen::runtime
