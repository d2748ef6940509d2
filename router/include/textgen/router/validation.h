// Request validation with TGI's shapes, defaults, rules and messages: a GenerateRequest as JSON in,
// a ValidRequest (tokenized, truncated, defaults applied) or a ValidationError (HTTP 422) out.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "textgen/base/status_or.h"
#include "textgen/tokenizer/tokenizer.h"
#include "textgen/tracing/tracing.h"

namespace textgen::grammar {
class GrammarCache;
}  // namespace textgen::grammar

namespace textgen::router {

// TGI's `grammar` ({"type": "json" | "json_object" | "json_schema" | "regex", "value": ...}) and
// OpenAI's response_format, typed: the output must match a JSON Schema (its JSON text) or a regex.
struct Grammar {
  enum class Type { kJson, kRegex };
  Type type = Type::kJson;
  std::string value;
};

// Parses a grammar object (`field` names it in errors). OpenAI's response_format shapes are
// accepted too: {"type": "json_object"} (any JSON object), {"type": "json_schema", "json_schema":
// {"schema": ...}}; {"type": "text"} is no grammar (nullopt).
StatusOr<std::optional<Grammar>> parseGrammar(const nlohmann::ordered_json& j,
                                              const std::string& field);

// The "parameters" object of TGI's GenerateRequest, absent fields left unset.
struct GenerateParameters {
  std::optional<uint32_t> bestOf;
  std::optional<float> temperature;
  std::optional<float> repetitionPenalty;
  std::optional<float> frequencyPenalty;
  std::optional<float> presencePenalty;  // OpenAI's routes only (not in TGI's parameters)
  std::optional<int32_t> topK;
  std::optional<float> topP;
  std::optional<float> typicalP;
  bool doSample = false;
  // Unset (absent or null): up to max_total_tokens - the prompt's tokens, as TGI 3.
  std::optional<uint32_t> maxNewTokens;
  std::optional<bool> returnFullText;
  std::vector<std::string> stop;
  std::optional<uint32_t> truncate;
  bool watermark = false;
  bool details = false;
  bool decoderInputDetails = false;
  std::optional<uint64_t> seed;
  std::optional<uint32_t> topNTokens;
  std::optional<Grammar> grammar;
  std::optional<std::string> adapterId;
};

struct GenerateRequest {
  std::string inputs;
  GenerateParameters parameters;
  bool stream = false;  // POST / only
  bool addSpecialTokens = true;
};

// Parses TGI's request JSON; a malformed body, nesting past kMaxJsonDepth, or a field of the wrong
// type is a validation error naming the field. Never throws.
StatusOr<GenerateRequest> parseGenerateRequest(std::string_view body);

// OpenAI's POST /v1/completions body, typed. Unknown fields are ignored, as OpenAI's and TGI's.
struct CompletionRequest {
  std::vector<std::string> prompts;  // `prompt`: a string or a list of strings
  std::optional<std::string> model;
  std::optional<std::string> suffix;
  bool stream = false;
  bool includeUsage = false;  // stream_options.include_usage
  std::optional<uint32_t> maxTokens;
  std::optional<float> temperature;
  std::optional<float> topP;
  std::optional<uint64_t> seed;
  std::optional<float> frequencyPenalty;
  std::optional<float> presencePenalty;
  std::optional<float> repetitionPenalty;
  std::vector<std::string> stop;
  // TGI's GenerateRequest for prompt `index`: sampling unless temperature is 0.
  GenerateRequest toGenerate(size_t index) const;
};

// Same rules as parseGenerateRequest.
StatusOr<CompletionRequest> parseCompletionRequest(std::string_view body);

// OpenAI's tool_choice: "auto" (the default with tools), "none", "required", or one function.
struct ToolChoice {
  enum class Mode { kAuto, kNone, kRequired, kFunction };
  Mode mode = Mode::kAuto;
  std::string function;  // kFunction
};

// OpenAI's POST /v1/chat/completions body (TGI's ChatRequest), typed. `messages` and `tools` stay
// JSON: the chat template reads them (and checks their shapes). Unknown fields are ignored.
struct ChatCompletionRequest {
  nlohmann::ordered_json messages;  // a non-empty array of objects
  std::optional<std::string> model;
  bool stream = false;
  bool includeUsage = false;  // stream_options.include_usage
  bool logprobs = false;
  std::optional<uint32_t> topLogprobs;
  std::vector<std::string> stop;
  std::optional<uint64_t> seed;
  std::optional<uint32_t> maxTokens;  // max_completion_tokens, else max_tokens
  std::optional<float> temperature;
  std::optional<float> topP;
  std::optional<float> frequencyPenalty;
  std::optional<float> presencePenalty;
  std::optional<Grammar> responseFormat;
  nlohmann::ordered_json tools;  // null, or the OpenAI tools array (checked by toolGrammar)
  ToolChoice toolChoice;
  std::string toolPrompt;  // TGI's tool_prompt (empty: its default)
  // The GenerateRequest for the rendered prompt: sampling unless temperature is 0, no special
  // tokens added (the template has them), TGI's mapping of the rest.
  GenerateRequest toGenerate(std::string prompt) const;
};

// Same rules as parseGenerateRequest; `n` other than 1 is refused.
StatusOr<ChatCompletionRequest> parseChatRequest(std::string_view body);

struct ValidationLimits {
  uint32_t maxBestOf = 2;
  uint32_t maxStopSequences = 4;
  uint32_t maxTopNTokens = 5;
  uint32_t maxInputTokens = 1024;
  uint32_t maxTotalTokens = 2048;
  // The model is an encoder-decoder (T5): return_full_text does not apply (the answer is not a
  // continuation of the prompt).
  bool encoderDecoder = false;
  // TGI's --disable-grammar-support: a grammar (and so response_format and tools) is a 422.
  bool disableGrammar = false;
};

// What the scheduler needs: a request ready for the shards.
struct ValidRequest {
  // The request's "infer" span when it is traced: the parent of the Prefill and Decode spans of
  // the steps it takes part in (set by the route, after validation).
  std::optional<tracing::SpanContext> trace = {};
  std::string inputs;  // after truncation (the decoded kept tokens when truncated)
  std::vector<uint32_t> inputIds;
  uint32_t inputLength = 0;
  uint64_t inputCharacters =
      0;  // the request's inputs in Unicode characters (x-compute-characters)
  uint32_t bestOf = 1;
  float temperature = 1.0f;
  float repetitionPenalty = 1.0f;
  float frequencyPenalty = 0.0f;
  float presencePenalty = 0.0f;
  uint32_t topK = 0;
  float topP = 1.0f;
  float typicalP = 1.0f;
  bool doSample = false;
  bool watermark = false;  // Kirchenbauer's watermark on this request's tokens
  uint64_t seed = 0;
  uint32_t maxNewTokens = 0;
  std::vector<std::string> stop;
  uint32_t topNTokens = 0;
  bool details = false;
  bool decoderInputDetails = false;
  bool returnFullText = false;
  // What return_full_text puts before the generated text: the request's own `inputs`, as TGI
  // does, even when `truncate` cut what the model saw (`inputs` above is then the kept part).
  std::string fullTextPrefix;
  bool addSpecialTokens = true;
  std::optional<Grammar> grammar;  // compiled once by validation (its errors are 422s)
};

enum class Endpoint { kGenerate, kGenerateStream, kCompletions };

class Validator {
 public:
  Validator(const tokenizer::Tokenizer& tokenizer, ValidationLimits limits);
  ~Validator();
  // INVALID_ARGUMENT with TGI's message (HTTP 422, error_type "validation"); UNIMPLEMENTED for a
  // parameter whose feature textgen does not have yet (also 422).
  StatusOr<ValidRequest> validate(const GenerateRequest& request, Endpoint endpoint) const;
  // `inputs` tokenized under the same limits as validate() (at most max_input_tokens, counted after
  // `truncate`: the last that many tokens kept, as TGI's /tokenize does); /tokenize.
  StatusOr<tokenizer::Encoding> tokenize(const std::string& inputs, bool addSpecialTokens,
                                         std::optional<uint32_t> truncate = std::nullopt) const;
  const ValidationLimits& limits() const { return limits_; }
  // INVALID_ARGUMENT "grammar is not valid: ..." (TGI's message) unless it compiles within the
  // grammar engine's bounds. Compiled grammars are cached.
  Status checkGrammar(const Grammar& g) const;

 private:
  const tokenizer::Tokenizer& tokenizer_;
  ValidationLimits limits_;
  std::unique_ptr<grammar::GrammarCache> grammars_;
};

}  // namespace textgen::router
