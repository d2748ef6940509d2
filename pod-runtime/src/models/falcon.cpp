// The Falcon graph (FalconForCausalLM, and the older RWForCausalLM checkpoints of the same
// weights): LayerNorm with a bias, one fused query_key_value projection, rotary embeddings or
// ALiBi, a plain MLP (dense_h_to_4h -> activation, GELU by default -> dense_4h_to_h), optional
// biases on every linear layer (config "bias"), and the head tied to word_embeddings unless
// tie_word_embeddings is false. One class, three decoders, chosen by config.json (read exactly as
// transformers 5.12.1's modeling_falcon.py builds them):
//   - old decoder, parallel_attn (Falcon-7B): x + attn(ln(x)) + mlp(ln(x)), ONE input_layernorm
//     feeding both; multi_query gives one key/value head whatever num_kv_heads says.
//   - old decoder, sequential (Falcon-RW): input_layernorm -> attention -> residual ->
//     post_attention_layernorm -> MLP -> residual, as Llama.
//   - new_decoder_architecture (Falcon-40B/180B, Falcon2): always parallel; ln_attn and ln_mlp
//     (num_ln_in_parallel_attn 2, the default) or one input_layernorm (1); num_kv_heads grouped
//     key/value heads; multi_query is ignored.
// Parallel layers add the attention's and the MLP's per-rank partial sums first, then reduce once
// (one all-reduce per layer, as TGI): transformers adds mlp + attn, then the residual, in that
// order, which the norm's fused residual add reproduces.
//
// The fused query_key_value rows, from FalconAttention._split_heads:
//   - new decoder: per key/value head g, its heads/kvHeads query heads, then k_g, then v_g
//     (QkvLayout::kFusedGrouped);
//   - old decoder, multi_query: all query heads, then the one k, then the one v (kFused);
//   - old decoder, not multi_query: per head q_h, k_h, v_h (kFusedInterleavedPerHead); transformers
//     reshapes the keys to num_kv_heads heads, which fails unless num_kv_heads == heads, so any
//     other num_kv_heads is refused.
//
// ALiBi (alibi: true; Falcon-RW): FalconModel builds BLOOM's slopes, rounds them to bfloat16,
// multiplies by the key's absolute position and rounds that product to bfloat16 again
// (build_alibi_tensor), then divides the bias by sqrt(head_dim) before adding it to the scores
// (the causal mask in the SDPA path; the eager path adds it and multiplies the sum by
// inv_norm_factor, the same thing): score = q.k / sqrt(head_dim) + bf16(bf16(slope) * j) /
// sqrt(head_dim). The paged attention kernels compute exactly that with the slopes rounded to
// bfloat16 here and Attention::Options::alibiBf16Divisor = sqrt(head_dim). The product's rounding
// matters: it is exact only while slope * j has at most 8 significant bits (power-of-two slopes,
// positions below 256), and moves the score by up to 0.06 below 256 positions with 32 heads
// (head_dim 64, Falcon-RW-1B's shape), 0.46 at 1024, 0.91 at 2048; a 12-head checkpoint written
// the fixtures' way gave logits 1.3e-2 from transformers' without it, 1.8e-5 with it. (BLOOM's
// slope * (j - i), which softmax treats the same in exact arithmetic, cannot round this way. TGI
// refuses Falcon with alibi altogether.)
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "layers/alibi.h"
#include "layers/attention.h"
#include "layers/config_fields.h"
#include "layers/embedding.h"
#include "layers/logits_head.h"
#include "layers/mlp.h"
#include "layers/norm.h"
#include "models/architecture_graph.h"
#include "textgen/kernels/half.h"

namespace textgen::runtime {
namespace {

using nlohmann::json;

// The new decoder's two norms (the spec's Tensors has one input and one post-attention norm).
constexpr std::string_view kLnAttn = "transformer.h.{}.ln_attn.weight";
constexpr std::string_view kLnMlp = "transformer.h.{}.ln_mlp.weight";

// ---- config.json -----------------------------------------------------------------------------

Status fieldError(std::string_view key, std::string_view what) {
  return invalidArgumentError("config.json: '" + std::string(key) + "' " + std::string(what));
}

bool present(const json& j, std::string_view key) {
  auto it = j.find(std::string(key));
  return it != j.end() && !it->is_null();
}

// A FalconConfig flag: absent -> the class's default; null -> false (transformers tests the
// attribute's truth, and None is false).
StatusOr<bool> flag(const json& j, std::string_view key, bool fallback) {
  auto it = j.find(std::string(key));
  if (it == j.end()) return fallback;
  if (it->is_null()) return false;
  if (!it->is_boolean()) return fieldError(key, "must be true or false");
  return it->get<bool>();
}

// A positive integer, or nullopt when absent or null.
StatusOr<std::optional<int64_t>> count(const json& j, std::string_view key) {
  if (!present(j, key)) return std::optional<int64_t>();
  const json& v = j.at(std::string(key));
  if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > (int64_t{1} << 24))
    return fieldError(key, "must be a positive integer (at most 2^24)");
  return std::optional<int64_t>(v.get<int64_t>());
}

// FalconConfig's fields rewritten into the canonical keys the generic parser reads, and its own
// flags resolved (defaults applied) for the graph. `rw`: a RWForCausalLM config (the remote-code
// RWConfig, read as TGI reads it): the key/value heads are n_head_kv, and without
// new_decoder_architecture the new decoder is model_type "RefinedWeb" (Falcon-40B), the old one
// "RefinedWebModel" (Falcon-7B).
Status prepareConfig(json& j, bool rw) {
  TG_ASSIGN_OR_RETURN(const bool alibi, flag(j, "alibi", false));
  bool newArchDefault = false;
  if (rw && j.contains("model_type") && j["model_type"].is_string())
    newArchDefault = j["model_type"].get<std::string>() == "RefinedWeb";
  TG_ASSIGN_OR_RETURN(const bool newArch, flag(j, "new_decoder_architecture", newArchDefault));
  TG_ASSIGN_OR_RETURN(const bool multiQuery, flag(j, "multi_query", !rw));
  TG_ASSIGN_OR_RETURN(const bool parallelAttn, flag(j, "parallel_attn", !rw));
  TG_ASSIGN_OR_RETURN(const bool bias, flag(j, "bias", false));
  TG_ASSIGN_OR_RETURN(const bool tied, flag(j, "tie_word_embeddings", true));
  TG_ASSIGN_OR_RETURN(const auto heads, count(j, "num_attention_heads"));
  TG_ASSIGN_OR_RETURN(const auto hidden, count(j, "hidden_size"));
  if (!heads) return fieldError("num_attention_heads", "is required");
  if (!hidden) return fieldError("hidden_size", "is required");
  if (*hidden % *heads != 0)
    return fieldError("num_attention_heads",
                      "must divide hidden_size (" + std::to_string(*hidden) + ")");
  const std::string_view kvKey = rw ? "n_head_kv" : "num_kv_heads";
  TG_ASSIGN_OR_RETURN(const auto kvHeads, count(j, kvKey));
  TG_ASSIGN_OR_RETURN(const auto lnCount, count(j, "num_ln_in_parallel_attn"));
  TG_ASSIGN_OR_RETURN(const auto ffn, count(j, "ffn_hidden_size"));

  int64_t numKv = *heads, numLn = 1;
  if (newArch) {
    // FalconDecoderLayer builds ln_attn/ln_mlp or input_layernorm only when parallel_attn.
    if (!parallelAttn)
      return fieldError("parallel_attn",
                        "must be true with new_decoder_architecture (Falcon's new decoder is "
                        "always parallel)");
    numLn = lnCount.value_or(2);
    if (numLn != 1 && numLn != 2) return fieldError("num_ln_in_parallel_attn", "must be 1 or 2");
    numKv = kvHeads.value_or(*heads);
    if (*heads % numKv != 0)
      return fieldError(kvKey, "must divide num_attention_heads (" + std::to_string(*heads) + ")");
  } else if (multiQuery) {
    numKv = 1;  // whatever num_kv_heads says
  } else if (kvHeads && *kvHeads != *heads) {
    return fieldError(kvKey,
                      "must equal num_attention_heads without multi_query or "
                      "new_decoder_architecture (each head has its own key and value)");
  }
  if (!newArch && parallelAttn && lnCount == 2)
    return fieldError("num_ln_in_parallel_attn",
                      "2 (ln_attn and ln_mlp) needs new_decoder_architecture");

  // The canonical keys, whatever config.json held under them (FalconConfig reads none of these).
  j["num_key_value_heads"] = numKv;
  j["intermediate_size"] = ffn.value_or(4 * *hidden);
  j["tie_word_embeddings"] = tied;
  j.erase("head_dim");               // hidden_size / heads
  j.erase("partial_rotary_factor");  // Falcon rotates the whole head
  for (const char* key : {"sliding_window", "attention_bias", "mlp_bias"}) j.erase(key);
  if (!present(j, "max_position_embeddings")) j["max_position_embeddings"] = 2048;
  if (present(j, "layer_norm_epsilon") && !j["layer_norm_epsilon"].is_number())
    return fieldError("layer_norm_epsilon", "must be a number");
  j["rms_norm_eps"] = present(j, "layer_norm_epsilon") ? j["layer_norm_epsilon"] : json(1e-5);
  // Falcon's own flags, resolved, for the graph (ConfigFields).
  j["alibi"] = alibi;
  j["new_decoder_architecture"] = newArch;
  j["multi_query"] = multiQuery;
  j["parallel_attn"] = newArch || parallelAttn;
  j["num_ln_in_parallel_attn"] = numLn;
  j["bias"] = bias;
  return okStatus();
}

Status prepareFalconConfig(json& j) {
  return prepareConfig(j, false);
}

Status prepareRwConfig(json& j) {
  return prepareConfig(j, true);
}

// n_head and n_layer: RWConfig's names (TGI reads them; transformers 5.12.1's FalconConfig does
// not, falling back to Falcon-7B's 71 heads and 32 layers). n_embed: both classes' old name for
// hidden_size. activation: FalconConfig's name for the MLP's activation.
constexpr ConfigKeyAlias kAliases[] = {{"n_head", "num_attention_heads"},
                                       {"n_layer", "num_hidden_layers"},
                                       {"n_embed", "hidden_size"},
                                       {"activation", "hidden_act"}};

// ---- the graph -------------------------------------------------------------------------------

// The spec values this graph builds; config.json picks the decoder, the q/k/v layout and the
// position encoding within them.
Status checkSpec(const ArchitectureSpec& s) {
  constexpr std::string_view g = "falcon";
  TG_RETURN_IF_ERROR(requireValue(s, g, "norm", s.norm, {NormKind::kLayer}));
  TG_RETURN_IF_ERROR(requireValue(
      s, g, "activation", s.activation,
      {Activation::kGelu, Activation::kGeluTanh, Activation::kRelu, Activation::kSilu}));
  TG_RETURN_IF_ERROR(requireValue(s, g, "gatedMlp", s.gatedMlp, {false}));
  TG_RETURN_IF_ERROR(requireValue(s, g, "parallelResidual", s.parallelResidual, {true}));
  TG_RETURN_IF_ERROR(requireValue(s, g, "position", s.position, {PositionKind::kRope}));
  return requireValue(s, g, "qkvLayout", s.qkvLayout, {QkvLayout::kFused});
}

// FalconModel's ALiBi slopes: BLOOM's, rounded to bfloat16 (see the top of the file).
std::vector<float> falconAlibiSlopes(const ModelConfig& c) {
  std::vector<float> slopes = bloomAlibiSlopes(c.numHeads);
  for (float& s : slopes) s = kernels::bf16ToFloat(kernels::floatToBf16(s));
  return slopes;
}

class FalconGraph final : public ArchitectureGraph {
 public:
  explicit FalconGraph(const ArchitectureSpec& spec) : spec_(spec) {}

  Status load(const WeightLoader& w) override {
    const ArchitectureSpec::Tensors& t = spec_.tensors;
    const ModelConfig& c = w.config();
    const ConfigFields f(c);
    TG_ASSIGN_OR_RETURN(const bool alibi, f.boolean("alibi", false));
    TG_ASSIGN_OR_RETURN(const bool newArch, f.boolean("new_decoder_architecture", false));
    TG_ASSIGN_OR_RETURN(const bool multiQuery, f.boolean("multi_query", true));
    TG_ASSIGN_OR_RETURN(parallel_, f.boolean("parallel_attn", true));
    TG_ASSIGN_OR_RETURN(const int64_t numLn, f.integer("num_ln_in_parallel_attn", 1, 2));
    TG_ASSIGN_OR_RETURN(const bool bias, f.boolean("bias", false));
    const QkvLayout layout = newArch      ? QkvLayout::kFusedGrouped
                             : multiQuery ? QkvLayout::kFused
                                          : QkvLayout::kFusedInterleavedPerHead;
    const bool twoNorms = newArch && numLn == 2;
    // transformers divides the bias by math.sqrt(head_dim), a float32 scalar in the division.
    const Attention::Options options{
        .slidingWindow = 0,
        .alibiSlopes = alibi ? falconAlibiSlopes(c) : std::vector<float>{},
        .alibiBf16Divisor = alibi ? std::sqrt(static_cast<float>(c.headDim)) : 0.0f};
    auto norm = [&](std::string_view pattern, int64_t i) {
      return Norm::load(w, NormKind::kLayer, layerName(pattern, i), c.rmsNormEps,
                        NormBias::kRequired);
    };

    TG_ASSIGN_OR_RETURN(embedding_, Embedding::load(w, std::string(t.embed)));
    layers_.resize(c.numLayers);
    for (int64_t i = 0; i < c.numLayers; ++i) {
      Layer& l = layers_[i];
      TG_ASSIGN_OR_RETURN(l.attnNorm, norm(twoNorms ? kLnAttn : t.inputNorm, i));
      if (twoNorms) {
        TG_ASSIGN_OR_RETURN(l.mlpNorm, norm(kLnMlp, i));
      } else if (!parallel_) {
        TG_ASSIGN_OR_RETURN(l.mlpNorm, norm(t.postNorm, i));
      }
      TG_ASSIGN_OR_RETURN(l.attention, Attention::load(w,
                                                       {.layout = layout,
                                                        .q = "",
                                                        .k = "",
                                                        .v = "",
                                                        .qkv = layerName(t.qkv, i),
                                                        .o = layerName(t.o, i),
                                                        .bias = bias},
                                                       options));
      TG_ASSIGN_OR_RETURN(
          l.mlp,
          Mlp::load(w, {.up = layerName(t.up, i), .down = layerName(t.down, i), .bias = bias},
                    c.hiddenAct));
    }
    TG_ASSIGN_OR_RETURN(Norm finalNorm, norm(t.finalNorm, 0));
    TG_ASSIGN_OR_RETURN(head_, LogitsHead::load(w, std::move(finalNorm), std::string(t.lmHead),
                                                c.tieWordEmbeddings, embedding_));
    return okStatus();
  }

  const LogitsHead* logitsHead() const override { return &head_; }

  Status build(const ForwardContext& ctx) const override {
    const int64_t rows = ctx.rows();
    void* x = ctx.ws.residual->data();  // [rows, hidden]: the residual stream
    void* hs = ctx.ws.hidden->data();   // [rows, hidden]: each block's input and output
    // [rows, hidden]: a parallel layer's MLP branch.
    void* mlpIn = parallel_ ? ctx.ws.branch->data() : nullptr;
    TG_RETURN_IF_ERROR(embedding_.forward(ctx, x));
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& l = layers_[i];
      // Layer 0 normalises the embedding; later layers first add the previous layer's output
      // (this rank's partial sum, reduced over the ranks by the norm) to the residual.
      TG_RETURN_IF_ERROR(
          l.attnNorm.forwardReduced(ctx, i == 0 ? x : hs, i == 0 ? nullptr : x, hs, rows));
      if (parallel_) {
        // The MLP's input: ln_mlp(x), or input_layernorm(x) again (the same values as hs).
        const Norm& mlpNorm = l.mlpNorm ? *l.mlpNorm : l.attnNorm;
        TG_RETURN_IF_ERROR(mlpNorm.forward(ctx, x, nullptr, mlpIn, rows));
        TG_RETURN_IF_ERROR(l.attention.forward(ctx, static_cast<int64_t>(i), hs));
        TG_RETURN_IF_ERROR(l.mlp.forward(ctx, mlpIn));
        // hs = attn + mlp, this rank's partial sums (transformers: mlp_output += attn_output):
        // an element-wise add, as a bias add over one row of rows * hidden values.
        TG_RETURN_IF_ERROR(
            ctx.backend.biasAdd({.y = hs,
                                 .bias = mlpIn,
                                 .rows = rows > 0 ? 1 : 0,
                                 .out = std::max<int64_t>(rows, 1) * ctx.config.hiddenSize,
                                 .dtype = ctx.dtype}));
      } else {
        TG_RETURN_IF_ERROR(l.attention.forward(ctx, static_cast<int64_t>(i), hs));
        TG_RETURN_IF_ERROR(l.mlpNorm->forwardReduced(ctx, hs, x, hs, rows));
        TG_RETURN_IF_ERROR(l.mlp.forward(ctx, hs));
      }
    }
    return head_.forward(ctx, hs, x);
  }

 private:
  struct Layer {
    Norm attnNorm;  // input_layernorm, or ln_attn
    // ln_mlp (new decoder, two norms), post_attention_layernorm (sequential), or none (the
    // parallel layer's one input_layernorm feeds the MLP too).
    std::optional<Norm> mlpNorm;
    Attention attention;
    Mlp mlp;
  };

  ArchitectureSpec spec_;
  bool parallel_ = true;
  Embedding embedding_;
  std::vector<Layer> layers_;
  LogitsHead head_;
};

}  // namespace

// FalconForCausalLM's names (those of the RW checkpoints it was ported from).
ArchitectureSpec falconSpec(std::string_view name) {
  const bool rw = name == "RWForCausalLM";
  return {.name = name,
          .tensors = {.embed = "transformer.word_embeddings.weight",
                      .positionEmbed = "",
                      .finalNorm = "transformer.ln_f.weight",
                      .lmHead = "lm_head.weight",
                      .inputNorm = "transformer.h.{}.input_layernorm.weight",
                      .q = "",
                      .k = "",
                      .v = "",
                      .qkv = "transformer.h.{}.self_attention.query_key_value.weight",
                      .o = "transformer.h.{}.self_attention.dense.weight",
                      .postNorm = "transformer.h.{}.post_attention_layernorm.weight",
                      .gate = "",
                      .up = "transformer.h.{}.mlp.dense_h_to_4h.weight",
                      .down = "transformer.h.{}.mlp.dense_4h_to_h.weight"},
          .norm = NormKind::kLayer,
          .activation = Activation::kGelu,
          .gatedMlp = false,
          .parallelResidual = true,
          .position = PositionKind::kRope,
          .qkvLayout = QkvLayout::kFused,
          .attentionBias = false,  // config.json's "bias" (the graph reads it)
          .mlpBias = false,
          .tiedEmbeddings = false,  // config.json's tie_word_embeddings, true by default
          .slidingWindow = false,
          .configKeyAliases = kAliases,
          .prepareConfig = rw ? prepareRwConfig : prepareFalconConfig};
}

StatusOr<std::unique_ptr<ArchitectureGraph>> makeFalconGraph(const ArchitectureSpec& spec) {
  TG_RETURN_IF_ERROR(checkSpec(spec));
  return std::unique_ptr<ArchitectureGraph>(std::make_unique<FalconGraph>(spec));
}

}  // namespace textgen::runtime
