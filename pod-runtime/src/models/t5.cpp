// The T5 graph (T5ForConditionalGeneration: T5, T5 v1.1, FLAN-T5, mT5): an encoder-decoder. The
// encoder runs once per request, when it starts: bidirectional self-attention with T5's relative
// position bias over its prompt (keys and values kept in the request's cross blocks while it
// runs), then every decoder layer's cross keys and values of its output, written into those
// blocks. Each step runs the decoder over one new token per sequence: causal self-attention with
// the decoder's own bias table, cross-attention over the cached encoder output, the FFN. T5's
// details (docs/t5.md): RMSNorm without mean or bias, no score scaling (folded into q), both
// bias tables on block 0 of their stack and shared by its layers, the FFN gated-gelu (v1.1/FLAN)
// or ReLU (original), a head tied to the embedding scaled by d_model^-0.5 (scale_decoder_outputs,
// else tie_word_embeddings) or an untied lm_head, unscaled.
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "layers/attention.h"
#include "layers/config_fields.h"
#include "layers/cross_attention.h"
#include "layers/embedding.h"
#include "layers/gated_mlp.h"
#include "layers/logits_head.h"
#include "layers/mlp.h"
#include "layers/norm.h"
#include "layers/relative_bias.h"
#include "models/architecture_graph.h"

namespace textgen::runtime {
namespace {

constexpr int64_t kMaxLayers = 1024;

// T5's FFN: gated (wi_0, wi_1, wo) or plain (wi, wo).
struct FeedForward {
  std::optional<GatedMlp> gated;
  std::optional<Mlp> plain;

  static StatusOr<FeedForward> load(const WeightLoader& w, const std::string& prefix, bool gated,
                                    Activation act) {
    FeedForward f;
    if (gated) {
      TG_ASSIGN_OR_RETURN(f.gated, GatedMlp::load(w,
                                                  {.gate = prefix + "wi_0.weight",
                                                   .up = prefix + "wi_1.weight",
                                                   .down = prefix + "wo.weight"},
                                                  act));
    } else {
      TG_ASSIGN_OR_RETURN(
          f.plain, Mlp::load(w, {.up = prefix + "wi.weight", .down = prefix + "wo.weight"}, act));
    }
    return f;
  }
  Status forward(const ForwardContext& ctx, void* hs) const {
    return gated ? gated->forward(ctx, hs) : plain->forward(ctx, hs);
  }
};

// q, k, v and o of one attention block
// ("{stack}.block.{i}.layer.{l}.{SelfAttention,EncDecAttention}.").
Attention::Weights attentionNames(const std::string& prefix) {
  return {.layout = QkvLayout::kSeparate,
          .q = prefix + "q.weight",
          .k = prefix + "k.weight",
          .v = prefix + "v.weight",
          .qkv = "",
          .o = prefix + "o.weight"};
}

class T5Graph final : public ArchitectureGraph {
 public:
  explicit T5Graph(const ArchitectureSpec& spec) : spec_(spec) {}

  Status load(const WeightLoader& w) override {
    const ArchitectureSpec::Tensors& t = spec_.tensors;
    const ModelConfig& c = w.config();
    if (w.dtype() == DType::kF16) {
      return unimplementedError(
          "T5ForConditionalGeneration: float16 overflows in T5's feed-forward outputs (its "
          "activations exceed 65504); serve it in bfloat16 (the default) or float32");
    }
    const ConfigFields f(c);
    TG_ASSIGN_OR_RETURN(const int64_t encoderLayers, f.integer("num_layers", 0, kMaxLayers));
    if (encoderLayers < 1) return invalidArgumentError("config.json: 'num_layers' must be >= 1");
    TG_ASSIGN_OR_RETURN(const bool gated, f.boolean("is_gated_act", false));
    TG_ASSIGN_OR_RETURN(const int64_t buckets,
                        f.integer("relative_attention_num_buckets", 32, int64_t{1} << 12));
    TG_ASSIGN_OR_RETURN(const int64_t maxDistance,
                        f.integer("relative_attention_max_distance", 128, int64_t{1} << 24));
    // The head: scaled when scale_decoder_outputs says so, else as tie_word_embeddings (absent:
    // tied), whichever weight it reads (docs/t5.md).
    TG_ASSIGN_OR_RETURN(const bool tiedConfig, f.boolean("tie_word_embeddings", true));
    TG_ASSIGN_OR_RETURN(const bool scaleOutputs, f.boolean("scale_decoder_outputs", tiedConfig));
    const double eps = c.rmsNormEps;

    TG_ASSIGN_OR_RETURN(embedding_, Embedding::load(w, std::string(t.embed)));
    TG_ASSIGN_OR_RETURN(
        const RelativeBias encoderBias,
        RelativeBias::load(w,
                           "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                           buckets, maxDistance, /*bidirectional=*/true));
    TG_ASSIGN_OR_RETURN(
        const RelativeBias decoderBias,
        RelativeBias::load(w,
                           "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                           buckets, maxDistance, /*bidirectional=*/false));
    auto selfOptions = [](const RelativeBias& b, bool causal) {
      return Attention::Options{.rope = false,
                                .scale = 1.0f,
                                .causal = causal,
                                .relativeBias = b.table,
                                .relativeBuckets = b.buckets,
                                .relativeMaxDistance = b.maxDistance,
                                .relativeBidirectional = b.bidirectional};
    };
    encoder_.resize(encoderLayers);
    for (int64_t i = 0; i < encoderLayers; ++i) {
      const std::string p = "encoder.block." + std::to_string(i) + ".layer.";
      EncoderLayer& l = encoder_[i];
      TG_ASSIGN_OR_RETURN(l.selfNorm,
                          Norm::load(w, NormKind::kRms, p + "0.layer_norm.weight", eps));
      TG_ASSIGN_OR_RETURN(l.self, Attention::load(w, attentionNames(p + "0.SelfAttention."),
                                                  selfOptions(encoderBias, false)));
      TG_ASSIGN_OR_RETURN(l.ffnNorm, Norm::load(w, NormKind::kRms, p + "1.layer_norm.weight", eps));
      TG_ASSIGN_OR_RETURN(l.ffn, FeedForward::load(w, p + "1.DenseReluDense.", gated, c.hiddenAct));
    }
    TG_ASSIGN_OR_RETURN(encoderNorm_,
                        Norm::load(w, NormKind::kRms, "encoder.final_layer_norm.weight", eps));
    decoder_.resize(c.numLayers);
    for (int64_t i = 0; i < c.numLayers; ++i) {
      const std::string p = "decoder.block." + std::to_string(i) + ".layer.";
      DecoderLayer& l = decoder_[i];
      TG_ASSIGN_OR_RETURN(l.selfNorm,
                          Norm::load(w, NormKind::kRms, p + "0.layer_norm.weight", eps));
      TG_ASSIGN_OR_RETURN(l.self, Attention::load(w, attentionNames(p + "0.SelfAttention."),
                                                  selfOptions(decoderBias, true)));
      TG_ASSIGN_OR_RETURN(l.crossNorm,
                          Norm::load(w, NormKind::kRms, p + "1.layer_norm.weight", eps));
      const Attention::Weights cross = attentionNames(p + "1.EncDecAttention.");
      TG_ASSIGN_OR_RETURN(l.cross,
                          CrossAttention::load(w, {cross.q, cross.k, cross.v, cross.o}, 1.0f));
      TG_ASSIGN_OR_RETURN(l.ffnNorm, Norm::load(w, NormKind::kRms, p + "2.layer_norm.weight", eps));
      TG_ASSIGN_OR_RETURN(l.ffn, FeedForward::load(w, p + "2.DenseReluDense.", gated, c.hiddenAct));
    }
    const float scale = scaleOutputs
                            ? static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.hiddenSize)))
                            : 1.0f;
    TG_ASSIGN_OR_RETURN(Norm finalNorm, Norm::load(w, NormKind::kRms, std::string(t.finalNorm), eps,
                                                   NormBias::kAbsent, scale));
    // lm_head.weight when the checkpoint has it (FLAN-T5), else the shared embedding.
    const std::string head(t.lmHead);
    TG_ASSIGN_OR_RETURN(head_, LogitsHead::load(w, std::move(finalNorm), head,
                                                /*tied=*/!w.contains(head), embedding_));
    return okStatus();
  }

  Status build(const ForwardContext& ctx) const override {
    // The encoder's self-attention runs over the cache (its scratch keys and values): fp8 codes
    // would round every encoder layer's attention, not only the stored cross keys and values.
    if (ctx.cache.cacheDtype() != kernels::KvCacheDType::kAuto)
      return failedPreconditionError(
          "T5: an fp8 KV cache is not supported (the encoder attends "
          "over the cache); serve it without --kv-cache-dtype");
    if (ctx.encoder != nullptr) TG_RETURN_IF_ERROR(encode(ctx.encoderContext()));
    void* x = ctx.ws.residual->data();  // [rows, hidden]: the residual stream
    void* hs = ctx.ws.hidden->data();   // [rows, hidden]: each sublayer's input and output
    TG_RETURN_IF_ERROR(embedding_.forward(ctx, x));
    for (size_t i = 0; i < decoder_.size(); ++i) {
      const DecoderLayer& l = decoder_[i];
      const auto layer = static_cast<int64_t>(i);
      TG_RETURN_IF_ERROR(
          l.selfNorm.forwardReduced(ctx, i == 0 ? x : hs, i == 0 ? nullptr : x, hs, ctx.rows()));
      TG_RETURN_IF_ERROR(l.self.forward(ctx, layer, hs));
      TG_RETURN_IF_ERROR(l.crossNorm.forwardReduced(ctx, hs, x, hs, ctx.rows()));
      TG_RETURN_IF_ERROR(l.cross.forward(ctx, layer, hs));
      TG_RETURN_IF_ERROR(l.ffnNorm.forwardReduced(ctx, hs, x, hs, ctx.rows()));
      TG_RETURN_IF_ERROR(l.ffn.forward(ctx, hs));
    }
    return head_.forward(ctx, hs, x);
  }

 private:
  struct EncoderLayer {
    Norm selfNorm;
    Attention self;
    Norm ffnNorm;
    FeedForward ffn;
  };
  struct DecoderLayer {
    Norm selfNorm;
    Attention self;
    Norm crossNorm;
    CrossAttention cross;
    Norm ffnNorm;
    FeedForward ffn;
  };

  // The encoder over the starting sequences' prompts (`enc`: their rows). Its self-attention keeps
  // each layer's keys and values in cache layer 0 of the sequences' cross blocks, which the cross
  // keys and values of every decoder layer then replace.
  Status encode(const ForwardContext& enc) const {
    void* x = enc.ws.residual->data();
    void* hs = enc.ws.hidden->data();
    TG_RETURN_IF_ERROR(embedding_.forward(enc, x));
    for (size_t i = 0; i < encoder_.size(); ++i) {
      const EncoderLayer& l = encoder_[i];
      TG_RETURN_IF_ERROR(
          l.selfNorm.forwardReduced(enc, i == 0 ? x : hs, i == 0 ? nullptr : x, hs, enc.rows()));
      TG_RETURN_IF_ERROR(l.self.forward(enc, /*layer=*/0, hs));
      TG_RETURN_IF_ERROR(l.ffnNorm.forwardReduced(enc, hs, x, hs, enc.rows()));
      TG_RETURN_IF_ERROR(l.ffn.forward(enc, hs));
    }
    TG_RETURN_IF_ERROR(encoderNorm_.forwardReduced(enc, hs, x, hs, enc.rows()));
    for (size_t i = 0; i < decoder_.size(); ++i)
      TG_RETURN_IF_ERROR(decoder_[i].cross.writeKeysValues(enc, static_cast<int64_t>(i), hs));
    return okStatus();
  }

  ArchitectureSpec spec_;
  Embedding embedding_;
  std::vector<EncoderLayer> encoder_;
  Norm encoderNorm_;
  std::vector<DecoderLayer> decoder_;
  LogitsHead head_;
};

}  // namespace

// T5's config.json in canonical keys: the decoder's depth as num_hidden_layers (its layers keep
// the KV cache), feed_forward_proj as hidden_act and is_gated_act (transformers' T5Config:
// "gated-X" is gated with activation X, "gated-gelu" means gelu_new; absent means "relu"),
// n_positions as the context (512 when absent), always an encoder-decoder.
Status prepareT5Config(nlohmann::json& j) {
  auto integer = [&](const char* key) -> StatusOr<std::optional<int64_t>> {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return std::optional<int64_t>();
    if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > kMaxLayers)
      return invalidArgumentError("config.json: '" + std::string(key) +
                                  "' must be an integer in [1, " + std::to_string(kMaxLayers) +
                                  "]");
    return std::optional<int64_t>(it->get<int64_t>());
  };
  TG_ASSIGN_OR_RETURN(const std::optional<int64_t> encoderLayers, integer("num_layers"));
  if (!encoderLayers) return invalidArgumentError("config.json: 'num_layers' is missing");
  TG_ASSIGN_OR_RETURN(const std::optional<int64_t> decoderLayers, integer("num_decoder_layers"));
  j["num_hidden_layers"] = decoderLayers.value_or(*encoderLayers);
  std::string proj = "relu";
  if (auto it = j.find("feed_forward_proj"); it != j.end() && !it->is_null()) {
    if (!it->is_string())
      return invalidArgumentError("config.json: 'feed_forward_proj' must be a string");
    proj = it->get<std::string>();
  }
  const bool gated = proj.rfind("gated-", 0) == 0;
  std::string act = gated ? proj.substr(6) : proj;
  if (act.empty() || act.find('-') != std::string::npos) {
    return invalidArgumentError("config.json: 'feed_forward_proj' '" + proj.substr(0, 64) +
                                "' is not of the form 'ACT' or 'gated-ACT'");
  }
  if (proj == "gated-gelu") act = "gelu_new";
  j["hidden_act"] = act;
  j["is_gated_act"] = gated;
  if (!j.contains("max_position_embeddings") || j["max_position_embeddings"].is_null())
    j["max_position_embeddings"] = 512;
  return okStatus();
}

StatusOr<std::unique_ptr<ArchitectureGraph>> makeT5Graph(const ArchitectureSpec& spec) {
  constexpr std::string_view g = "t5";
  TG_RETURN_IF_ERROR(requireValue(spec, g, "norm", spec.norm, {NormKind::kRms}));
  TG_RETURN_IF_ERROR(requireValue(spec, g, "position", spec.position, {PositionKind::kRelative}));
  TG_RETURN_IF_ERROR(requireValue(spec, g, "parallelResidual", spec.parallelResidual, {false}));
  return std::unique_ptr<ArchitectureGraph>(std::make_unique<T5Graph>(spec));
}

}  // namespace textgen::runtime
