// The GPT-NeoX graph (GPTNeoXForCausalLM: Pythia, GPT-NeoX-20B): LayerNorm with bias, one fused
// query_key_value tensor holding each head's [q; k; v] in turn, partial rotary on the first
// rotary dims of every head, a non-gated MLP (dense_h_to_4h -> GELU -> dense_4h_to_h) and an
// untied head (embed_out). Everything carries a bias (the MLP always, query_key_value and dense
// as attention_bias says, default true).
//
// What transformers 5.12.1's modeling_gpt_neox.py computes, verified there:
// - use_parallel_residual (default true):
//     x = x + attn(ln1(x)) + mlp(ln2(x))   summed as (mlp + attn) + x, both norms of the same x;
//   false (sequential):
//     x = x + attn(ln1(x));  x = x + mlp(ln2(x)).
//   In parallel, each rank adds its attention and MLP partial sums before one all-reduce per
//   layer (TGI's order), done by the next norm's forwardReduced.
// - The fused rows are viewed as [heads, 3 * head_dim] and chunked: per head q, k, v
//   (QkvLayout::kFusedInterleavedPerHead).
// - Rotary: rotary_ndims = int(head_dim * partial_rotary_factor) leading dims of each head, in
//   rotate_half (NeoX) pairs; inv_freq over that dim: base^(-2i / rotary_ndims). The rest passes.
// - Scores scaled by head_dim^-0.5, softmax in float32.
// - config.json: transformers 5 writes rope_parameters {rope_theta, partial_rotary_factor};
//   GPTNeoXConfig before it (every released Pythia) wrote rotary_emb_base and rotary_pct at the
//   top level. A missing rotary_pct means 0.25, not 1 (GPTNeoXConfig's default); a missing
//   layer_norm_eps 1e-5; a missing attention_bias true.
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "layers/attention.h"
#include "layers/config_fields.h"
#include "layers/embedding.h"
#include "layers/logits_head.h"
#include "layers/mlp.h"
#include "layers/norm.h"
#include "models/architecture_graph.h"

namespace textgen::runtime {
namespace {

using nlohmann::json;

Status fieldError(const std::string& field, const std::string& what) {
  return invalidArgumentError("config.json: '" + field + "' " + what);
}

// The value the config parser will read for a rope field (`key` in rope_parameters, else in
// rope_scaling, else at the top level), with where it was read; nullopt when none is given.
std::optional<std::pair<const json*, std::string>> ropeField(const json& j,
                                                             const std::string& key) {
  for (const char* object : {"rope_parameters", "rope_scaling"}) {
    auto o = j.find(object);
    if (o == j.end() || o->is_null()) continue;
    if (o->is_object()) {
      auto v = o->find(key);
      if (v != o->end() && !v->is_null())
        return std::make_pair(&*v, std::string(object) + "." + key);
    }
    break;  // the parser reads only the first object present
  }
  auto v = j.find(key);
  if (v != j.end() && !v->is_null()) return std::make_pair(&*v, key);
  return std::nullopt;
}

// GPTNeoXConfig's legacy top-level key (rotary_pct, rotary_emb_base) moved to the canonical one:
// both given and different is an error naming both; neither gives `fallback` (none: the parser's).
// A legacy value that is not positive, or above maxValue, is refused naming it.
Status moveLegacyRopeKey(json& j, const char* legacy, const std::string& canonical,
                         std::optional<double> fallback, std::optional<double> maxValue) {
  const auto present = ropeField(j, canonical);
  auto it = j.find(legacy);
  if (it == j.end() || it->is_null()) {
    if (!present && fallback) j[canonical] = *fallback;
    return okStatus();
  }
  if (!it->is_number()) return fieldError(legacy, "must be a number");
  const double v = it->get<double>();
  if (!(v > 0)) return fieldError(legacy, "must be a positive number");
  if (maxValue && v > *maxValue)
    return fieldError(legacy, "must be at most " + json(*maxValue).dump());
  if (present) {
    if (present->first->is_number() && present->first->get<double>() == it->get<double>())
      return okStatus();
    return invalidArgumentError("config.json: '" + std::string(legacy) + "' (" + it->dump() +
                                ") and '" + present->second + "' (" + present->first->dump() +
                                ") disagree (the same field, spelled two ways)");
  }
  j[canonical] = *it;
  return okStatus();
}

void setDefault(json& j, const char* key, const json& value) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) j[key] = value;
}

// The spec values this graph builds.
Status checkSpec(const ArchitectureSpec& s) {
  constexpr std::string_view g = "gpt_neox";
  TG_RETURN_IF_ERROR(requireValue(s, g, "norm", s.norm, {NormKind::kLayer}));
  TG_RETURN_IF_ERROR(requireValue(s, g, "gatedMlp", s.gatedMlp, {false}));
  TG_RETURN_IF_ERROR(requireValue(s, g, "position", s.position, {PositionKind::kRope}));
  TG_RETURN_IF_ERROR(requireValue(s, g, "mlpBias", s.mlpBias, {true}));
  return requireValue(s, g, "qkvLayout", s.qkvLayout, {QkvLayout::kFusedInterleavedPerHead});
}

class GptNeoxGraph final : public ArchitectureGraph {
 public:
  explicit GptNeoxGraph(const ArchitectureSpec& spec) : spec_(spec) {}

  Status load(const WeightLoader& w) override {
    const ArchitectureSpec::Tensors& t = spec_.tensors;
    const ModelConfig& c = w.config();
    // The spec's flag: the class always runs in parallel; else config.json says (default true).
    TG_ASSIGN_OR_RETURN(const bool parallel,
                        ConfigFields(c).boolean("use_parallel_residual", true));
    parallel_ = spec_.parallelResidual || parallel;
    TG_ASSIGN_OR_RETURN(embedding_, Embedding::load(w, std::string(t.embed)));
    const bool attentionBias = spec_.attentionBias || c.attentionBias;
    layers_.resize(c.numLayers);
    for (int64_t i = 0; i < c.numLayers; ++i) {
      Layer& l = layers_[i];
      TG_ASSIGN_OR_RETURN(l.inputNorm, Norm::load(w, spec_.norm, layerName(t.inputNorm, i),
                                                  c.rmsNormEps, NormBias::kRequired));
      TG_ASSIGN_OR_RETURN(l.attention, Attention::load(w,
                                                       {.layout = spec_.qkvLayout,
                                                        .q = {},
                                                        .k = {},
                                                        .v = {},
                                                        .qkv = layerName(t.qkv, i),
                                                        .o = layerName(t.o, i),
                                                        .bias = attentionBias},
                                                       {}));
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
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& l = layers_[i];
      // Layer 0 normalises the embedding; later layers first add the previous layer's output
      // (summed over the ranks in the norm).
      TG_RETURN_IF_ERROR(
          l.inputNorm.forwardReduced(ctx, i == 0 ? x : hs, i == 0 ? nullptr : x, hs, ctx.rows()));
      TG_RETURN_IF_ERROR(parallel_ ? parallelBlock(ctx, l, i, x, hs)
                                   : sequentialBlock(ctx, l, i, x, hs));
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

  // x + attn(ln1(x)) + mlp(ln2(x)): `x` [rows, hidden] holds the whole residual and `hs` ln1(x);
  // `hs` gets this rank's attention + MLP partial sum.
  Status parallelBlock(const ForwardContext& ctx, const Layer& l, size_t i, void* x,
                       void* hs) const {
    void* branch = ctx.ws.branch->data();  // [rows, hidden]: ln2(x), then the MLP's partial sum
    const int64_t rows = ctx.rows();
    TG_RETURN_IF_ERROR(l.postNorm.forward(ctx, x, nullptr, branch, rows));
    TG_RETURN_IF_ERROR(l.attention.forward(ctx, static_cast<int64_t>(i), hs));
    TG_RETURN_IF_ERROR(l.mlp.forward(ctx, branch));
    // hs = attn + mlp, rounded once (addition commutes: transformers' mlp + attn bit for bit): an
    // element-wise add, as a bias add over one row of rows * hidden values.
    return ctx.backend.biasAdd({.y = hs,
                                .bias = branch,
                                .rows = 1,
                                .out = rows * ctx.config.hiddenSize,
                                .dtype = ctx.dtype});
  }

  // x + attn(ln1(x)), then + mlp(ln2(.)); `hs` gets this rank's MLP partial sum, `x` the residual
  // before it.
  Status sequentialBlock(const ForwardContext& ctx, const Layer& l, size_t i, void* x,
                         void* hs) const {
    TG_RETURN_IF_ERROR(l.attention.forward(ctx, static_cast<int64_t>(i), hs));
    TG_RETURN_IF_ERROR(l.postNorm.forwardReduced(ctx, hs, x, hs, ctx.rows()));
    return l.mlp.forward(ctx, hs);
  }

  ArchitectureSpec spec_;
  bool parallel_ = true;
  Embedding embedding_;
  std::vector<Layer> layers_;
  LogitsHead head_;
};

constexpr ArchitectureSpec::ConfigKeyAlias kAliases[] = {{"layer_norm_eps", "rms_norm_eps"}};

}  // namespace

// After the aliases: the legacy rotary keys and GPTNeoXConfig's defaults where the generic
// parser's differ.
Status prepareGptNeoxConfig(json& config) {
  TG_RETURN_IF_ERROR(moveLegacyRopeKey(config, "rotary_pct", "partial_rotary_factor", 0.25, 1.0));
  TG_RETURN_IF_ERROR(
      moveLegacyRopeKey(config, "rotary_emb_base", "rope_theta", std::nullopt, std::nullopt));
  setDefault(config, "rms_norm_eps", 1e-5);
  setDefault(config, "attention_bias", true);
  return okStatus();
}

ArchitectureSpec gptNeoxSpec() {
  return {.name = "GPTNeoXForCausalLM",
          .tensors = {.embed = "gpt_neox.embed_in.weight",
                      .finalNorm = "gpt_neox.final_layer_norm.weight",
                      .lmHead = "embed_out.weight",
                      .inputNorm = "gpt_neox.layers.{}.input_layernorm.weight",
                      .q = "",
                      .k = "",
                      .v = "",
                      .qkv = "gpt_neox.layers.{}.attention.query_key_value.weight",
                      .o = "gpt_neox.layers.{}.attention.dense.weight",
                      .postNorm = "gpt_neox.layers.{}.post_attention_layernorm.weight",
                      .gate = "",
                      .up = "gpt_neox.layers.{}.mlp.dense_h_to_4h.weight",
                      .down = "gpt_neox.layers.{}.mlp.dense_4h_to_h.weight"},
          .norm = NormKind::kLayer,
          .activation = Activation::kGelu,
          .gatedMlp = false,
          .qkvLayout = QkvLayout::kFusedInterleavedPerHead,
          .mlpBias = true,
          .configKeyAliases = kAliases,
          .prepareConfig = prepareGptNeoxConfig};
}

StatusOr<std::unique_ptr<ArchitectureGraph>> makeGptNeoxGraph(const ArchitectureSpec& spec) {
  TG_RETURN_IF_ERROR(checkSpec(spec));
  return std::unique_ptr<ArchitectureGraph>(std::make_unique<GptNeoxGraph>(spec));
}

}  // namespace textgen::runtime
