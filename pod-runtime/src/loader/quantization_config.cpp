#include "textgen/runtime/quantization_config.h"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace textgen::runtime {
namespace {

using nlohmann::json;

constexpr int64_t kMaxGroupSize = int64_t{1} << 20;  // the largest intermediate_size allowed

Status fieldError(std::string_view field, std::string_view what) {
  return invalidArgumentError("config.json: 'quantization_config." + std::string(field) + "' " +
                              std::string(what));
}

// A value for an error message: ASCII (non-ASCII escaped), cut short.
std::string shortDump(const json& v) {
  std::string s = v.dump(-1, ' ', true);
  return s.size() > 48 ? s.substr(0, 48) + "..." : s;
}

// The value under `key`, else under `alias` (AutoAWQ's own spellings); both present and different
// is an error naming both. Null counts as absent.
StatusOr<std::optional<std::pair<std::string, json>>> find(const json& q, const char* key,
                                                           const char* alias = nullptr) {
  std::optional<std::pair<std::string, json>> found;
  for (const char* k : {key, alias}) {
    if (k == nullptr) continue;
    auto it = q.find(k);
    if (it == q.end() || it->is_null()) continue;
    if (found && found->second != *it)
      return fieldError(k, "and 'quantization_config." + found->first + "' disagree");
    if (!found) found.emplace(k, *it);
  }
  return found;
}

StatusOr<bool> boolean(const json& q, const char* key, bool fallback) {
  TG_ASSIGN_OR_RETURN(auto v, find(q, key));
  if (!v) return fallback;
  if (!v->second.is_boolean()) return fieldError(key, "must be true or false");
  return v->second.get<bool>();
}

// A string, lower-cased (AutoAWQ writes "GEMM", transformers "gemm").
StatusOr<std::optional<std::string>> lowerString(const json& q, const char* key,
                                                 const char* alias = nullptr) {
  TG_ASSIGN_OR_RETURN(auto v, find(q, key, alias));
  if (!v) return std::optional<std::string>();
  if (!v->second.is_string()) return fieldError(v->first, "must be a string");
  std::string s = v->second.get<std::string>();
  if (s.size() > 64) s = s.substr(0, 64) + "...";
  // Lower-cased; bytes outside printable ASCII shown as '?' (the value is only compared and
  // quoted).
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) {
    return c < 0x20 || c > 0x7e ? '?' : static_cast<char>(std::tolower(c));
  });
  return std::optional<std::string>(std::move(s));
}

StatusOr<int> bits(const json& q, const char* alias) {
  TG_ASSIGN_OR_RETURN(auto v, find(q, "bits", alias));
  if (!v) return fieldError("bits", "is missing");
  if (!v->second.is_number_unsigned() || v->second.get<uint64_t>() > 64)
    return fieldError(v->first, "must be a bit width, not " + shortDump(v->second));
  return static_cast<int>(v->second.get<uint64_t>());
}

// group_size: inputs per group, -1 for one group over all inputs (0 here); transformers' default
// 128 when absent.
StatusOr<int64_t> groupSize(const json& q, const char* alias) {
  TG_ASSIGN_OR_RETURN(auto v, find(q, "group_size", alias));
  if (!v) return 128;
  const json& g = v->second;
  if (g.is_number_integer() && !g.is_number_unsigned() && g.get<int64_t>() == -1) return 0;
  if (!g.is_number_unsigned() || g.get<uint64_t>() == 0 ||
      g.get<uint64_t>() > static_cast<uint64_t>(kMaxGroupSize))
    return fieldError(v->first, "must be -1 (one group) or a positive integer up to " +
                                    std::to_string(kMaxGroupSize) + ", not " + shortDump(g));
  return g.get<int64_t>();
}

// IST-DASLab's Marlin layout: quant_method "marlin" ({"group_size": 128 | -1}, vLLM's MarlinConfig,
// TGI's --quantize marlin), or a GPT-Q config with checkpoint_format "marlin" (AutoGPTQ >= 0.8;
// "is_marlin_format": true before). 4-bit symmetric codes, group 128 or per channel; the 2:4
// sparse variant (checkpoint_format "marlin_24", is_marlin_24: B_24 and B_meta) is refused.
StatusOr<QuantizationConfig> parseMarlin(const json& q, bool asGptq) {
  QuantizationConfig c;
  c.method = QuantMethod::kMarlin;
  c.marlinAsGptq = asGptq;
  TG_ASSIGN_OR_RETURN(const bool sparse, boolean(q, "is_marlin_24", false));
  TG_ASSIGN_OR_RETURN(auto format, lowerString(q, "checkpoint_format", "format"));
  if (sparse || format == "marlin_24")
    return fieldError(sparse ? "is_marlin_24" : "checkpoint_format",
                      sparse ? "is true: 2:4 sparse Marlin checkpoints (B_24, B_meta) are not "
                               "supported; dense Marlin checkpoints (B, s) are"
                             : "'marlin_24': 2:4 sparse Marlin checkpoints (B_24, B_meta) are not "
                               "supported; dense Marlin checkpoints (B, s) are");
  if (!asGptq && format.value_or("marlin") != "marlin")
    return fieldError(q.contains("checkpoint_format") ? "checkpoint_format" : "format",
                      "'" + *format + "' is not supported with quant_method 'marlin'");
  TG_ASSIGN_OR_RETURN(auto b, find(q, "bits"));
  c.bits = 4;
  if (b || asGptq) {
    TG_ASSIGN_OR_RETURN(c.bits, bits(q, nullptr));
  }
  if (c.bits != 4)
    return fieldError("bits", "is " + std::to_string(c.bits) + ": Marlin checkpoints are 4-bit");
  TG_ASSIGN_OR_RETURN(c.groupSize, groupSize(q, nullptr));
  if (c.groupSize != 128 && c.groupSize != 0)
    return fieldError("group_size", "is " + std::to_string(c.groupSize) +
                                        ": Marlin checkpoints have group_size 128 or -1 (one "
                                        "scale per output channel)");
  TG_ASSIGN_OR_RETURN(const bool descAct, boolean(q, "desc_act", false));
  if (descAct) return fieldError("desc_act", "is true: Marlin's format has no act-order (g_idx)");
  TG_ASSIGN_OR_RETURN(const bool sym, boolean(q, "sym", true));
  if (!sym) return fieldError("sym", "is false: Marlin's codes are symmetric (zero 8)");
  TG_ASSIGN_OR_RETURN(const bool lmHead, boolean(q, "lm_head", false));
  if (lmHead) return fieldError("lm_head", "is true: a quantized lm_head is not supported");
  return c;
}

StatusOr<QuantizationConfig> parseGptq(const json& q) {
  QuantizationConfig c;
  c.method = QuantMethod::kGptq;
  TG_ASSIGN_OR_RETURN(c.bits, bits(q, nullptr));
  if (c.bits != 4 && c.bits != 8)
    return fieldError("bits", "is " + std::to_string(c.bits) +
                                  ": GPT-Q checkpoints of 4 or 8 bits are supported");
  TG_ASSIGN_OR_RETURN(c.groupSize, groupSize(q, nullptr));
  TG_ASSIGN_OR_RETURN(c.descAct, boolean(q, "desc_act", false));
  TG_ASSIGN_OR_RETURN(c.sym, boolean(q, "sym", true));
  // GPTQModel writes checkpoint_format (older releases "format"); AutoGPTQ and optimum's v1 when
  // absent.
  TG_ASSIGN_OR_RETURN(auto format, lowerString(q, "checkpoint_format", "format"));
  const std::string f = format.value_or("gptq");
  TG_ASSIGN_OR_RETURN(const bool marlinFormat, boolean(q, "is_marlin_format", false));
  if (f == "marlin" || f == "marlin_24" || marlinFormat) return parseMarlin(q, true);
  if (f == "gptq_v2") {
    c.zerosMinusOne = false;
  } else if (f != "gptq") {
    return fieldError(q.contains("checkpoint_format") ? "checkpoint_format" : "format",
                      "'" + f + "' is not supported (gptq, gptq_v2, marlin)");
  }
  TG_ASSIGN_OR_RETURN(const bool lmHead, boolean(q, "lm_head", false));
  if (lmHead) return fieldError("lm_head", "is true: a quantized lm_head is not supported");
  return c;
}

StatusOr<QuantizationConfig> parseAwq(const json& q) {
  QuantizationConfig c;
  c.method = QuantMethod::kAwq;
  TG_ASSIGN_OR_RETURN(c.bits, bits(q, "w_bit"));
  if (c.bits != 4)
    return fieldError("bits", "is " + std::to_string(c.bits) + ": AWQ checkpoints are 4-bit");
  TG_ASSIGN_OR_RETURN(c.groupSize, groupSize(q, "q_group_size"));
  TG_ASSIGN_OR_RETURN(c.zeroPoint, boolean(q, "zero_point", true));
  TG_ASSIGN_OR_RETURN(auto version, lowerString(q, "version"));
  if (version.value_or("gemm") != "gemm")
    return fieldError("version",
                      "'" + *version + "' is not supported (gemm; gemv, exllama and ipex later)");
  TG_ASSIGN_OR_RETURN(auto backend, lowerString(q, "backend"));
  if (backend.value_or("autoawq") != "autoawq")
    return fieldError("backend", "'" + *backend + "' is not supported (autoawq's GEMM packing)");
  return c;
}

// vLLM / AutoFP8 / TGI: {"quant_method": "fp8", "activation_scheme": "static" | "dynamic"}; a
// weight_block_size (DeepSeek-V3, transformers' FineGrainedFP8: weight_scale_inv per 128x128 block,
// activations per token-group of 128) is refused.
StatusOr<QuantizationConfig> parseFp8(const json& q) {
  QuantizationConfig c;
  c.method = QuantMethod::kFp8;
  c.bits = 8;
  TG_ASSIGN_OR_RETURN(auto block, find(q, "weight_block_size"));
  if (block)
    return fieldError("weight_block_size",
                      "is set: block-wise fp8 checkpoints (weight_scale_inv per block) are not "
                      "supported; per-tensor and per-channel weight_scale are");
  TG_ASSIGN_OR_RETURN(auto fmt, lowerString(q, "fmt"));
  if (fmt.value_or("e4m3") != "e4m3")
    return fieldError("fmt", "'" + *fmt + "' is not supported (e4m3)");
  TG_ASSIGN_OR_RETURN(auto scheme, lowerString(q, "activation_scheme"));
  const std::string a = scheme.value_or("dynamic");
  if (a == "static") {
    c.fp8Activations = QuantizationConfig::Fp8Activations::kStatic;
  } else if (a != "dynamic") {
    return fieldError("activation_scheme", "'" + a + "' is not supported (static, dynamic)");
  }
  return c;
}

// compressed-tensors' quantization args of `weights` / `input_activations`: 8-bit float, or an
// error naming the field.
Status checkFloat8Args(const json& args, const std::string& field) {
  if (!args.is_object()) return fieldError(field, "must be an object");
  auto bitsIt = args.find("num_bits");
  if (bitsIt == args.end() || !bitsIt->is_number_unsigned() || bitsIt->get<uint64_t>() != 8)
    return fieldError(field + ".num_bits",
                      "must be 8 (fp8), not " +
                          (bitsIt == args.end() ? std::string("missing") : shortDump(*bitsIt)));
  auto typeIt = args.find("type");
  if (typeIt == args.end() || *typeIt != "float")
    return fieldError(field + ".type",
                      "must be \"float\" (fp8; int8 and 4-bit schemes are not supported), not " +
                          (typeIt == args.end() ? std::string("missing") : shortDump(*typeIt)));
  auto symIt = args.find("symmetric");
  if (symIt != args.end() && !symIt->is_null() && *symIt != true)
    return fieldError(field + ".symmetric", "must be true");
  return okStatus();
}

// A checkpoint's string for an error message: printable ASCII ('?' for other bytes), cut short.
std::string printable(std::string s) {
  if (s.size() > 48) s = s.substr(0, 48) + "...";
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return c < 0x20 || c > 0x7e ? '?' : static_cast<char>(c); });
  return s;
}

std::string argString(const json& args, const char* key) {
  auto it = args.find(key);
  return it != args.end() && it->is_string() ? printable(it->get<std::string>()) : std::string();
}

// llm-compressor's {"quant_method": "compressed-tensors", "format": "float-quantized",
// "config_groups": {"group_0": {"targets": ["Linear"], "weights": {...}, "input_activations":
// {...}}}}: one group of fp8 weights per tensor or per channel, activations static per tensor,
// dynamic per tensor, dynamic per token (kept in the compute dtype) or none.
StatusOr<QuantizationConfig> parseCompressedTensors(const json& q) {
  QuantizationConfig c;
  c.method = QuantMethod::kFp8;
  c.bits = 8;
  TG_ASSIGN_OR_RETURN(auto format, lowerString(q, "format"));
  const std::string f = format.value_or("");
  if (f != "float-quantized" && f != "naive-quantized")
    return fieldError("format", "'" + f +
                                    "' is not supported (float-quantized and naive-quantized fp8 "
                                    "checkpoints are)");
  auto groups = q.find("config_groups");
  if (groups == q.end() || !groups->is_object() || groups->size() != 1)
    return fieldError("config_groups", "must hold exactly one quantization scheme");
  const std::string name = "config_groups." + printable(groups->begin().key());
  const json& g = groups->begin().value();
  if (!g.is_object()) return fieldError(name, "must be an object");
  auto w = g.find("weights");
  if (w == g.end() || w->is_null()) return fieldError(name + ".weights", "is missing");
  TG_RETURN_IF_ERROR(checkFloat8Args(*w, name + ".weights"));
  const std::string ws = argString(*w, "strategy");
  if (ws != "tensor" && ws != "channel")
    return fieldError(name + ".weights.strategy",
                      "'" + ws + "' is not supported (tensor, channel; block and group are not)");
  auto wd = w->find("dynamic");
  if (wd != w->end() && !wd->is_null() && *wd != false)
    return fieldError(name + ".weights.dynamic", "must be false");
  auto a = g.find("input_activations");
  if (a == g.end() || a->is_null()) {
    c.fp8Activations = QuantizationConfig::Fp8Activations::kNone;
    return c;
  }
  TG_RETURN_IF_ERROR(checkFloat8Args(*a, name + ".input_activations"));
  const std::string as = argString(*a, "strategy");
  auto dynIt = a->find("dynamic");
  const json dyn = dynIt == a->end() || dynIt->is_null() ? json(false) : *dynIt;
  if (!dyn.is_boolean())
    return fieldError(name + ".input_activations.dynamic", "must be true or false");
  if (as == "tensor") {
    c.fp8Activations = dyn.get<bool>() ? QuantizationConfig::Fp8Activations::kDynamic
                                       : QuantizationConfig::Fp8Activations::kStatic;
  } else if (as == "token" && dyn.get<bool>()) {
    c.fp8Activations = QuantizationConfig::Fp8Activations::kNone;
  } else {
    return fieldError(name + ".input_activations.strategy",
                      "'" + as + "' is not supported (tensor; token when dynamic)");
  }
  return c;
}

}  // namespace

StatusOr<QuantizationConfig> parseQuantizationConfig(const json& config) {
  auto it = config.find("quantization_config");
  if (it == config.end() || it->is_null()) return QuantizationConfig{};
  if (!it->is_object())
    return invalidArgumentError("config.json: 'quantization_config' must be an object");
  const json& q = *it;
  TG_ASSIGN_OR_RETURN(auto method, lowerString(q, "quant_method"));
  if (!method) return fieldError("quant_method", "is missing");
  if (*method == "gptq") return parseGptq(q);
  if (*method == "awq") return parseAwq(q);
  if (*method == "fp8") return parseFp8(q);
  if (*method == "compressed-tensors") return parseCompressedTensors(q);
  if (*method == "marlin") return parseMarlin(q, false);
  return fieldError("quant_method", "'" + *method +
                                        "' is not supported (gptq, awq, fp8, compressed-tensors, "
                                        "marlin)");
}

}  // namespace textgen::runtime
