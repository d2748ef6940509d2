#include "textgen/runtime/model_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "textgen/base/file.h"
#include "textgen/base/json.h"

namespace textgen::runtime {
namespace {

using nlohmann::json;

Status fieldError(std::string_view field, std::string_view what) {
  return invalidArgumentError("config.json: '" + std::string(field) + "' " + std::string(what));
}

// Upper bounds on the hyper-parameters, far above every released model (Llama 3.1 405B: 126
// layers, 128 heads, hidden 16384, intermediate 53248; vocabularies reach 262144; contexts 10M), so
// that an absurd config.json is an error naming the field rather than an allocation that fails.
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxHeads = 1024;
constexpr int64_t kMaxHeadDim = 1024;
constexpr int64_t kMaxHiddenSize = int64_t{1} << 17;
constexpr int64_t kMaxIntermediateSize = int64_t{1} << 20;
constexpr int64_t kMaxVocabSize = int64_t{1} << 24;
constexpr int64_t kMaxPositions = int64_t{1} << 24;
constexpr double kMaxRopeFactor = 1024.0;

// A positive integer no larger than `max`: missing gives `fallback` (an error when there is none).
StatusOr<int64_t> boundedInt(const json& j, const std::string& key, int64_t max,
                             std::optional<int64_t> fallback = std::nullopt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (fallback) return *fallback;
    return fieldError(key, "is missing");
  }
  if (!it->is_number_integer() ||
      (it->is_number_unsigned() ? it->get<uint64_t>() == 0 : it->get<int64_t>() <= 0)) {
    return fieldError(key, "must be a positive integer");
  }
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(max))
    return fieldError(key, "is " + it->dump() + ", more than the limit " + std::to_string(max));
  return it->get<int64_t>();
}

StatusOr<int64_t> positiveInt(const json& j, const char* key,
                              std::optional<int64_t> fallback = std::nullopt) {
  return boundedInt(j, key, kMaxPositions, fallback);
}

StatusOr<std::string> string(const json& j, const char* key, const char* fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::string(fallback);
  if (!it->is_string()) return fieldError(key, "must be a string");
  return it->get<std::string>();
}

StatusOr<double> positiveNumber(const json& j, const char* key, double fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number() || it->get<double>() <= 0)
    return fieldError(key, "must be a positive number");
  return it->get<double>();
}

// An optional token id below `vocab` (absent or null: none).
StatusOr<std::optional<uint32_t>> tokenId(const json& j, const char* key, int64_t vocab) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::optional<uint32_t>();
  if (!it->is_number_unsigned() || it->get<uint64_t>() >= static_cast<uint64_t>(vocab))
    return fieldError(key, "must be a token id below vocab_size (" + std::to_string(vocab) + ")");
  return std::optional<uint32_t>(it->get<uint32_t>());
}

StatusOr<bool> boolean(const json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return fieldError(key, "must be true or false");
  return it->get<bool>();
}

Status addTokenIds(const json& j, const char* key, std::vector<uint32_t>& out, const char* file) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return okStatus();
  auto add = [&](const json& v) -> Status {
    if (!v.is_number_unsigned() || v.get<uint64_t>() > UINT32_MAX) {
      return invalidArgumentError(std::string(file) + ": '" + key + "' must be token ids");
    }
    const auto id = v.get<uint32_t>();
    if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
    return okStatus();
  };
  if (it->is_array()) {
    for (const json& v : *it) TG_RETURN_IF_ERROR(add(v));
    return okStatus();
  }
  return add(*it);
}

// yarn's attention factor when the config gives none: 0.1 * mscale * ln(factor) + 1 (1 below 1).
double yarnMscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// The llama3 and yarn fields (transformers' names and defaults; maxPositions is the config's
// max_position_embeddings).
Status parseRopeExtension(const json& r, const std::string& key, int64_t maxPositions,
                          RopeConfig& rope) {
  auto need = [&](const char* field) -> Status {
    if (!r.contains(field) || r[field].is_null())
      return fieldError(key + "." + field,
                        "is missing (rope_type " +
                            std::string(rope.type == RopeType::kYarn ? "yarn" : "llama3") + ")");
    return okStatus();
  };
  if (rope.type == RopeType::kLlama3) {
    for (const char* f :
         {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
      TG_RETURN_IF_ERROR(need(f));
    TG_ASSIGN_OR_RETURN(rope.factor, positiveNumber(r, "factor", 1.0));
    TG_ASSIGN_OR_RETURN(rope.lowFreqFactor, positiveNumber(r, "low_freq_factor", 1.0));
    TG_ASSIGN_OR_RETURN(rope.highFreqFactor, positiveNumber(r, "high_freq_factor", 4.0));
    TG_ASSIGN_OR_RETURN(rope.originalMaxPositionEmbeddings,
                        positiveInt(r, "original_max_position_embeddings"));
    if (rope.highFreqFactor <= rope.lowFreqFactor)
      return fieldError(key + ".high_freq_factor", "must be greater than low_freq_factor");
    return okStatus();
  }
  TG_ASSIGN_OR_RETURN(rope.originalMaxPositionEmbeddings,
                      positiveInt(r, "original_max_position_embeddings", maxPositions));
  // transformers derives a missing factor from the two contexts.
  TG_ASSIGN_OR_RETURN(rope.factor,
                      positiveNumber(r, "factor",
                                     static_cast<double>(maxPositions) /
                                         static_cast<double>(rope.originalMaxPositionEmbeddings)));
  TG_ASSIGN_OR_RETURN(rope.betaFast, positiveNumber(r, "beta_fast", 32.0));
  TG_ASSIGN_OR_RETURN(rope.betaSlow, positiveNumber(r, "beta_slow", 1.0));
  TG_ASSIGN_OR_RETURN(rope.truncate, boolean(r, "truncate", true));
  // mscale and mscale_all_dim (DeepSeek's): used when both are non-zero, as transformers does.
  double mscales[2] = {0.0, 0.0};
  const char* mscaleKeys[2] = {"mscale", "mscale_all_dim"};
  for (int i = 0; i < 2; ++i) {
    auto m = r.find(mscaleKeys[i]);
    if (m == r.end() || m->is_null()) continue;
    if (!m->is_number() || m->get<double>() < 0)
      return fieldError(key + "." + mscaleKeys[i], "must be a non-negative number");
    mscales[i] = m->get<double>();
  }
  const double derived =
      mscales[0] != 0.0 && mscales[1] != 0.0
          ? yarnMscale(rope.factor, mscales[0]) / yarnMscale(rope.factor, mscales[1])
          : yarnMscale(rope.factor, 1.0);
  TG_ASSIGN_OR_RETURN(rope.attentionFactor, positiveNumber(r, "attention_factor", derived));
  return okStatus();
}

// rope_scaling (transformers 4: {"type"|"rope_type", "factor", ...} beside a top-level rope_theta)
// or rope_parameters (transformers 5: the same with "rope_theta" and "partial_rotary_factor").
StatusOr<RopeConfig> parseRope(const json& j, int64_t maxPositions) {
  RopeConfig rope;
  TG_ASSIGN_OR_RETURN(rope.theta, positiveNumber(j, "rope_theta", 10000.0));
  TG_ASSIGN_OR_RETURN(rope.partialRotaryFactor, positiveNumber(j, "partial_rotary_factor", 1.0));
  // Checked here too: without a rope_parameters/rope_scaling object the function returns below.
  if (rope.partialRotaryFactor > 1.0)
    return fieldError("partial_rotary_factor", "must be at most 1");
  const std::string key = j.contains("rope_parameters") && !j["rope_parameters"].is_null()
                              ? "rope_parameters"
                              : "rope_scaling";
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return rope;
  if (!it->is_object()) return fieldError(key, "must be an object");
  const json& r = *it;
  TG_ASSIGN_OR_RETURN(rope.theta, positiveNumber(r, "rope_theta", rope.theta));
  TG_ASSIGN_OR_RETURN(rope.partialRotaryFactor,
                      positiveNumber(r, "partial_rotary_factor", rope.partialRotaryFactor));
  std::string type = "default";
  for (const char* k : {"rope_type", "type"}) {
    auto t = r.find(k);
    if (t == r.end() || t->is_null()) continue;
    if (!t->is_string()) return fieldError(key + "." + k, "must be a string");
    type = t->get<std::string>();
    break;
  }
  if (type == "default") {
    rope.type = RopeType::kDefault;
  } else if (type == "linear" || type == "dynamic") {
    rope.type = type == "linear" ? RopeType::kLinear : RopeType::kDynamic;
    if (!r.contains("factor")) return fieldError(key + ".factor", "is missing");
    TG_ASSIGN_OR_RETURN(rope.factor, positiveNumber(r, "factor", 1.0));
  } else if (type == "llama3" || type == "yarn") {
    rope.type = type == "llama3" ? RopeType::kLlama3 : RopeType::kYarn;
    TG_RETURN_IF_ERROR(parseRopeExtension(r, key, maxPositions, rope));
  } else {
    return fieldError(key + ".rope_type",
                      "'" + type + "' is not supported (default, linear, dynamic, llama3, yarn)");
  }
  if (rope.partialRotaryFactor > 1.0)
    return fieldError("partial_rotary_factor", "must be at most 1");
  if (rope.factor > kMaxRopeFactor)
    return fieldError(key + ".factor", "must be at most " + std::to_string(kMaxRopeFactor));
  return rope;
}

// The layer, head and width fields, each bounded and consistent with the others.
Status parseSizes(const json& j, ModelConfig& c) {
  TG_ASSIGN_OR_RETURN(c.vocabSize, boundedInt(j, "vocab_size", kMaxVocabSize));
  TG_ASSIGN_OR_RETURN(c.hiddenSize, boundedInt(j, "hidden_size", kMaxHiddenSize));
  TG_ASSIGN_OR_RETURN(c.intermediateSize, boundedInt(j, "intermediate_size", kMaxIntermediateSize));
  TG_ASSIGN_OR_RETURN(c.numLayers, boundedInt(j, "num_hidden_layers", kMaxLayers));
  TG_ASSIGN_OR_RETURN(c.numHeads, boundedInt(j, "num_attention_heads", kMaxHeads));
  TG_ASSIGN_OR_RETURN(c.numKvHeads, boundedInt(j, "num_key_value_heads", kMaxHeads, c.numHeads));
  if (c.numKvHeads > c.numHeads || c.numHeads % c.numKvHeads != 0) {
    return fieldError("num_key_value_heads", "must divide num_attention_heads");
  }
  const bool hasHeadDim = j.contains("head_dim") && !j["head_dim"].is_null();
  if (c.hiddenSize % c.numHeads != 0 && !hasHeadDim) {
    return fieldError("hidden_size",
                      "must be a multiple of num_attention_heads (or give head_dim)");
  }
  TG_ASSIGN_OR_RETURN(c.headDim, boundedInt(j, "head_dim", kMaxHeadDim, c.hiddenSize / c.numHeads));
  if (c.headDim > kMaxHeadDim) {
    return fieldError("head_dim", "(hidden_size / num_attention_heads) is " +
                                      std::to_string(c.headDim) + ", more than the limit " +
                                      std::to_string(kMaxHeadDim));
  }
  if (c.numHeads * c.headDim > kMaxHiddenSize) {
    return fieldError("num_attention_heads",
                      "times head_dim is more than the limit " + std::to_string(kMaxHiddenSize));
  }
  TG_ASSIGN_OR_RETURN(c.maxPositionEmbeddings,
                      boundedInt(j, "max_position_embeddings", kMaxPositions, 2048));
  return okStatus();
}

// `s` cut to at most `max` bytes (and "..."), never inside a UTF-8 sequence: for error messages.
std::string cutShort(std::string s, size_t max) {
  if (s.size() <= max) return s;
  size_t end = max;
  while (end > 0 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) --end;
  return s.substr(0, end) + "...";
}

// hidden_act as transformers' ACT2FN reads it, limited to the activations the MLP kernels compute.
// gelu_new and gelu_fast are the tanh approximation written out (gelu_fast factors it as
// x * c * (1 + 0.044715 x^2)): the same function, computed here in float and rounded once.
StatusOr<kernels::Activation> parseActivation(const json& j, kernels::Activation fallback) {
  using kernels::Activation;
  auto it = j.find("hidden_act");
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_string()) return fieldError("hidden_act", "must be a string");
  const std::string act = it->get<std::string>();
  if (act == "silu" || act == "swish") return Activation::kSilu;
  if (act == "gelu") return Activation::kGelu;
  if (act == "gelu_pytorch_tanh" || act == "gelu_new" || act == "gelu_fast")
    return Activation::kGeluTanh;
  if (act == "relu") return Activation::kRelu;
  return fieldError("hidden_act", "'" + cutShort(act, 64) +
                                      "' is not supported (silu, swish, gelu, gelu_pytorch_tanh, "
                                      "gelu_new, gelu_fast, relu)");
}

// The top-level keys parseModelConfig reads: a dialect's alias must name one of them.
constexpr std::string_view kCanonicalKeys[] = {"model_type",
                                               "vocab_size",
                                               "hidden_size",
                                               "intermediate_size",
                                               "num_hidden_layers",
                                               "num_attention_heads",
                                               "num_key_value_heads",
                                               "head_dim",
                                               "max_position_embeddings",
                                               "rms_norm_eps",
                                               "rope_theta",
                                               "partial_rotary_factor",
                                               "rope_scaling",
                                               "rope_parameters",
                                               "tie_word_embeddings",
                                               "attention_bias",
                                               "mlp_bias",
                                               "hidden_act",
                                               "sliding_window",
                                               "use_sliding_window",
                                               "dtype",
                                               "torch_dtype",
                                               "bos_token_id",
                                               "eos_token_id",
                                               "is_encoder_decoder",
                                               "decoder_start_token_id",
                                               "pad_token_id"};

bool isCanonicalKey(std::string_view key) {
  return std::find(std::begin(kCanonicalKeys), std::end(kCanonicalKeys), key) !=
         std::end(kCanonicalKeys);
}

// A value for an error message, cut short.
std::string shortDump(const json& v) {
  return cutShort(v.dump(), 48);
}

// Copies each alias's value to its canonical key where config.json has none; returns which key
// each copied canonical key was read under. Both present and different: INVALID_ARGUMENT naming
// both. A dialect whose alias names no key the parser reads is INTERNAL (the registry's error).
StatusOr<std::map<std::string, std::string>> applyAliases(json& j, std::string_view architecture,
                                                          const ConfigDialect& dialect) {
  std::map<std::string, std::string> readUnder;  // canonical key -> the alias it came from
  for (const ConfigKeyAlias& a : dialect.aliases) {
    if (a.key.empty() || isCanonicalKey(a.key) || !isCanonicalKey(a.canonical)) {
      return internalError(std::string(architecture) + ": config-key alias '" + std::string(a.key) +
                           "' -> '" + std::string(a.canonical) +
                           "' must map a key the parser does not read to one it reads");
    }
    const std::string key(a.key), canonical(a.canonical);
    auto alias = j.find(key);
    if (alias == j.end() || alias->is_null()) continue;
    auto present = j.find(canonical);
    if (present != j.end() && !present->is_null()) {
      if (*present == *alias) continue;
      auto from = readUnder.find(canonical);
      const std::string other = from == readUnder.end() ? canonical : from->second;
      return invalidArgumentError("config.json: '" + key + "' (" + shortDump(*alias) + ") and '" +
                                  other + "' (" + shortDump(*present) +
                                  ") disagree (the same field, spelled two ways)");
    }
    j[canonical] = *alias;
    readUnder[canonical] = key;
  }
  return readUnder;
}

// "dtype" (transformers 5) or "torch_dtype".
StatusOr<kernels::DType> parseDtype(const json& j) {
  const char* key = j.contains("dtype") ? "dtype" : "torch_dtype";
  TG_ASSIGN_OR_RETURN(const std::string dtype, string(j, key, "float32"));
  if (dtype == "float16") return kernels::DType::kF16;
  if (dtype == "bfloat16") return kernels::DType::kBF16;
  if (dtype == "float32") return kernels::DType::kF32;
  return fieldError("dtype", "'" + dtype + "' is not supported (float32, float16, bfloat16)");
}

// The fields of config.json once its keys are canonical.
Status parseFields(const json& j, const ConfigDialect& dialect, ModelConfig& c) {
  TG_ASSIGN_OR_RETURN(c.modelType, string(j, "model_type", ""));
  TG_RETURN_IF_ERROR(parseSizes(j, c));
  TG_ASSIGN_OR_RETURN(c.rmsNormEps, positiveNumber(j, "rms_norm_eps", 1e-6));
  TG_ASSIGN_OR_RETURN(c.rope, parseRope(j, c.maxPositionEmbeddings));
  if (c.rotaryDim() % 2 != 0 || c.rotaryDim() <= 0)
    return fieldError("partial_rotary_factor", "must give an even rotary dimension");
  if (c.maxContext() > kMaxPositions) {
    return fieldError("rope_scaling.factor",
                      "stretches the context past " + std::to_string(kMaxPositions) + " positions");
  }
  TG_ASSIGN_OR_RETURN(c.tieWordEmbeddings, boolean(j, "tie_word_embeddings", false));
  TG_ASSIGN_OR_RETURN(c.attentionBias, boolean(j, "attention_bias", false));
  TG_ASSIGN_OR_RETURN(c.mlpBias, boolean(j, "mlp_bias", false));
  TG_ASSIGN_OR_RETURN(c.hiddenAct, parseActivation(j, dialect.defaultActivation));
  if (auto it = j.find("sliding_window"); it != j.end() && !it->is_null()) {
    TG_ASSIGN_OR_RETURN(const int64_t window, boundedInt(j, "sliding_window", kMaxPositions));
    TG_ASSIGN_OR_RETURN(const bool use, boolean(j, "use_sliding_window", true));
    if (c.architecture == "MistralForCausalLM" || use) c.slidingWindow = window;
  }
  TG_ASSIGN_OR_RETURN(c.dtype, parseDtype(j));
  TG_ASSIGN_OR_RETURN(c.quantization, parseQuantizationConfig(j));
  if (auto it = j.find("bos_token_id"); it != j.end() && !it->is_null()) {
    if (!it->is_number_unsigned() || it->get<uint64_t>() > UINT32_MAX)
      return fieldError("bos_token_id", "must be a token id");
    c.bosTokenId = it->get<uint32_t>();
  }
  TG_ASSIGN_OR_RETURN(const bool encoderDecoder, boolean(j, "is_encoder_decoder", false));
  if (encoderDecoder && !dialect.encoderDecoder) {
    return fieldError("is_encoder_decoder", "is true, but " + c.architecture +
                                                " is a decoder-only class (no encoder to run)");
  }
  c.isEncoderDecoder = dialect.encoderDecoder;
  c.learnedPositions = dialect.learnedPositions;
  if (c.isEncoderDecoder) {
    // decoder_start_token_id, else pad_token_id (read only when it is the one used), else 0.
    for (const char* key : {"decoder_start_token_id", "pad_token_id"}) {
      TG_ASSIGN_OR_RETURN(std::optional<uint32_t> id, tokenId(j, key, c.vocabSize));
      if (id) {
        c.decoderStartTokenId = *id;
        break;
      }
    }
  }
  return addTokenIds(j, "eos_token_id", c.eosTokenIds, "config.json");
}

}  // namespace

StatusOr<ModelConfig> parseModelConfig(std::string_view configJson,
                                       std::string_view generationConfigJson,
                                       const ConfigDialectLookup& dialectOf) {
  TG_ASSIGN_OR_RETURN(json j, parseJson(configJson, "config.json"));
  if (!j.is_object()) return invalidArgumentError("config.json: not a JSON object");
  ModelConfig c;
  auto arch = j.find("architectures");
  if (arch == j.end() || !arch->is_array() || arch->empty() || !arch->front().is_string()) {
    return fieldError("architectures", "must list the model class (e.g. [\"LlamaForCausalLM\"])");
  }
  // Which classes are served, and how each spells its config, is the registry's to say
  // (models/registry.cpp), not the parser's.
  c.architecture = arch->front().get<std::string>();
  ConfigDialect dialect;
  if (dialectOf) {
    TG_ASSIGN_OR_RETURN(dialect, dialectOf(c.architecture));
  }
  TG_ASSIGN_OR_RETURN(const auto readUnder, applyAliases(j, c.architecture, dialect));
  if (dialect.prepare != nullptr) {
    if (Status s = dialect.prepare(j); !s.ok()) {
      std::string message = s.message();
      if (message.rfind("config.json", 0) != 0) message = "config.json: " + message;
      return Status(s.code(), std::move(message));
    }
    if (!j.is_object()) return internalError("config.json: the class's prepare left no object");
  }
  if (Status s = parseFields(j, dialect, c); !s.ok()) {
    // A field read under an alias is named as config.json spells it, too.
    std::string message = s.message();
    for (const auto& [canonical, key] : readUnder) {
      if (message.find("'" + canonical + "'") != std::string::npos)
        message += " (config.json spells it '" + key + "')";
    }
    return Status(s.code(), std::move(message));
  }
  if (!generationConfigJson.empty()) {
    TG_ASSIGN_OR_RETURN(json g, parseJson(generationConfigJson, "generation_config.json"));
    if (!g.is_object()) return invalidArgumentError("generation_config.json: not a JSON object");
    TG_RETURN_IF_ERROR(addTokenIds(g, "eos_token_id", c.eosTokenIds, "generation_config.json"));
    if (c.isEncoderDecoder) {
      auto id = tokenId(g, "decoder_start_token_id", c.vocabSize);
      if (!id.ok()) {
        return invalidArgumentError(
            "generation_config.json: 'decoder_start_token_id' must be a token id below vocab_size");
      }
      if (*id) c.decoderStartTokenId = **id;
    }
  }
  c.json = std::make_shared<const json>(std::move(j));
  return c;
}

StatusOr<ModelConfig> loadModelConfig(const std::string& modelDir,
                                      const ConfigDialectLookup& dialectOf) {
  const std::string dir = modelDir.empty() || modelDir.back() == '/' ? modelDir : modelDir + "/";
  TG_ASSIGN_OR_RETURN(std::string config, readRegularFile(dir + "config.json"));
  // generation_config.json is optional: absent is fine, anything else that fails is an error.
  auto gen = readRegularFile(dir + "generation_config.json");
  if (!gen.ok() && gen.status().code() != StatusCode::kNotFound) return gen.status();
  return parseModelConfig(config, gen.ok() ? *gen : std::string(), dialectOf);
}

StatusOr<std::optional<MedusaConfig>> parseMedusaConfig(std::string_view configJson) {
  json j = json::parse(configJson, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return invalidArgumentError("config.json is not a JSON object");
  if (!j.contains("medusa_num_heads")) return std::optional<MedusaConfig>();
  MedusaConfig m;
  TG_ASSIGN_OR_RETURN(m.heads, boundedInt(j, "medusa_num_heads", kMaxMedusaHeads));
  TG_ASSIGN_OR_RETURN(m.layers, boundedInt(j, "medusa_num_layers", kMaxMedusaLayers));
  auto base = j.find("base_model_name_or_path");
  if (base == j.end() || !base->is_string() || base->get<std::string>().empty() ||
      base->get<std::string>().find('\0') != std::string::npos)
    return fieldError("base_model_name_or_path", "must be a non-empty string");
  m.baseModel = base->get<std::string>();
  return std::optional<MedusaConfig>(std::move(m));
}

StatusOr<std::optional<MedusaConfig>> readMedusaConfig(const std::string& dir,
                                                       const std::string& baseDir) {
  namespace fs = std::filesystem;
  TG_ASSIGN_OR_RETURN(std::string text, readRegularFile((fs::path(dir) / "config.json").string()));
  auto parsed = parseMedusaConfig(text);
  if (!parsed.ok()) return parsed.status().withContext(dir);
  if (!parsed->has_value()) return parsed;
  MedusaConfig m = std::move(**parsed);
  std::error_code ec;
  if (!fs::is_regular_file(fs::path(dir) / "medusa_lm_head.safetensors", ec))
    return notFoundError(dir + ": a Medusa directory without medusa_lm_head.safetensors");
  const fs::path named(baseDir.empty() ? m.baseModel : baseDir);
  const fs::path resolved = named.is_absolute() ? named : fs::path(dir) / named;
  if (!fs::is_regular_file(resolved / "config.json", ec)) {
    return notFoundError(dir + ": the base model '" + named.string() +
                         "' is not a local model directory (looked for " +
                         (resolved / "config.json").string() +
                         "; base_model_name_or_path is read as a path, absolute or relative to "
                         "the Medusa directory, and nothing is downloaded)");
  }
  m.baseModel = resolved.lexically_normal().string();
  if (fs::equivalent(resolved, fs::path(dir), ec))
    return invalidArgumentError(dir + ": base_model_name_or_path names the Medusa directory");
  return std::optional<MedusaConfig>(std::move(m));
}

}  // namespace textgen::runtime
