// A request body through the router's request parsing and validation — TGI's (parseGenerateRequest,
// then Validator::validate for each endpoint, grammars compiled), OpenAI's completions
// (parseCompletionRequest, each prompt through toGenerate and validate) and chat
// (parseChatRequest), and /tokenize's Validator::tokenize — with the
// tokenizer of the router's test model, under the default limits and under small ones. A request
// that validates satisfies every limit it was checked against: the scheduler and the shards rely on
// that.
#include "fuzz_util.h"
#include "textgen/router/validation.h"

namespace {

using namespace textgen::router;

const textgen::tokenizer::Tokenizer& tokenizer() {
  static const auto tok = [] {
    const std::string dir = textgen::fuzz::fixturesDir() + "/models/llama-gqa";
    auto t = textgen::tokenizer::Tokenizer::fromDirectory(dir);
    if (!t.ok()) textgen::fuzz::fail(__FILE__, __LINE__, dir + ": " + t.status().toString());
    return std::move(*t);
  }();
  return *tok;
}

void checkValid(const ValidRequest& v, const ValidationLimits& l, const std::string& body) {
  FUZZ_CHECK(v.inputLength == v.inputIds.size(), body);
  FUZZ_CHECK(v.inputLength >= 1, "a valid request with no input tokens: " + body);
  FUZZ_CHECK(v.inputLength <= l.maxInputTokens, body);
  FUZZ_CHECK(v.maxNewTokens >= 1, "a valid request with max_new_tokens 0: " + body);
  FUZZ_CHECK(uint64_t{v.inputLength} + v.maxNewTokens <= l.maxTotalTokens, body);
  FUZZ_CHECK(v.bestOf >= 1 && v.bestOf <= l.maxBestOf, body);
  FUZZ_CHECK(v.stop.size() <= l.maxStopSequences, body);
  FUZZ_CHECK(v.topNTokens <= l.maxTopNTokens, body);
  FUZZ_CHECK(v.temperature > 0.0f && v.repetitionPenalty > 0.0f, body);
  FUZZ_CHECK(v.topP > 0.0f && v.topP <= 1.0f && v.typicalP > 0.0f && v.typicalP <= 1.0f, body);
  FUZZ_CHECK(v.frequencyPenalty >= -2.0f && v.frequencyPenalty <= 2.0f, body);
  for (uint32_t id : v.inputIds) FUZZ_CHECK(id < tokenizer().vocabSize(), body);
}

void validateEverywhere(const GenerateRequest& request, const std::string& body) {
  static const Validator defaults(tokenizer(), ValidationLimits{});
  static const Validator small(tokenizer(), ValidationLimits{.maxBestOf = 1,
                                                             .maxStopSequences = 1,
                                                             .maxTopNTokens = 1,
                                                             .maxInputTokens = 8,
                                                             .maxTotalTokens = 12});
  for (const Validator* validator : {&defaults, &small}) {
    for (Endpoint e : {Endpoint::kGenerate, Endpoint::kGenerateStream, Endpoint::kCompletions}) {
      auto v = validator->validate(request, e);
      if (v.ok()) {
        checkValid(*v, validator->limits(), body);
      } else {
        FUZZ_CHECK(!v.status().message().empty(), "an error without a message");
      }
    }
    auto t = validator->tokenize(request.inputs, request.addSpecialTokens);
    if (t.ok()) FUZZ_CHECK(t->size() <= validator->limits().maxInputTokens, body);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tokenizer();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  auto request = parseGenerateRequest(body);
  if (request.ok()) {
    validateEverywhere(*request, body);
  } else {
    FUZZ_CHECK(!request.status().message().empty(), "an error without a message");
  }
  auto completion = parseCompletionRequest(body);
  if (completion.ok()) {
    for (size_t i = 0; i < completion->prompts.size() && i < 4; ++i)
      validateEverywhere(completion->toGenerate(i), body);
  } else {
    FUZZ_CHECK(!completion.status().message().empty(), "an error without a message");
  }
  // OpenAI's chat body: parsed, then its GenerateRequest (the messages stand in for the rendered
  // prompt: the template has its own fuzzer) through validation, grammar compile included.
  auto chat = parseChatRequest(body);
  if (chat.ok()) {
    FUZZ_CHECK(chat->messages.is_array() && !chat->messages.empty(), body);
    validateEverywhere(chat->toGenerate(chat->messages.dump()), body);
  } else {
    FUZZ_CHECK(!chat.status().message().empty(), "an error without a message");
  }
  return 0;
}
