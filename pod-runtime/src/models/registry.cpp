// The only list of architectures: one line each, a spec (architecture_spec.h; unnamed values are
// Llama's) and the graph that builds it (one file each).
#include "models/registry.h"

#include <nlohmann/json_fwd.hpp>

#include "models/model_runner.h"

namespace textgen::runtime {

StatusOr<std::unique_ptr<ArchitectureGraph>> makeLlamaGraph(const ArchitectureSpec& spec);
StatusOr<std::unique_ptr<ArchitectureGraph>> makeOptGraph(const ArchitectureSpec& spec);
Status prepareOptConfig(nlohmann::json& config);
// models/gpt_neox.cpp, models/gpt_bigcode.cpp: their specs (tensor tables) beside their graphs.
ArchitectureSpec gptNeoxSpec();
StatusOr<std::unique_ptr<ArchitectureGraph>> makeGptNeoxGraph(const ArchitectureSpec& spec);
ArchitectureSpec gptBigcodeSpec();
StatusOr<std::unique_ptr<ArchitectureGraph>> makeGptBigcodeGraph(const ArchitectureSpec& spec);
StatusOr<std::unique_ptr<ArchitectureGraph>> makeBloomGraph(const ArchitectureSpec& spec);
Status prepareBloomConfig(nlohmann::json& config);
StatusOr<std::unique_ptr<ArchitectureGraph>> makeMptGraph(const ArchitectureSpec& spec);
Status prepareMptConfig(nlohmann::json& config);
StatusOr<std::unique_ptr<ArchitectureGraph>> makeFalconGraph(const ArchitectureSpec& spec);
ArchitectureSpec falconSpec(std::string_view name);  // models/falcon.cpp
StatusOr<std::unique_ptr<ArchitectureGraph>> makeT5Graph(const ArchitectureSpec& spec);
Status prepareT5Config(nlohmann::json& config);

namespace {

constexpr ConfigKeyAlias kOptAliases[] = {{"ffn_dim", "intermediate_size"},
                                          {"activation_function", "hidden_act"}};

// BLOOM (models/bloom.cpp; checkpoints without the "transformer." prefix are read too).
constexpr ConfigKeyAlias kBloomKeys[] = {{"n_layer", "num_hidden_layers"},
                                         {"n_head", "num_attention_heads"}};
constexpr ArchitectureSpec::Tensors kBloomTensors = {
    .embed = "transformer.word_embeddings.weight",
    .finalNorm = "transformer.ln_f.weight",
    .inputNorm = "transformer.h.{}.input_layernorm.weight",
    .q = "",
    .k = "",
    .v = "",
    .qkv = "transformer.h.{}.self_attention.query_key_value.weight",
    .o = "transformer.h.{}.self_attention.dense.weight",
    .postNorm = "transformer.h.{}.post_attention_layernorm.weight",
    .gate = "",
    .up = "transformer.h.{}.mlp.dense_h_to_4h.weight",
    .down = "transformer.h.{}.mlp.dense_4h_to_h.weight"};

// MPT (models/mpt.cpp).
constexpr ConfigKeyAlias kMptKeys[] = {{"d_model", "hidden_size"},
                                       {"n_heads", "num_attention_heads"},
                                       {"n_layers", "num_hidden_layers"},
                                       {"max_seq_len", "max_position_embeddings"}};
constexpr ArchitectureSpec::Tensors kMptTensors = {
    .embed = "transformer.wte.weight",
    .finalNorm = "transformer.norm_f.weight",
    .inputNorm = "transformer.blocks.{}.norm_1.weight",
    .q = "",
    .k = "",
    .v = "",
    .qkv = "transformer.blocks.{}.attn.Wqkv.weight",
    .o = "transformer.blocks.{}.attn.out_proj.weight",
    .postNorm = "transformer.blocks.{}.norm_2.weight",
    .gate = "",
    .up = "transformer.blocks.{}.ffn.up_proj.weight",
    .down = "transformer.blocks.{}.ffn.down_proj.weight"};

// T5 (models/t5.cpp; the graph names the encoder's and decoder's block tensors itself).
constexpr ConfigKeyAlias kT5Keys[] = {{"d_model", "hidden_size"},
                                      {"num_heads", "num_attention_heads"},
                                      {"d_ff", "intermediate_size"},
                                      {"d_kv", "head_dim"},
                                      {"layer_norm_epsilon", "rms_norm_eps"},
                                      {"n_positions", "max_position_embeddings"}};
constexpr ArchitectureSpec::Tensors kT5Tensors = {.embed = "shared.weight",
                                                  .finalNorm = "decoder.final_layer_norm.weight",
                                                  .lmHead = "lm_head.weight",
                                                  .inputNorm = "",
                                                  .q = "",
                                                  .k = "",
                                                  .v = "",
                                                  .o = "",
                                                  .postNorm = "",
                                                  .gate = "",
                                                  .up = "",
                                                  .down = ""};

const Architecture kArchitectures[] = {
    {{.name = "LlamaForCausalLM"}, makeLlamaGraph},
    {{.name = "MistralForCausalLM", .slidingWindow = true}, makeLlamaGraph},
    {{.name = "OPTForCausalLM",
      .tensors = {.embed = "model.decoder.embed_tokens.weight",
                  .positionEmbed = "model.decoder.embed_positions.weight",
                  .finalNorm = "model.decoder.final_layer_norm.weight",
                  .inputNorm = "model.decoder.layers.{}.self_attn_layer_norm.weight",
                  .q = "model.decoder.layers.{}.self_attn.q_proj.weight",
                  .k = "model.decoder.layers.{}.self_attn.k_proj.weight",
                  .v = "model.decoder.layers.{}.self_attn.v_proj.weight",
                  .o = "model.decoder.layers.{}.self_attn.out_proj.weight",
                  .postNorm = "model.decoder.layers.{}.final_layer_norm.weight",
                  .gate = "",
                  .up = "model.decoder.layers.{}.fc1.weight",
                  .down = "model.decoder.layers.{}.fc2.weight"},
      .norm = NormKind::kLayer,
      .activation = Activation::kRelu,
      .gatedMlp = false,
      .position = PositionKind::kLearned,
      .configKeyAliases = kOptAliases,
      .prepareConfig = prepareOptConfig},
     makeOptGraph},
    {gptNeoxSpec(), makeGptNeoxGraph},
    {gptBigcodeSpec(), makeGptBigcodeGraph},
    {{.name = "BloomForCausalLM",
      .tensors = kBloomTensors,
      .norm = NormKind::kLayer,
      .activation = Activation::kGeluTanh,
      .gatedMlp = false,
      .position = PositionKind::kAlibi,
      .qkvLayout = QkvLayout::kFusedInterleavedPerHead,
      .attentionBias = true,
      .mlpBias = true,
      .configKeyAliases = kBloomKeys,
      .prepareConfig = prepareBloomConfig},
     makeBloomGraph},
    {{.name = "MptForCausalLM",
      .tensors = kMptTensors,
      .norm = NormKind::kLayer,
      .activation = Activation::kGelu,
      .gatedMlp = false,
      .position = PositionKind::kAlibi,
      .qkvLayout = QkvLayout::kFused,
      .configKeyAliases = kMptKeys,
      .prepareConfig = prepareMptConfig},
     makeMptGraph},
    {falconSpec("FalconForCausalLM"), makeFalconGraph},
    {falconSpec("RWForCausalLM"), makeFalconGraph},  // Falcon's remote-code configs, as TGI
    {{.name = "T5ForConditionalGeneration",
      .tensors = kT5Tensors,
      .activation = Activation::kRelu,
      .position = PositionKind::kRelative,
      .configKeyAliases = kT5Keys,
      .prepareConfig = prepareT5Config,
      .encoderDecoder = true},
     makeT5Graph},
};

}  // namespace

std::span<const Architecture> architectures() {
  return kArchitectures;
}

const Architecture* findArchitecture(std::string_view name) {
  for (const Architecture& a : kArchitectures) {
    if (a.spec.name == name) return &a;
  }
  return nullptr;
}

StatusOr<ConfigDialect> registeredDialect(std::string_view name) {
  const Architecture* architecture = findArchitecture(name);
  if (architecture != nullptr) return configDialect(architecture->spec);
  std::string supported;
  for (const Architecture& a : kArchitectures)
    supported += (supported.empty() ? "" : ", ") + std::string(a.spec.name);
  return unimplementedError("config.json: architecture '" + std::string(name) +
                            "' is not supported (supported: " + supported + ")");
}

StatusOr<std::unique_ptr<Model>> loadArchitecture(const Architecture& architecture,
                                                  const ModelConfig& config,
                                                  const WeightStore& weights, Backend& backend,
                                                  const ModelOptions& options) {
  TG_ASSIGN_OR_RETURN(auto graph, architecture.makeGraph(architecture.spec));
  return ModelRunner::load(config, std::move(graph), weights, backend, options);
}

StatusOr<ModelConfig> loadArchitectureConfig(const std::string& modelDir) {
  return loadModelConfig(modelDir, registeredDialect);
}

StatusOr<std::unique_ptr<Model>> loadModel(const std::string& modelDir, Backend& backend,
                                           const ModelOptions& options) {
  // The class is resolved first: config.json is parsed as that class spells it.
  TG_ASSIGN_OR_RETURN(ModelConfig config, loadArchitectureConfig(modelDir));
  const Architecture* architecture = findArchitecture(config.architecture);
  if (architecture == nullptr) return internalError("registered class not found");
  TG_ASSIGN_OR_RETURN(auto weights, WeightStore::open(modelDir));
  return loadArchitecture(*architecture, config, *weights, backend, options);
}

}  // namespace textgen::runtime
