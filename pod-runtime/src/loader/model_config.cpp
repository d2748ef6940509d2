#include "textgen/runtime/model_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace textgen::runtime {
namespace {

using nlohmann::json;

Status fieldError(std::string_view field, std::string_view what) {
  return invalidArgumentError("config.json: '" + std::string(field) + "' " + std::string(what));
}

StatusOr<int64_t> positiveInt(const json& j, const char* key,
                              std::optional<int64_t> fallback = std::nullopt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (fallback) return *fallback;
    return fieldError(key, "is missing");
  }
  if (!it->is_number_integer() || it->get<int64_t>() <= 0)
    return fieldError(key, "must be a positive integer");
  return it->get<int64_t>();
}

StatusOr<double> positiveNumber(const json& j, const char* key, double fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number() || it->get<double>() <= 0)
    return fieldError(key, "must be a positive number");
  return it->get<double>();
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
    if (r.contains(k) && r[k].is_string()) {
      type = r[k].get<std::string>();
      break;
    }
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
  return rope;
}

}  // namespace

StatusOr<ModelConfig> parseModelConfig(std::string_view configJson,
                                       std::string_view generationConfigJson) {
  json j = json::parse(configJson, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return invalidArgumentError("config.json: not a JSON object");
  ModelConfig c;
  if (!j.contains("architectures") || !j["architectures"].is_array() ||
      j["architectures"].empty() || !j["architectures"][0].is_string()) {
    return fieldError("architectures", "must list the model class (e.g. [\"LlamaForCausalLM\"])");
  }
  c.architecture = j["architectures"][0].get<std::string>();
  if (c.architecture != "LlamaForCausalLM" && c.architecture != "MistralForCausalLM") {
    return unimplementedError(
        "config.json: architecture '" + c.architecture +
        "' is not supported (supported: LlamaForCausalLM, MistralForCausalLM)");
  }
  c.modelType = j.value("model_type", "");
  TG_ASSIGN_OR_RETURN(c.vocabSize, positiveInt(j, "vocab_size"));
  TG_ASSIGN_OR_RETURN(c.hiddenSize, positiveInt(j, "hidden_size"));
  TG_ASSIGN_OR_RETURN(c.intermediateSize, positiveInt(j, "intermediate_size"));
  TG_ASSIGN_OR_RETURN(c.numLayers, positiveInt(j, "num_hidden_layers"));
  TG_ASSIGN_OR_RETURN(c.numHeads, positiveInt(j, "num_attention_heads"));
  TG_ASSIGN_OR_RETURN(c.numKvHeads, positiveInt(j, "num_key_value_heads", c.numHeads));
  if (c.numHeads % c.numKvHeads != 0) {
    return fieldError("num_key_value_heads", "must divide num_attention_heads");
  }
  if (c.hiddenSize % c.numHeads != 0 && !j.contains("head_dim")) {
    return fieldError("hidden_size",
                      "must be a multiple of num_attention_heads (or give head_dim)");
  }
  TG_ASSIGN_OR_RETURN(c.headDim, positiveInt(j, "head_dim", c.hiddenSize / c.numHeads));
  TG_ASSIGN_OR_RETURN(c.maxPositionEmbeddings, positiveInt(j, "max_position_embeddings", 2048));
  TG_ASSIGN_OR_RETURN(c.rmsNormEps, positiveNumber(j, "rms_norm_eps", 1e-6));
  TG_ASSIGN_OR_RETURN(c.rope, parseRope(j, c.maxPositionEmbeddings));
  if (c.rotaryDim() % 2 != 0 || c.rotaryDim() <= 0)
    return fieldError("partial_rotary_factor", "must give an even rotary dimension");
  TG_ASSIGN_OR_RETURN(c.tieWordEmbeddings, boolean(j, "tie_word_embeddings", false));
  TG_ASSIGN_OR_RETURN(c.attentionBias, boolean(j, "attention_bias", false));
  TG_ASSIGN_OR_RETURN(c.mlpBias, boolean(j, "mlp_bias", false));
  if (c.attentionBias || c.mlpBias)
    return unimplementedError("config.json: attention_bias/mlp_bias are not supported yet");
  if (auto act = j.value("hidden_act", std::string("silu")); act != "silu") {
    return fieldError("hidden_act", "'" + act + "' is not supported (silu)");
  }
  if (auto it = j.find("sliding_window"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() <= 0)
      return fieldError("sliding_window", "must be a positive integer");
    if (c.architecture == "MistralForCausalLM" || j.value("use_sliding_window", true))
      c.slidingWindow = it->get<int64_t>();
  }
  const std::string dtype =
      j.contains("dtype") ? j.value("dtype", "float32") : j.value("torch_dtype", "float32");
  if (dtype == "float16") {
    c.dtype = kernels::DType::kF16;
  } else if (dtype == "bfloat16") {
    c.dtype = kernels::DType::kBF16;
  } else if (dtype == "float32") {
    c.dtype = kernels::DType::kF32;
  } else {
    return fieldError("dtype", "'" + dtype + "' is not supported (float32, float16, bfloat16)");
  }
  if (auto it = j.find("bos_token_id"); it != j.end() && it->is_number_unsigned())
    c.bosTokenId = it->get<uint32_t>();
  TG_RETURN_IF_ERROR(addTokenIds(j, "eos_token_id", c.eosTokenIds, "config.json"));
  if (!generationConfigJson.empty()) {
    json g = json::parse(generationConfigJson, nullptr, false);
    if (g.is_discarded() || !g.is_object())
      return invalidArgumentError("generation_config.json: not a JSON object");
    TG_RETURN_IF_ERROR(addTokenIds(g, "eos_token_id", c.eosTokenIds, "generation_config.json"));
  }
  return c;
}

StatusOr<ModelConfig> loadModelConfig(const std::string& modelDir) {
  auto read = [](const std::filesystem::path& p) -> std::optional<std::string> {
    std::ifstream in(p);
    if (!in) return std::nullopt;
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  auto config = read(std::filesystem::path(modelDir) / "config.json");
  if (!config) return notFoundError(modelDir + "/config.json: cannot open");
  auto gen = read(std::filesystem::path(modelDir) / "generation_config.json");
  return parseModelConfig(*config, gen.value_or(""));
}

}  // namespace textgen::runtime
