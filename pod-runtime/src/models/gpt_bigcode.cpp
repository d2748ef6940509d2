// The GPT-BigCode graph (GPTBigCodeForCausalLM: SantaCoder, StarCoder): GPT-2's block with
// multi-query attention. Learned absolute positions (wpe) added to the token embedding, LayerNorm
// with bias (ln_1, ln_2, ln_f), one fused c_attn, a non-gated MLP c_fc -> act -> c_proj
// (gelu_pytorch_tanh by default), biases everywhere, sequential residual, the head tied to wte.
//
// What transformers 5.12.1's modeling_gpt_bigcode.py computes, verified there:
// - multi_query (default true) sets num_key_value_heads: 1, else n_head. GPTBigCodeConfig
//   overwrites any num_key_value_heads config.json gives, and so does prepareGptBigcodeConfig.
// - c_attn's rows: multi_query splits them as [q (n_embd); k (head_dim); v (head_dim)]
//   (QkvLayout::kFused); without multi_query they are viewed as [n_head, 3 * head_dim], each
//   head's q, k, v in turn (QkvLayout::kFusedInterleavedPerHead), not [q; k; v].
// - Scores scaled by head_dim^-0.5 when scale_attn_weights (default true), else not at all (not
//   built here: refused). attention_softmax_in_fp32 and scale_attention_softmax_in_fp32 no longer
//   change anything: the attention functions always take the softmax in float32, on the scaled
//   scores, as ours do.
// - n_inner null means 4 * n_embd; layer_norm_epsilon default 1e-5; tie_word_embeddings default
//   true (the checkpoints have no lm_head.weight).
// - No rotary embedding: the positions enter only through wpe, so keys are cached as projected
//   (Attention::Options::rope false).
// Under tensor parallelism the single key/value head is replicated on every rank (Partition's
// kvShard), the query heads split.
#include <nlohmann/json.hpp>
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

using nlohmann::json;

Status fieldError(const std::string& field, const std::string& what) {
  return invalidArgumentError("config.json: '" + field + "' " + what);
}

// A boolean field of config.json: its value, `fallback` when absent or null.
StatusOr<bool> boolField(const json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return fieldError(key, "must be true or false");
  return it->get<bool>();
}

void setDefault(json& j, const char* key, const json& value) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) j[key] = value;
}

// The spec values this graph builds.
Status checkSpec(const ArchitectureSpec& s) {
  constexpr std::string_view g = "gpt_bigcode";
  TG_RETURN_IF_ERROR(requireValue(s, g, "norm", s.norm, {NormKind::kLayer}));
  TG_RETURN_IF_ERROR(requireValue(s, g, "gatedMlp", s.gatedMlp, {false}));
  TG_RETURN_IF_ERROR(requireValue(s, g, "parallelResidual", s.parallelResidual, {false}));
  TG_RETURN_IF_ERROR(requireValue(s, g, "position", s.position, {PositionKind::kLearned}));
  TG_RETURN_IF_ERROR(requireValue(s, g, "attentionBias", s.attentionBias, {true}));
  TG_RETURN_IF_ERROR(requireValue(s, g, "mlpBias", s.mlpBias, {true}));
  // kFused names the multi-query layout; a checkpoint without multi_query is read per head.
  return requireValue(s, g, "qkvLayout", s.qkvLayout, {QkvLayout::kFused});
}

class GptBigcodeGraph final : public ArchitectureGraph {
 public:
  explicit GptBigcodeGraph(const ArchitectureSpec& spec) : spec_(spec) {}

  Status load(const WeightLoader& w) override {
    const ArchitectureSpec::Tensors& t = spec_.tensors;
    const ModelConfig& c = w.config();
    TG_ASSIGN_OR_RETURN(const bool multiQuery, ConfigFields(c).boolean("multi_query", true));
    const QkvLayout layout = multiQuery ? spec_.qkvLayout : QkvLayout::kFusedInterleavedPerHead;
    TG_ASSIGN_OR_RETURN(embedding_, Embedding::load(w, std::string(t.embed)));
    TG_ASSIGN_OR_RETURN(positions_, PositionEmbedding::load(w, std::string(t.positionEmbed),
                                                            c.maxPositionEmbeddings));
    layers_.resize(c.numLayers);
    for (int64_t i = 0; i < c.numLayers; ++i) {
      Layer& l = layers_[i];
      TG_ASSIGN_OR_RETURN(l.inputNorm, Norm::load(w, spec_.norm, layerName(t.inputNorm, i),
                                                  c.rmsNormEps, NormBias::kRequired));
      TG_ASSIGN_OR_RETURN(l.attention,
                          Attention::load(w,
                                          {.layout = layout,
                                           .q = {},
                                           .k = {},
                                           .v = {},
                                           .qkv = layerName(t.qkv, i),
                                           .o = layerName(t.o, i),
                                           .bias = true},
                                          {.slidingWindow = 0, .alibiSlopes = {}, .rope = false}));
      TG_ASSIGN_OR_RETURN(l.postNorm, Norm::load(w, spec_.norm, layerName(t.postNorm, i),
                                                 c.rmsNormEps, NormBias::kRequired));
      TG_ASSIGN_OR_RETURN(
          l.mlp,
          Mlp::load(w, {.up = layerName(t.up, i), .down = layerName(t.down, i), .bias = true},
                    c.hiddenAct));
    }
    TG_ASSIGN_OR_RETURN(Norm finalNorm, Norm::load(w, spec_.norm, std::string(t.finalNorm),
                                                   c.rmsNormEps, NormBias::kRequired));
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
    TG_RETURN_IF_ERROR(positions_.forward(ctx, x));  // rank 0's partial sum holds the positions
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& l = layers_[i];
      // x + attn(ln_1(x)), then + mlp(ln_2(.)); each norm sums its input over the ranks first.
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
  PositionEmbedding positions_;
  std::vector<Layer> layers_;
  LogitsHead head_;
};

constexpr ArchitectureSpec::ConfigKeyAlias kAliases[] = {{"n_embd", "hidden_size"},
                                                         {"n_layer", "num_hidden_layers"},
                                                         {"n_head", "num_attention_heads"},
                                                         {"n_inner", "intermediate_size"},
                                                         {"n_positions", "max_position_embeddings"},
                                                         {"layer_norm_epsilon", "rms_norm_eps"},
                                                         {"activation_function", "hidden_act"}};

// Larger than any hidden size the parser accepts: 4 * n_embd is computed only below it.
constexpr int64_t kMaxDerivedHidden = int64_t{1} << 30;

}  // namespace

// After the aliases: num_key_value_heads from multi_query, n_inner's default, and
// GPTBigCodeConfig's defaults where the generic parser's differ.
Status prepareGptBigcodeConfig(json& config) {
  TG_ASSIGN_OR_RETURN(const bool multiQuery, boolField(config, "multi_query", true));
  TG_ASSIGN_OR_RETURN(const bool scaled, boolField(config, "scale_attn_weights", true));
  if (!scaled)
    return unimplementedError(
        "config.json: 'scale_attn_weights' false (unscaled attention scores) is not implemented");
  auto heads = config.find("num_attention_heads");
  if (heads != config.end() && heads->is_number_integer()) {
    config["num_key_value_heads"] = multiQuery ? json(1) : *heads;
  }
  auto hidden = config.find("hidden_size");
  if (hidden != config.end() && hidden->is_number_integer() && hidden->get<int64_t>() > 0 &&
      hidden->get<int64_t>() < kMaxDerivedHidden) {
    setDefault(config, "intermediate_size", 4 * hidden->get<int64_t>());
  }
  setDefault(config, "rms_norm_eps", 1e-5);
  setDefault(config, "tie_word_embeddings", true);
  return okStatus();
}

ArchitectureSpec gptBigcodeSpec() {
  return {.name = "GPTBigCodeForCausalLM",
          .tensors = {.embed = "transformer.wte.weight",
                      .positionEmbed = "transformer.wpe.weight",
                      .finalNorm = "transformer.ln_f.weight",
                      .lmHead = "lm_head.weight",
                      .inputNorm = "transformer.h.{}.ln_1.weight",
                      .q = "",
                      .k = "",
                      .v = "",
                      .qkv = "transformer.h.{}.attn.c_attn.weight",
                      .o = "transformer.h.{}.attn.c_proj.weight",
                      .postNorm = "transformer.h.{}.ln_2.weight",
                      .gate = "",
                      .up = "transformer.h.{}.mlp.c_fc.weight",
                      .down = "transformer.h.{}.mlp.c_proj.weight"},
          .norm = NormKind::kLayer,
          .activation = Activation::kGeluTanh,
          .gatedMlp = false,
          .position = PositionKind::kLearned,
          .qkvLayout = QkvLayout::kFused,
          .attentionBias = true,
          .mlpBias = true,
          .configKeyAliases = kAliases,
          .prepareConfig = prepareGptBigcodeConfig};
}

StatusOr<std::unique_ptr<ArchitectureGraph>> makeGptBigcodeGraph(const ArchitectureSpec& spec) {
  TG_RETURN_IF_ERROR(checkSpec(spec));
  return std::unique_ptr<ArchitectureGraph>(std::make_unique<GptBigcodeGraph>(spec));
}

}  // namespace textgen::runtime
