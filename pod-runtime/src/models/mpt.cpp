// The MPT graph (MptForCausalLM, MPT-7B/30B): ALiBi instead of positions, one Wqkv tensor [q; k; v]
// whose output may be clamped (clip_qkv), no biases anywhere, LayerNorms without bias (norm_1,
// norm_2, norm_f), a non-gated GELU (erf) MLP up_proj/down_proj, sequential residual, the head
// tied to wte.
//
// What transformers 5.12.1's modeling_mpt.py does, checked there (some of it surprising):
// - MptModel.forward calls build_mpt_alibi_tensor(num_heads, max_seq_len) WITHOUT
//   attn_config.alibi_bias_max: the slopes always use the default 8, whatever config.json says
//   (mpt-clip's alibi_bias_max 12 is ignored: its reference logits equal a run with 8 exactly and
//   differ by 1.4 with 12). We do the same; every MosaicML checkpoint uses 8 anyway.
// - MptMLP's up_proj is 4 x d_model whatever expansion_ratio says (mpt-clip: expansion_ratio 2,
//   up_proj [256, 64]); so is intermediate_size here. A checkpoint of another width fails the
//   loader's shape check, as it fails transformers' load.
// - The bias is slope[h] * (j - (max_seq_len - 1)) for key j (the last max_seq_len columns of a
//   [1, max_seq_len] row), added after the scale (scores * softmax_scale + bias): constant along a
//   query's row, so the paged kernels' slope * (j - i) gives the same softmax. Keys past
//   max_seq_len break transformers' slicing: max_seq_len is the context limit.
// - clip_qkv clamps the whole fused Wqkv output to [-clip, clip] before the split (a falsy 0
//   clamps nothing). Element-wise, so each rank clamps its own q/k/v columns.
// - softmax_scale null: 1/sqrt(d_model / n_heads).
// - Ignored by transformers, so here: qk_ln (no q_ln/k_ln modules exist: refused rather than run
//   silently without them), attn_config.alibi (ALiBi is always used: false is refused, as its
//   checkpoint would carry a wpe table transformers drops), learned_pos_emb, no_bias (the layers
//   never have biases), logit_scale, norm_type, prefix_lm, attn_uses_sequence_id.
//   attn_type multiquery_attention cannot load into transformers' 3 x d_model Wqkv: refused.
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
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

// transformers passes no alibi_bias_max to build_mpt_alibi_tensor: its default.
constexpr double kAlibiBiasMax = 8.0;

Status checkSpec(const ArchitectureSpec& s) {
  constexpr std::string_view g = "mpt";
  TG_RETURN_IF_ERROR(requireValue(s, g, "norm", s.norm, {NormKind::kLayer}));
  TG_RETURN_IF_ERROR(requireValue(s, g, "activation", s.activation, {Activation::kGelu}));
  TG_RETURN_IF_ERROR(requireValue(s, g, "gatedMlp", s.gatedMlp, {false}));
  TG_RETURN_IF_ERROR(requireValue(s, g, "parallelResidual", s.parallelResidual, {false}));
  TG_RETURN_IF_ERROR(requireValue(s, g, "position", s.position, {PositionKind::kAlibi}));
  TG_RETURN_IF_ERROR(requireValue(s, g, "attentionBias", s.attentionBias, {false}));
  TG_RETURN_IF_ERROR(requireValue(s, g, "mlpBias", s.mlpBias, {false}));
  return requireValue(s, g, "qkvLayout", s.qkvLayout, {QkvLayout::kFused});
}

class MptGraph final : public ArchitectureGraph {
 public:
  explicit MptGraph(const ArchitectureSpec& spec) : spec_(spec) {}

  Status load(const WeightLoader& w) override {
    const ArchitectureSpec::Tensors& t = spec_.tensors;
    const ModelConfig& c = w.config();
    const double eps = c.rmsNormEps;  // layer_norm_epsilon
    const ConfigFields fields(c);
    TG_ASSIGN_OR_RETURN(std::optional<double> clip, fields.optionalNumber("attn_config.clip_qkv"));
    TG_ASSIGN_OR_RETURN(std::optional<double> scale,
                        fields.optionalNumber("attn_config.softmax_scale"));
    const Attention::Options attention{.alibiSlopes = mptAlibiSlopes(c.numHeads, kAlibiBiasMax),
                                       .clipQkv = static_cast<float>(clip.value_or(0.0)),
                                       .scale = static_cast<float>(scale.value_or(0.0))};
    TG_ASSIGN_OR_RETURN(embedding_, Embedding::load(w, std::string(t.embed)));
    layers_.resize(c.numLayers);
    for (int64_t i = 0; i < c.numLayers; ++i) {
      Layer& l = layers_[i];
      TG_ASSIGN_OR_RETURN(l.inputNorm, Norm::load(w, NormKind::kLayer, layerName(t.inputNorm, i),
                                                  eps, NormBias::kAbsent));
      TG_ASSIGN_OR_RETURN(l.attention, Attention::load(w,
                                                       {.layout = spec_.qkvLayout,
                                                        .q = {},
                                                        .k = {},
                                                        .v = {},
                                                        .qkv = layerName(t.qkv, i),
                                                        .o = layerName(t.o, i)},
                                                       attention));
      TG_ASSIGN_OR_RETURN(l.postNorm, Norm::load(w, NormKind::kLayer, layerName(t.postNorm, i), eps,
                                                 NormBias::kAbsent));
      TG_ASSIGN_OR_RETURN(
          l.mlp,
          Mlp::load(w, {.up = layerName(t.up, i), .down = layerName(t.down, i)}, c.hiddenAct));
    }
    TG_ASSIGN_OR_RETURN(Norm finalNorm, Norm::load(w, NormKind::kLayer, std::string(t.finalNorm),
                                                   eps, NormBias::kAbsent));
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
      // As Llama's: layer 0 normalises the embedding's reduced partial sums; later layers first
      // add the previous MLP's.
      TG_RETURN_IF_ERROR(
          l.inputNorm.forwardReduced(ctx, i == 0 ? x : hs, i == 0 ? nullptr : x, hs, ctx.rows()));
      TG_RETURN_IF_ERROR(l.attention.forward(ctx, static_cast<int64_t>(i), hs));
      TG_RETURN_IF_ERROR(l.postNorm.forwardReduced(ctx, hs, x, hs, ctx.rows()));
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

  ArchitectureSpec spec_;
  Embedding embedding_;
  std::vector<Layer> layers_;
  LogitsHead head_;
};

Status fieldError(std::string_view path, std::string_view what) {
  return invalidArgumentError("config.json: '" + std::string(path) + "' " + std::string(what));
}

// attn_config's values transformers reads, or refuses to run without.
Status checkAttnConfig(const nlohmann::json& config) {
  const auto a = config.find("attn_config");
  if (a == config.end() || a->is_null()) return okStatus();
  if (!a->is_object()) return fieldError("attn_config", "must be an object");
  const auto field = [&](const char* key) -> const nlohmann::json* {
    const auto f = a->find(key);
    return f == a->end() || f->is_null() ? nullptr : &*f;
  };
  if (const auto* qkLn = field("qk_ln")) {
    if (!qkLn->is_boolean()) return fieldError("attn_config.qk_ln", "must be a boolean");
    if (qkLn->get<bool>())
      return unimplementedError(
          "config.json: 'attn_config.qk_ln' true is not supported: transformers' MptForCausalLM "
          "has no q/k LayerNorm to match");
  }
  if (const auto* alibi = field("alibi")) {
    if (!alibi->is_boolean()) return fieldError("attn_config.alibi", "must be a boolean");
    if (!alibi->get<bool>())
      return unimplementedError(
          "config.json: 'attn_config.alibi' false (learned positions) is not supported: "
          "transformers' MptForCausalLM always uses ALiBi");
  }
  if (const auto* type = field("attn_type")) {
    if (!type->is_string() || type->get<std::string>() != "multihead_attention")
      return unimplementedError(
          "config.json: 'attn_config.attn_type' must be \"multihead_attention\" (transformers' "
          "MptForCausalLM has no other)");
  }
  if (const auto* clip = field("clip_qkv")) {
    if (!clip->is_number() || !std::isfinite(clip->get<double>()) || clip->get<double>() < 0)
      return fieldError("attn_config.clip_qkv", "must be null or a non-negative number");
  }
  if (const auto* scale = field("softmax_scale")) {
    if (!scale->is_number() || !std::isfinite(scale->get<double>()) || scale->get<double>() <= 0)
      return fieldError("attn_config.softmax_scale", "must be null or a positive number");
  }
  return okStatus();
}

}  // namespace

// MptConfig's keys into the canonical ones: d_model, n_heads, n_layers, max_seq_len (aliases),
// layer_norm_epsilon as the norm epsilon (MptConfig's default 1e-5), the MLP 4 x d_model with the
// erf GELU, a tied head (MptConfig's default), attn_config checked.
Status prepareMptConfig(nlohmann::json& config) {
  TG_RETURN_IF_ERROR(checkAttnConfig(config));
  if (!config.contains("rms_norm_eps"))
    config["rms_norm_eps"] = config.value("layer_norm_epsilon", nlohmann::json(1e-5));
  // MptConfig's own names for what it must give (the canonical ones after the aliases).
  for (const auto& [canonical, key] :
       {std::pair{"hidden_size", "d_model"}, std::pair{"num_attention_heads", "n_heads"},
        std::pair{"num_hidden_layers", "n_layers"}}) {
    const auto v = config.find(canonical);
    if (v == config.end() || !v->is_number_integer() || v->get<int64_t>() <= 0)
      return fieldError(key, "must be a positive integer");
  }
  const int64_t hidden = config["hidden_size"].get<int64_t>();
  if (hidden > (int64_t{1} << 30)) return fieldError("d_model", "is too large");
  config["intermediate_size"] = 4 * hidden;  // not expansion_ratio: see above
  config["hidden_act"] = "gelu";  // nn.GELU(approximate="none"), whatever config.json says
  if (!config.contains("tie_word_embeddings")) config["tie_word_embeddings"] = true;
  return okStatus();
}

StatusOr<std::unique_ptr<ArchitectureGraph>> makeMptGraph(const ArchitectureSpec& spec) {
  TG_RETURN_IF_ERROR(checkSpec(spec));
  return std::unique_ptr<ArchitectureGraph>(std::make_unique<MptGraph>(spec));
}

}  // namespace textgen::runtime
