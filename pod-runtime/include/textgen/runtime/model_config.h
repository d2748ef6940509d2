// config.json (and generation_config.json) as typed hyper-parameters. Parsed once at start-up, as
// the checkpoint's class spells it (its ConfigDialect, from the architecture registry); a missing
// or invalid field, or an unsupported architecture, is an error that names it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "textgen/base/status_or.h"
#include "textgen/kernels/activation.h"
#include "textgen/kernels/dtype.h"
#include "textgen/runtime/quantization_config.h"

namespace textgen::runtime {

enum class RopeType { kDefault, kLinear, kDynamic, kLlama3, kYarn };

struct RopeConfig {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  double factor = 1.0;               // the scaling factor of every variant but the default
  double partialRotaryFactor = 1.0;  // fraction of head_dim that is rotated
  // llama3 and yarn: the context the model was pre-trained with.
  int64_t originalMaxPositionEmbeddings = 0;
  double lowFreqFactor = 1.0, highFreqFactor = 4.0;  // llama3
  double betaFast = 32.0, betaSlow = 1.0;            // yarn: the correction range's rotations
  bool truncate = true;                              // yarn: round the correction range outward
  double attentionFactor = 1.0;  // multiplies cos and sin (yarn's, resolved when parsed)
};

// A config.json key a class spells differently (GPT-2's "n_head" for "num_attention_heads"): the
// canonical key is read under `key` when config.json has no canonical one; both present and
// different is an error naming both.
struct ConfigKeyAlias {
  std::string_view key, canonical;
};

// What a Hugging Face config class changes in config.json (its ArchitectureSpec's, models/).
struct ConfigDialect {
  std::span<const ConfigKeyAlias> aliases = {};
  kernels::Activation defaultActivation = kernels::Activation::kSilu;  // hidden_act when absent
  // Rewrites the class's own config.json (after the aliases) into the canonical keys the generic
  // fields are read from (intermediate_size, num_key_value_heads, rms_norm_eps as the norm's
  // epsilon whatever the norm, rope_parameters, ...); an error names the field. Null: nothing to
  // rewrite.
  Status (*prepare)(nlohmann::json& config) = nullptr;
  // The class is an encoder-decoder (T5): only then is config.json's is_encoder_decoder honoured
  // (a decoder-only class that claims it is refused: its graph has no encoder).
  bool encoderDecoder = false;
  // Positions index a learned table (OPT, GPTBigCode): ModelConfig::learnedPositions.
  bool learnedPositions = false;
};

// The dialect of config.json's class, given its name ("architectures"[0]); an error refuses the
// class.
using ConfigDialectLookup = std::function<StatusOr<ConfigDialect>(std::string_view architecture)>;

struct ModelConfig {
  std::string architecture;  // e.g. "LlamaForCausalLM"
  std::string modelType;     // e.g. "llama"
  int64_t vocabSize = 0;
  int64_t hiddenSize = 0;
  int64_t intermediateSize = 0;
  int64_t numLayers = 0;
  int64_t numHeads = 0;
  int64_t numKvHeads = 0;
  int64_t headDim = 0;
  int64_t maxPositionEmbeddings = 0;
  double rmsNormEps = 1e-6;
  RopeConfig rope;
  bool tieWordEmbeddings = false;
  bool attentionBias = false;  // q, k, v and o have biases (Llama's attention_bias)
  bool mlpBias = false;        // gate, up and down have biases (Llama's mlp_bias)
  // The MLP's activation: hidden_act ("silu"/"swish", "gelu", "gelu_pytorch_tanh"/"gelu_new"/
  // "gelu_fast", "relu"), the dialect's default when absent.
  kernels::Activation hiddenAct = kernels::Activation::kSilu;
  std::optional<int64_t> slidingWindow;  // attend to this many most recent positions (Mistral)
  kernels::DType dtype = kernels::DType::kF32;  // the checkpoint's torch dtype
  std::optional<uint32_t> bosTokenId;
  std::vector<uint32_t> eosTokenIds;  // config.json and generation_config.json, merged
  // Encoder-decoder models (T5: the class's dialect says so): the prompt is the encoder's
  // input, the decoder starts from decoderStartTokenId (generation_config.json's, else
  // config.json's, else pad_token_id, else 0) and numLayers counts the decoder's layers (those
  // that keep a KV cache).
  bool isEncoderDecoder = false;
  // Positions index a learned table of maxContext() rows: no request may run past it (rotary and
  // ALiBi positions have no such end).
  bool learnedPositions = false;
  uint32_t decoderStartTokenId = 0;
  // A pre-quantized checkpoint's format (quantization_config; kNone for a dense checkpoint).
  QuantizationConfig quantization;
  // config.json as parsed (aliases applied, the dialect's prepare run), for the fields only one
  // family reads (layers/config_fields.h reads them with errors that name them).
  std::shared_ptr<const nlohmann::json> json;

  int64_t rotaryDim() const { return static_cast<int64_t>(headDim * rope.partialRotaryFactor); }
  // Longest prompt + generation the model allows: linear and dynamic scaling stretch the trained
  // context by their factor (as TGI counts it); llama3 and yarn configs give the stretched one as
  // max_position_embeddings already.
  int64_t maxContext() const {
    const bool stretches = rope.type == RopeType::kLinear || rope.type == RopeType::kDynamic;
    return static_cast<int64_t>(static_cast<double>(maxPositionEmbeddings) *
                                (stretches ? rope.factor : 1.0));
  }
};

// `generationConfigJson` may be empty. Without `dialectOf`, every class is read with the canonical
// keys (Hugging Face's LlamaConfig names) and SiLU as the default activation.
StatusOr<ModelConfig> parseModelConfig(std::string_view configJson,
                                       std::string_view generationConfigJson = {},
                                       const ConfigDialectLookup& dialectOf = {});

// Reads DIR/config.json and DIR/generation_config.json (optional). The architecture registry's
// loadArchitectureConfig (textgen/runtime/model.h) passes its dialects.
StatusOr<ModelConfig> loadModelConfig(const std::string& modelDir,
                                      const ConfigDialectLookup& dialectOf = {});

// Text Generation Inference's Medusa directory (layers/medusa.h): config.json with
// medusa_num_heads, medusa_num_layers and base_model_name_or_path beside
// medusa_lm_head.safetensors.
struct MedusaConfig {
  int64_t heads = 0, layers = 0;
  std::string baseModel;  // the base model's directory, resolved
};
// Limits on a Medusa directory's config (TGI's checkpoints have 2 to 5 heads of 1 layer).
inline constexpr int64_t kMaxMedusaHeads = 64, kMaxMedusaLayers = 16;

// A config.json's Medusa fields (baseModel as written): nullopt without medusa_num_heads,
// INVALID_ARGUMENT naming a bad field.
StatusOr<std::optional<MedusaConfig>> parseMedusaConfig(std::string_view configJson);
// nullopt when DIR/config.json has no medusa_num_heads (a model, not Medusa heads).
// INVALID_ARGUMENT naming a bad field; NOT_FOUND when the weights are missing or the base model is
// not a local directory: `baseDir` when given (the launcher resolves a hub id in the hub cache),
// else base_model_name_or_path, absolute or relative to DIR (nothing is downloaded here).
StatusOr<std::optional<MedusaConfig>> readMedusaConfig(const std::string& dir,
                                                       const std::string& baseDir = {});

}  // namespace textgen::runtime
