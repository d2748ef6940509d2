// An architecture as data (llama.cpp's tensor-name tables, Hugging Face's config classes): the
// tensor names of a Hugging Face class and the typed variants its graph must build. The graph
// implementing it says which values it builds; the loader refuses any other, naming it
// (requireValue below), so a spec never silently runs as something else.
#pragma once

#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

#include "layers/activation.h"
#include "layers/attention.h"
#include "layers/norm.h"
#include "layers/positions.h"
#include "textgen/base/status.h"
#include "textgen/runtime/model_config.h"

namespace textgen::runtime {

struct ArchitectureSpec {
  // Tensor names; "{}" stands for the layer index. The defaults are Hugging Face's Llama names,
  // which most decoder classes share. An empty name: the architecture has no such tensor.
  struct Tensors {
    std::string_view embed = "model.embed_tokens.weight";
    std::string_view positionEmbed = "";  // PositionKind::kLearned
    std::string_view finalNorm = "model.norm.weight";
    std::string_view lmHead = "lm_head.weight";  // optional when the embeddings are tied
    std::string_view inputNorm = "model.layers.{}.input_layernorm.weight";
    std::string_view q = "model.layers.{}.self_attn.q_proj.weight";  // QkvLayout::kSeparate
    std::string_view k = "model.layers.{}.self_attn.k_proj.weight";
    std::string_view v = "model.layers.{}.self_attn.v_proj.weight";
    std::string_view qkv = "";  // the fused QkvLayouts
    std::string_view o = "model.layers.{}.self_attn.o_proj.weight";
    std::string_view postNorm = "model.layers.{}.post_attention_layernorm.weight";
    std::string_view gate = "model.layers.{}.mlp.gate_proj.weight";  // gated MLPs only
    std::string_view up = "model.layers.{}.mlp.up_proj.weight";
    std::string_view down = "model.layers.{}.mlp.down_proj.weight";
  };
  // A config.json key this class spells differently (GPT-2's n_head for num_attention_heads).
  using ConfigKeyAlias = runtime::ConfigKeyAlias;

  std::string_view name = "";  // config.json "architectures"[0]
  Tensors tensors = {};
  NormKind norm = NormKind::kRms;
  // The MLP's activation when config.json has no hidden_act (the class's default); the graph
  // builds config.json's hidden_act (ModelConfig::hiddenAct).
  Activation activation = Activation::kSilu;
  bool gatedMlp = true;           // act(gate) * up, else act(up)
  bool parallelResidual = false;  // x + attn(norm(x)) + mlp(norm(x)) (GPT-J, NeoX, Falcon)
  PositionKind position = PositionKind::kRope;
  QkvLayout qkvLayout = QkvLayout::kSeparate;
  // q/k/v and o carry biases whatever config.json says; false: as config.json's attention_bias
  // says (Llama). (Qwen2's o_proj has none: it will need a q/k/v-only flag.)
  bool attentionBias = false;
  bool mlpBias = false;  // gate/up/down carry biases; false: as config.json's mlp_bias says
  // The head is always the embedding (no lm_head tensor); false: lm_head, or the embedding when
  // config.json's tie_word_embeddings says so.
  bool tiedEmbeddings = false;
  bool slidingWindow = false;  // honour config.json's sliding_window (Mistral)
  // Applied by the config parser (configDialect below): the canonical key is read under the alias.
  std::span<const ConfigKeyAlias> configKeyAliases = {};
  // Then this rewrites the class's config.json into canonical keys (ConfigDialect::prepare); the
  // graph file defines it. Null: the keys are Llama's already.
  Status (*prepareConfig)(nlohmann::json& config) = nullptr;
  // An encoder-decoder class (T5): ModelConfig::isEncoderDecoder, and its graph runs the encoder.
  bool encoderDecoder = false;
};

// How the spec's class spells config.json, for parseModelConfig.
inline ConfigDialect configDialect(const ArchitectureSpec& spec) {
  return {.aliases = spec.configKeyAliases,
          .defaultActivation = spec.activation,
          .prepare = spec.prepareConfig,
          .encoderDecoder = spec.encoderDecoder,
          .learnedPositions = spec.position == PositionKind::kLearned};
}

// A tensor name for one layer.
inline std::string layerName(std::string_view pattern, int64_t layer) {
  std::string s(pattern);
  const size_t at = s.find("{}");
  if (at != std::string::npos) s.replace(at, 2, std::to_string(layer));
  return s;
}

constexpr std::string_view toString(bool b) {
  return b ? "true" : "false";
}

// OK when `value` (the spec's `field`) is one of the values `graph` builds, else UNIMPLEMENTED:
// "MistralForCausalLM: norm 'layer' is not implemented by the llama graph (it builds: rms)".
template <typename T>
Status requireValue(const ArchitectureSpec& spec, std::string_view graph, std::string_view field,
                    T value, std::initializer_list<T> built) {
  std::string list;
  for (T b : built) {
    if (b == value) return okStatus();
    list += (list.empty() ? "" : ", ") + std::string(toString(b));
  }
  return unimplementedError(std::string(spec.name) + ": " + std::string(field) + " '" +
                            std::string(toString(value)) + "' is not implemented by the " +
                            std::string(graph) + " graph (it builds: " + list + ")");
}

}  // namespace textgen::runtime
