#include "textgen/router/validation.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

#include "textgen/base/json.h"
#include "textgen/base/sampling_rules.h"
#include "textgen/grammar/grammar.h"

namespace textgen::router {
namespace {

using json = nlohmann::ordered_json;

Status fieldType(const std::string& field, const char* expected) {
  return invalidArgumentError("Failed to deserialize the JSON body into the target type: " + field +
                              ": invalid type, expected " + expected);
}

// Typed accessors over untrusted JSON: a missing or null field leaves `out` as it is; a field of
// another type is a validation error naming it (`prefix` + key). Nothing here throws.
template <typename T>
Status readNumber(const json& p, const char* key, std::optional<T>& out,
                  const char* prefix = "parameters.") {
  auto it = p.find(key);
  if (it == p.end() || it->is_null()) return okStatus();
  const std::string field = std::string(prefix) + key;
  if constexpr (std::is_floating_point_v<T>) {
    if (!it->is_number()) return fieldType(field, "a number");
    const double v = it->get<double>();
    if (!std::isfinite(v) || std::fabs(v) > std::numeric_limits<T>::max())
      return fieldType(field, "a finite number");
    out = static_cast<T>(v);
  } else if constexpr (std::is_signed_v<T>) {
    if (!it->is_number_integer()) return fieldType(field, "an integer");
    if (it->is_number_unsigned() && it->get<uint64_t>() > INT32_MAX)
      return fieldType(field, "a 32-bit integer");
    const int64_t v = it->get<int64_t>();
    if (v < INT32_MIN || v > INT32_MAX) return fieldType(field, "a 32-bit integer");
    out = static_cast<T>(v);
  } else {
    if (!it->is_number_unsigned()) return fieldType(field, "a non-negative integer");
    const uint64_t v = it->get<uint64_t>();
    if (v > std::numeric_limits<T>::max()) return fieldType(field, "a smaller integer");
    out = static_cast<T>(v);
  }
  return okStatus();
}

Status readBool(const json& p, const char* key, bool& out, const char* prefix = "parameters.") {
  auto it = p.find(key);
  if (it == p.end() || it->is_null()) return okStatus();
  if (!it->is_boolean()) return fieldType(std::string(prefix) + key, "a boolean");
  out = it->get<bool>();
  return okStatus();
}

Status readString(const json& p, const char* key, std::optional<std::string>& out,
                  const char* prefix = "") {
  auto it = p.find(key);
  if (it == p.end() || it->is_null()) return okStatus();
  if (!it->is_string()) return fieldType(std::string(prefix) + key, "a string");
  out = it->get<std::string>();
  return okStatus();
}

// A string or a list of strings (OpenAI's `prompt` and `stop`).
Status readStrings(const json& p, const char* key, std::vector<std::string>& out,
                   const char* prefix = "") {
  auto it = p.find(key);
  if (it == p.end() || it->is_null()) return okStatus();
  if (it->is_string()) {
    out.push_back(it->get<std::string>());
    return okStatus();
  }
  if (!it->is_array()) return fieldType(std::string(prefix) + key, "a string or a list of strings");
  for (const auto& s : *it) {
    if (!s.is_string()) return fieldType(std::string(prefix) + key, "a list of strings");
    out.push_back(s.get<std::string>());
  }
  return okStatus();
}

StatusOr<json> parseBody(std::string_view body) {
  auto j = parseOrderedJson(body, "the request body");
  if (!j.ok()) {
    return invalidArgumentError("Failed to parse the request body as JSON: " +
                                j.status().message());
  }
  if (!j->is_object())
    return invalidArgumentError(
        "Failed to deserialize the JSON body into the target type: expected an object");
  return std::move(*j);
}

}  // namespace

StatusOr<CompletionRequest> parseCompletionRequest(std::string_view body) {
  TG_ASSIGN_OR_RETURN(json j, parseBody(body));
  CompletionRequest r;
  if (!j.contains("prompt") || j["prompt"].is_null())
    return invalidArgumentError(
        "Failed to deserialize the JSON body into the target type: missing field `prompt`");
  TG_RETURN_IF_ERROR(readStrings(j, "prompt", r.prompts));
  TG_RETURN_IF_ERROR(readString(j, "model", r.model));
  TG_RETURN_IF_ERROR(readString(j, "suffix", r.suffix));
  TG_RETURN_IF_ERROR(readBool(j, "stream", r.stream, ""));
  if (auto o = j.find("stream_options"); o != j.end() && !o->is_null()) {
    if (!o->is_object()) return fieldType("stream_options", "an object");
    TG_RETURN_IF_ERROR(readBool(*o, "include_usage", r.includeUsage, "stream_options."));
  }
  // OpenAI's fields textgen does not serve here: refused, never ignored (a client that asked for
  // two choices must not index a second one that never comes).
  // 1 (or 1.0), false and 0 mean what textgen does anyway.
  for (const char* key : {"n", "best_of"}) {
    std::optional<double> v;
    TG_RETURN_IF_ERROR(readNumber(j, key, v, ""));
    if (v && *v != 1.0) {
      return invalidArgumentError(std::string("`") + key +
                                  "` must be 1 on /v1/completions: one choice per prompt");
    }
  }
  bool echo = false;
  TG_RETURN_IF_ERROR(readBool(j, "echo", echo, ""));
  if (echo) return invalidArgumentError("`echo` is not supported");
  if (auto lp = j.find("logprobs"); lp != j.end() && !lp->is_null()) {
    const bool off =
        lp->is_boolean() ? !lp->get<bool>() : lp->is_number() && lp->get<double>() == 0.0;
    if (!lp->is_boolean() && !lp->is_number()) return fieldType("logprobs", "an integer");
    if (!off) return invalidArgumentError("`logprobs` is not supported on /v1/completions");
  }
  TG_RETURN_IF_ERROR(readNumber(j, "max_tokens", r.maxTokens, ""));
  TG_RETURN_IF_ERROR(readNumber(j, "temperature", r.temperature, ""));
  TG_RETURN_IF_ERROR(readNumber(j, "top_p", r.topP, ""));
  TG_RETURN_IF_ERROR(readNumber(j, "seed", r.seed, ""));
  TG_RETURN_IF_ERROR(readNumber(j, "frequency_penalty", r.frequencyPenalty, ""));
  TG_RETURN_IF_ERROR(readNumber(j, "presence_penalty", r.presencePenalty, ""));
  TG_RETURN_IF_ERROR(readNumber(j, "repetition_penalty", r.repetitionPenalty, ""));
  TG_RETURN_IF_ERROR(readStrings(j, "stop", r.stop));
  return r;
}

GenerateRequest CompletionRequest::toGenerate(size_t index) const {
  GenerateRequest g;
  g.inputs = prompts[index];
  GenerateParameters& p = g.parameters;
  p.topP = topP;
  p.seed = seed;
  p.frequencyPenalty = frequencyPenalty;
  p.presencePenalty = presencePenalty;
  p.repetitionPenalty = repetitionPenalty;
  p.maxNewTokens = maxTokens;  // unset: fill up to max_total_tokens
  // OpenAI samples by default; temperature 0 means greedy.
  const float t = temperature.value_or(1.0f);
  if (t > 0.0f) {
    p.doSample = true;
    p.temperature = temperature;
  } else if (t < 0.0f) {
    p.temperature = t;  // refused by validation, never read as greedy
  }
  p.stop = stop;
  return g;
}

StatusOr<ChatCompletionRequest> parseChatRequest(std::string_view body) {
  TG_ASSIGN_OR_RETURN(json j, parseBody(body));
  ChatCompletionRequest r;
  auto messages = j.find("messages");
  if (messages == j.end() || messages->is_null())
    return invalidArgumentError(
        "Failed to deserialize the JSON body into the target type: missing field `messages`");
  if (!messages->is_array()) return fieldType("messages", "a sequence");
  if (messages->empty()) return invalidArgumentError("`messages` cannot be empty");
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return fieldType(at, "an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string())
      return invalidArgumentError("Failed to deserialize the JSON body into the target type: " +
                                  at + ": missing field `role` (a string)");
  }
  r.messages = std::move(*messages);
  TG_RETURN_IF_ERROR(readString(j, "model", r.model));
  TG_RETURN_IF_ERROR(readBool(j, "stream", r.stream, ""));
  if (auto o = j.find("stream_options"); o != j.end() && !o->is_null()) {
    if (!o->is_object()) return fieldType("stream_options", "an object");
    TG_RETURN_IF_ERROR(readBool(*o, "include_usage", r.includeUsage, "stream_options."));
  }
  TG_RETURN_IF_ERROR(readBool(j, "logprobs", r.logprobs, ""));
  TG_RETURN_IF_ERROR(readNumber(j, "top_logprobs", r.topLogprobs, ""));
  TG_RETURN_IF_ERROR(readStrings(j, "stop", r.stop));
  TG_RETURN_IF_ERROR(readNumber(j, "seed", r.seed, ""));
  TG_RETURN_IF_ERROR(readNumber(j, "max_tokens", r.maxTokens, ""));
  std::optional<uint32_t> maxCompletion;
  TG_RETURN_IF_ERROR(readNumber(j, "max_completion_tokens", maxCompletion, ""));
  if (maxCompletion) r.maxTokens = maxCompletion;
  TG_RETURN_IF_ERROR(readNumber(j, "temperature", r.temperature, ""));
  TG_RETURN_IF_ERROR(readNumber(j, "top_p", r.topP, ""));
  TG_RETURN_IF_ERROR(readNumber(j, "frequency_penalty", r.frequencyPenalty, ""));
  TG_RETURN_IF_ERROR(readNumber(j, "presence_penalty", r.presencePenalty, ""));
  std::optional<uint32_t> n;
  TG_RETURN_IF_ERROR(readNumber(j, "n", n, ""));
  if (n && *n != 1) return invalidArgumentError("`n` must be 1: one choice per request");
  if (auto f = j.find("response_format"); f != j.end() && !f->is_null()) {
    TG_ASSIGN_OR_RETURN(r.responseFormat, parseGrammar(*f, "response_format"));
  }
  if (auto t = j.find("tools"); t != j.end() && !t->is_null()) {
    if (!t->is_array()) return fieldType("tools", "a sequence");
    r.tools = std::move(*t);
  }
  if (auto c = j.find("tool_choice"); c != j.end() && !c->is_null()) {
    using Mode = ToolChoice::Mode;
    if (c->is_string()) {
      const std::string v = c->get<std::string>();
      if (v == "auto") {
        r.toolChoice.mode = Mode::kAuto;
      } else if (v == "none") {
        r.toolChoice.mode = Mode::kNone;
      } else if (v == "required") {
        r.toolChoice.mode = Mode::kRequired;
      } else {
        return invalidArgumentError(
            "`tool_choice` must be \"auto\", \"none\", \"required\" or "
            "{\"type\": \"function\", \"function\": {\"name\": ...}}. "
            "Given: \"" +
            v + "\"");
      }
    } else if (c->is_object()) {
      auto f = c->find("function");
      const json* name = nullptr;
      if (f != c->end() && f->is_object()) {
        if (auto it = f->find("name"); it != f->end() && it->is_string()) name = &*it;
      }
      if (!name || name->get<std::string>().empty())
        return fieldType("tool_choice.function.name", "a non-empty string");
      r.toolChoice.mode = Mode::kFunction;
      r.toolChoice.function = name->get<std::string>();
    } else {
      return fieldType("tool_choice", "a string or an object");
    }
  }
  std::optional<std::string> toolPrompt;
  TG_RETURN_IF_ERROR(readString(j, "tool_prompt", toolPrompt));
  r.toolPrompt = toolPrompt.value_or("");
  if (r.responseFormat && !r.tools.is_null() && !r.tools.empty() &&
      r.toolChoice.mode != ToolChoice::Mode::kNone)
    return invalidArgumentError("Grammar and tools are mutually exclusive");
  return r;
}

GenerateRequest ChatCompletionRequest::toGenerate(std::string prompt) const {
  GenerateRequest g;
  g.inputs = std::move(prompt);
  g.addSpecialTokens = false;  // the template placed them
  GenerateParameters& p = g.parameters;
  p.topP = topP;
  p.seed = seed;
  p.frequencyPenalty = frequencyPenalty;
  p.presencePenalty = presencePenalty;
  p.maxNewTokens = maxTokens;  // unset: fill up to max_total_tokens
  const float t = temperature.value_or(1.0f);
  if (t > 0.0f) {
    p.doSample = true;
    p.temperature = temperature;
  } else if (t < 0.0f) {
    p.temperature = t;  // refused by validation
  }
  p.stop = stop;
  p.details = true;
  if (logprobs) p.topNTokens = topLogprobs;  // top_logprobs means nothing without logprobs
  p.grammar = responseFormat;
  return g;
}

StatusOr<GenerateRequest> parseGenerateRequest(std::string_view body) {
  TG_ASSIGN_OR_RETURN(json j, parseBody(body));
  GenerateRequest r;
  auto inputs = j.find("inputs");
  if (inputs == j.end())
    return invalidArgumentError(
        "Failed to deserialize the JSON body into the target type: missing field `inputs`");
  if (!inputs->is_string()) return fieldType("inputs", "a string");
  r.inputs = inputs->get<std::string>();
  if (auto s = j.find("stream"); s != j.end() && !s->is_null()) {
    if (!s->is_boolean()) return fieldType("stream", "a boolean");
    r.stream = s->get<bool>();
  }
  if (auto s = j.find("add_special_tokens"); s != j.end() && !s->is_null()) {
    if (!s->is_boolean()) return fieldType("add_special_tokens", "a boolean");
    r.addSpecialTokens = s->get<bool>();
  }
  auto params = j.find("parameters");
  if (params == j.end() || params->is_null()) {
    // TGI's default_parameters(), for a request without them: sampling (with "parameters": {} a
    // request is greedy), and max_new_tokens up to the budget.
    r.parameters.doSample = true;
    return r;
  }
  if (!params->is_object()) return fieldType("parameters", "an object");
  const json& p = *params;
  GenerateParameters& g = r.parameters;
  TG_RETURN_IF_ERROR(readNumber(p, "best_of", g.bestOf));
  TG_RETURN_IF_ERROR(readNumber(p, "temperature", g.temperature));
  TG_RETURN_IF_ERROR(readNumber(p, "repetition_penalty", g.repetitionPenalty));
  TG_RETURN_IF_ERROR(readNumber(p, "frequency_penalty", g.frequencyPenalty));
  TG_RETURN_IF_ERROR(readNumber(p, "top_k", g.topK));
  TG_RETURN_IF_ERROR(readNumber(p, "top_p", g.topP));
  TG_RETURN_IF_ERROR(readNumber(p, "typical_p", g.typicalP));
  TG_RETURN_IF_ERROR(readBool(p, "do_sample", g.doSample));
  if (auto it = p.find("max_new_tokens"); it != p.end()) {
    g.maxNewTokens.reset();  // explicit null: fill up to max_total_tokens
    TG_RETURN_IF_ERROR(readNumber(p, "max_new_tokens", g.maxNewTokens));
  }
  if (auto it = p.find("return_full_text"); it != p.end() && !it->is_null()) {
    if (!it->is_boolean()) return fieldType("parameters.return_full_text", "a boolean");
    g.returnFullText = it->get<bool>();
  }
  if (auto it = p.find("stop"); it != p.end() && !it->is_null()) {
    if (!it->is_array()) return fieldType("parameters.stop", "a list of strings");
    TG_RETURN_IF_ERROR(readStrings(p, "stop", g.stop, "parameters."));
  }
  TG_RETURN_IF_ERROR(readNumber(p, "truncate", g.truncate));
  TG_RETURN_IF_ERROR(readBool(p, "watermark", g.watermark));
  TG_RETURN_IF_ERROR(readBool(p, "details", g.details));
  TG_RETURN_IF_ERROR(readBool(p, "decoder_input_details", g.decoderInputDetails));
  TG_RETURN_IF_ERROR(readNumber(p, "seed", g.seed));
  TG_RETURN_IF_ERROR(readNumber(p, "top_n_tokens", g.topNTokens));
  if (auto it = p.find("grammar"); it != p.end() && !it->is_null()) {
    TG_ASSIGN_OR_RETURN(g.grammar, parseGrammar(*it, "parameters.grammar"));
  }
  TG_RETURN_IF_ERROR(readString(p, "adapter_id", g.adapterId, "parameters."));
  return r;
}

StatusOr<std::optional<Grammar>> parseGrammar(const json& j, const std::string& field) {
  if (!j.is_object()) return fieldType(field, "an object");
  auto type = j.find("type");
  if (type == j.end() || !type->is_string())
    return fieldType(field + ".type",
                     "one of \"json\", \"json_object\", \"json_schema\", \"regex\"");
  const std::string t = type->get<std::string>();
  const auto value = j.find("value");
  const bool hasValue = value != j.end() && !value->is_null();
  Grammar g;
  // A schema given as an object, or as a string of JSON (TGI re-parses strings).
  auto schemaText = [&](const json& v, const std::string& name) -> StatusOr<std::string> {
    if (v.is_object() || v.is_boolean())
      return v.dump(-1, ' ', false, json::error_handler_t::replace);
    if (v.is_string()) {
      auto parsed = parseOrderedJson(v.get<std::string>(), name);
      if (!parsed.ok())
        return invalidArgumentError("grammar is not valid: " + parsed.status().message());
      if (!parsed->is_object() && !parsed->is_boolean())
        return invalidArgumentError("grammar is not valid: " + name +
                                    " is not a JSON Schema object");
      return parsed->dump(-1, ' ', false, json::error_handler_t::replace);
    }
    return fieldType(name, "a JSON Schema (an object, or a string of JSON)");
  };
  if (t == "text") return std::optional<Grammar>();
  if (t == "json" || t == "json_object") {
    g.type = Grammar::Type::kJson;
    if (hasValue) {
      TG_ASSIGN_OR_RETURN(g.value, schemaText(*value, field + ".value"));
    } else if (t == "json_object") {
      g.value = R"({"type":"object"})";  // OpenAI's JSON mode: any object
    } else {
      return invalidArgumentError("Failed to deserialize the JSON body into the target type: " +
                                  field + ": missing field `value`");
    }
  } else if (t == "json_schema") {
    // TGI's {"type": "json_schema", "value": {"name", "schema", "strict"}} or OpenAI's
    // {"type": "json_schema", "json_schema": {...}}.
    auto config = hasValue ? value : j.find("json_schema");
    const std::string name = field + (hasValue ? ".value" : ".json_schema");
    if (config == j.end() || !config->is_object())
      return fieldType(name, "an object with `schema`");
    auto schema = config->find("schema");
    if (schema == config->end() || schema->is_null()) {
      return invalidArgumentError("Failed to deserialize the JSON body into the target type: " +
                                  name + ": missing field `schema`");
    }
    g.type = Grammar::Type::kJson;
    TG_ASSIGN_OR_RETURN(g.value, schemaText(*schema, name + ".schema"));
  } else if (t == "regex") {
    if (!hasValue || !value->is_string())
      return fieldType(field + ".value", "a string (the regex)");
    // An empty pattern is no grammar, as in TGI (its shards build no grammar processor for "").
    if (value->get_ref<const std::string&>().empty()) return std::optional<Grammar>();
    g.type = Grammar::Type::kRegex;
    g.value = value->get<std::string>();
  } else {
    return invalidArgumentError("Failed to deserialize the JSON body into the target type: " +
                                field + ".type: unknown variant `" + t +
                                "`, expected one of `json`, `json_object`, `json_schema`, `regex`");
  }
  return std::optional<Grammar>(std::move(g));
}

Validator::Validator(const tokenizer::Tokenizer& tokenizer, ValidationLimits limits)
    : tokenizer_(tokenizer),
      limits_(limits),
      grammars_(std::make_unique<grammar::GrammarCache>(nullptr, 256)) {}

Validator::~Validator() = default;

Status Validator::checkGrammar(const Grammar& g) const {
  auto compiled = grammars_->grammar(
      g.type == Grammar::Type::kJson ? grammar::Kind::kJsonSchema : grammar::Kind::kRegex, g.value);
  if (!compiled.ok())
    return invalidArgumentError("grammar is not valid: " + compiled.status().message());
  return okStatus();
}

StatusOr<tokenizer::Encoding> Validator::tokenize(const std::string& inputs, bool addSpecialTokens,
                                                  std::optional<uint32_t> truncate) const {
  if (inputs.empty()) return invalidArgumentError("`inputs` cannot be empty");
  auto encoding = tokenizer_.encode(inputs, addSpecialTokens);
  if (!encoding.ok()) return invalidArgumentError("tokenizer error " + encoding.status().message());
  if (truncate) encoding->truncateLeft(*truncate);
  if (encoding->size() > limits_.maxInputTokens) {
    return invalidArgumentError("`inputs` must have less than " +
                                std::to_string(limits_.maxInputTokens) +
                                " tokens. Given: " + std::to_string(encoding->size()));
  }
  return encoding;
}

StatusOr<ValidRequest> Validator::validate(const GenerateRequest& request,
                                           Endpoint endpoint) const {
  const GenerateParameters& p = request.parameters;
  auto error = [](std::string message) { return invalidArgumentError(std::move(message)); };
  ValidRequest v;
  v.bestOf = p.bestOf.value_or(1);
  if (v.bestOf == 0 || v.bestOf > limits_.maxBestOf) {
    return error("`best_of` must be > 0 and <= " + std::to_string(limits_.maxBestOf) +
                 ". Given: " + std::to_string(v.bestOf));
  }
  const bool sampling = p.doSample || p.temperature || p.topK || p.topP || p.typicalP;
  if (v.bestOf > 1 && !sampling) return error("you must use sampling when `best_of` is > 1");
  if (v.bestOf > 1 && endpoint == Endpoint::kGenerateStream) {
    return error("`best_of` != 1 is not supported when streaming tokens");
  }
  v.temperature = p.temperature.value_or(1.0f);
  if (!(v.temperature > 0.0f)) return error("`temperature` must be strictly positive");
  v.repetitionPenalty = p.repetitionPenalty.value_or(1.0f);
  if (!(v.repetitionPenalty > 0.0f)) return error("`repetition_penalty` must be strictly positive");
  v.frequencyPenalty = p.frequencyPenalty.value_or(0.0f);
  if (!(v.frequencyPenalty >= -2.0f && v.frequencyPenalty <= 2.0f)) {
    return error("`frequency_penalty` must be >= -2.0 and <= 2.0");
  }
  v.presencePenalty = p.presencePenalty.value_or(0.0f);
  if (!(v.presencePenalty >= -2.0f && v.presencePenalty <= 2.0f)) {
    return error("`presence_penalty` must be >= -2.0 and <= 2.0");
  }
  if (p.topP && !(*p.topP > 0.0f && *p.topP < 1.0f))
    return error("`top_p` must be > 0.0 and < 1.0");
  v.topP = p.topP.value_or(1.0f);
  if (p.typicalP && !(*p.typicalP > 0.0f && *p.typicalP < 1.0f))
    return error("`typical_p` must be > 0.0 and < 1.0");
  v.typicalP = p.typicalP.value_or(1.0f);
  if (p.topK && *p.topK <= 0) return error("`top_k` must be strictly positive");
  v.topK = p.topK ? static_cast<uint32_t>(*p.topK) : 0;
  // The ranges the shard checks again (finite, bounded): one definition for both.
  TG_RETURN_IF_ERROR(checkSamplingValues({.temperature = v.temperature,
                                          .repetitionPenalty = v.repetitionPenalty,
                                          .frequencyPenalty = v.frequencyPenalty,
                                          .topP = v.topP,
                                          .typicalP = v.typicalP,
                                          .topK = v.topK}));
  if (p.maxNewTokens && *p.maxNewTokens == 0)
    return error("`max_new_tokens` must be strictly positive");
  if (p.stop.size() > limits_.maxStopSequences) {
    return error("`stop` supports up to " + std::to_string(limits_.maxStopSequences) +
                 " stop sequences. Given: " + std::to_string(p.stop.size()));
  }
  if (p.seed && v.bestOf > 1) return error("`seed` must not be set when `best_of` > 1");
  v.seed =
      p.seed ? *p.seed : std::random_device()() * uint64_t{4294967296} + std::random_device()();
  v.topNTokens = p.topNTokens.value_or(0);
  if (v.topNTokens > limits_.maxTopNTokens) {
    return error("`top_n_tokens` must be >= 0 and <= " + std::to_string(limits_.maxTopNTokens) +
                 ". Given: " + std::to_string(v.topNTokens));
  }
  if (p.decoderInputDetails && endpoint == Endpoint::kGenerateStream) {
    return error("`decoder_input_details` == true is not supported when streaming tokens");
  }
  // Features textgen does not have yet: refused, never ignored.
  if (p.adapterId && !p.adapterId->empty())
    return unimplementedError("`adapter_id` (LoRA adapters) is not supported by this server yet");
  if (request.inputs.empty()) return error("`inputs` cannot be empty");
  if (p.truncate && (*p.truncate == 0 || *p.truncate > limits_.maxInputTokens)) {
    return error("`truncate` must be strictly positive and less than " +
                 std::to_string(limits_.maxInputTokens) +
                 ". Given: " + std::to_string(*p.truncate));
  }
  auto encoding = tokenizer_.encode(request.inputs, request.addSpecialTokens);
  if (!encoding.ok()) return error("tokenizer error " + encoding.status().message());
  v.inputs = request.inputs;
  for (const char c : request.inputs)
    v.inputCharacters += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  if (p.truncate && encoding->size() > *p.truncate) {
    encoding->truncateLeft(*p.truncate);
    v.inputs = tokenizer_.decode(encoding->ids, false);
  }
  v.inputIds = encoding->ids;
  v.inputLength = static_cast<uint32_t>(encoding->size());
  v.maxNewTokens =
      p.maxNewTokens
          ? *p.maxNewTokens
          : (limits_.maxTotalTokens > v.inputLength ? limits_.maxTotalTokens - v.inputLength : 0);
  const uint64_t total = uint64_t{v.inputLength} + v.maxNewTokens;
  if (total > limits_.maxTotalTokens) {
    return error(
        "`inputs` tokens + `max_new_tokens` must be <= " + std::to_string(limits_.maxTotalTokens) +
        ". Given: " + std::to_string(v.inputLength) + " `inputs` tokens and " +
        std::to_string(v.maxNewTokens) + " `max_new_tokens`");
  }
  if (v.inputLength > limits_.maxInputTokens) {
    return error("`inputs` must have less than " + std::to_string(limits_.maxInputTokens) +
                 " tokens. Given: " + std::to_string(v.inputLength));
  }
  v.doSample = p.doSample;
  v.watermark = p.watermark;
  v.stop = p.stop;
  // decoder_input_details asks for the details too (TGI: details || decoder_input_details).
  v.details = p.details || p.decoderInputDetails;
  v.decoderInputDetails = p.decoderInputDetails;
  v.returnFullText = !limits_.encoderDecoder && p.returnFullText.value_or(false);
  if (v.returnFullText) v.fullTextPrefix = request.inputs;
  v.addSpecialTokens = request.addSpecialTokens;
  if (p.grammar) {
    if (limits_.disableGrammar) return error("grammar is not supported");
    TG_RETURN_IF_ERROR(checkGrammar(*p.grammar));
    v.grammar = p.grammar;
  }
  return v;
}

}  // namespace textgen::router
