// TGI's validation rules, defaults and messages.
#include "textgen/router/validation.h"

#include <gtest/gtest.h>

namespace textgen::router {
namespace {

class ValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t =
        tokenizer::Tokenizer::fromDirectory(std::string(TEXTGEN_TOKENIZER_FIXTURES) + "/llama2");
    ASSERT_TRUE(t.ok()) << t.status();
    tok_ = std::move(*t);
    validator_ = std::make_unique<Validator>(*tok_, ValidationLimits{.maxBestOf = 2,
                                                                     .maxStopSequences = 2,
                                                                     .maxTopNTokens = 5,
                                                                     .maxInputTokens = 32,
                                                                     .maxTotalTokens = 48});
  }
  StatusOr<ValidRequest> check(const std::string& body, Endpoint e = Endpoint::kGenerate) {
    auto r = parseGenerateRequest(body);
    if (!r.ok()) return r.status();
    return validator_->validate(*r, e);
  }
  std::string message(const std::string& body, Endpoint e = Endpoint::kGenerate) {
    auto r = check(body, e);
    return r.ok() ? "OK" : r.status().message();
  }
  std::unique_ptr<tokenizer::Tokenizer> tok_;
  std::unique_ptr<Validator> validator_;
};

TEST_F(ValidationTest, DefaultsAsTgi) {
  Validator roomy(*tok_, ValidationLimits{.maxInputTokens = 1024, .maxTotalTokens = 2048});
  // TGI 3: max_new_tokens fills the budget; "parameters": {} is greedy (without parameters a
  // request samples: ARequestWithoutParametersSamplesAsTgi).
  auto v = roomy.validate(*parseGenerateRequest(R"({"inputs": "Hello world", "parameters": {}})"),
                          Endpoint::kGenerate);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->maxNewTokens, 2048u - v->inputLength);
  EXPECT_EQ(v->temperature, 1.0f);
  EXPECT_EQ(v->topP, 1.0f);
  EXPECT_EQ(v->topK, 0u);
  EXPECT_FALSE(v->doSample);
  EXPECT_EQ(v->inputIds.front(), 1u);  // <s> added (llama2 config adds bos)
  EXPECT_EQ(v->inputLength, v->inputIds.size());
}

TEST_F(ValidationTest, ReturnFullTextDoesNotApplyToAnEncoderDecoder) {
  const auto body = R"({"inputs": "Hello world", "parameters": {"return_full_text": true}})";
  Validator decoder(*tok_, ValidationLimits{.maxInputTokens = 1024, .maxTotalTokens = 2048});
  auto v = decoder.validate(*parseGenerateRequest(body), Endpoint::kGenerate);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->returnFullText);
  Validator seq2seq(
      *tok_,
      ValidationLimits{.maxInputTokens = 1024, .maxTotalTokens = 2048, .encoderDecoder = true});
  v = seq2seq.validate(*parseGenerateRequest(body), Endpoint::kGenerate);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_FALSE(v->returnFullText);
  EXPECT_EQ(v->fullTextPrefix, "");
}

TEST_F(ValidationTest, TheFullTextStartsWithTheRequestsInputsEvenWhenTruncated) {
  Validator decoder(*tok_, ValidationLimits{.maxInputTokens = 1024, .maxTotalTokens = 2048});
  const auto body =
      R"({"inputs": "one two three four five six", "parameters": {"return_full_text": true,
          "truncate": 2, "max_new_tokens": 2}})";
  auto v = decoder.validate(*parseGenerateRequest(body), Endpoint::kGenerate);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->inputLength, 2u);
  EXPECT_NE(v->inputs, "one two three four five six");  // what the model sees: the kept tokens
  EXPECT_EQ(v->fullTextPrefix, "one two three four five six");
  v = decoder.validate(*parseGenerateRequest(R"({"inputs": "one two", "parameters": {}})"),
                       Endpoint::kGenerate);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->fullTextPrefix, "");
}

TEST_F(ValidationTest, DecoderInputDetailsBringTheDetails) {
  Validator decoder(*tok_, ValidationLimits{.maxInputTokens = 1024, .maxTotalTokens = 2048});
  auto v =
      decoder.validate(*parseGenerateRequest(
                           R"({"inputs": "Hello", "parameters": {"decoder_input_details": true}})"),
                       Endpoint::kGenerate);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->details);
  EXPECT_TRUE(v->decoderInputDetails);
}

TEST_F(ValidationTest, MaxNewTokensUnsetOrNullFillsTheBudgetAsTgi3) {
  for (const char* body : {R"({"inputs": "Hello"})", R"({"inputs": "Hello", "parameters": {}})",
                           R"({"inputs": "Hello", "parameters": {"max_new_tokens": null}})"}) {
    auto v = check(body);
    ASSERT_TRUE(v.ok()) << body << ": " << v.status();
    EXPECT_EQ(v->maxNewTokens, 48u - v->inputLength) << body;
  }
  const size_t n = tok_->encode("Hello")->size();
  EXPECT_EQ(message(R"({"inputs": "Hello", "parameters": {"max_new_tokens": 100}})"),
            "`inputs` tokens + `max_new_tokens` must be <= 48. Given: " + std::to_string(n) +
                " `inputs` tokens and 100 `max_new_tokens`");
}

TEST_F(ValidationTest, ARequestWithoutParametersSamplesAsTgi) {
  // TGI's default_parameters() has do_sample: true; "parameters": {} is greedy.
  auto bare = parseGenerateRequest(R"({"inputs": "Hello"})");
  ASSERT_TRUE(bare.ok());
  EXPECT_TRUE(bare->parameters.doSample);
  EXPECT_FALSE(bare->parameters.maxNewTokens);
  auto null = parseGenerateRequest(R"({"inputs": "Hello", "parameters": null})");
  ASSERT_TRUE(null.ok());
  EXPECT_TRUE(null->parameters.doSample);
  auto empty = parseGenerateRequest(R"({"inputs": "Hello", "parameters": {}})");
  ASSERT_TRUE(empty.ok());
  EXPECT_FALSE(empty->parameters.doSample);
}

TEST_F(ValidationTest, RulesAndMessages) {
  const std::string p = R"({"inputs": "Hello", "parameters": {"max_new_tokens": 4, )";
  EXPECT_EQ(message(p + R"("temperature": 0}})"), "`temperature` must be strictly positive");
  EXPECT_EQ(message(p + R"("repetition_penalty": 0}})"),
            "`repetition_penalty` must be strictly positive");
  EXPECT_EQ(message(p + R"("frequency_penalty": 2.5}})"),
            "`frequency_penalty` must be >= -2.0 and <= 2.0");
  EXPECT_EQ(message(p + R"("top_p": 1.0}})"), "`top_p` must be > 0.0 and < 1.0");
  EXPECT_EQ(message(p + R"("typical_p": 0}})"), "`typical_p` must be > 0.0 and < 1.0");
  EXPECT_EQ(message(p + R"("top_k": 0}})"), "`top_k` must be strictly positive");
  EXPECT_EQ(message(p + R"("best_of": 3}})"), "`best_of` must be > 0 and <= 2. Given: 3");
  EXPECT_EQ(message(p + R"("best_of": 2}})"), "you must use sampling when `best_of` is > 1");
  EXPECT_EQ(message(p + R"("best_of": 2, "do_sample": true, "seed": 1}})"),
            "`seed` must not be set when `best_of` > 1");
  EXPECT_EQ(message(p + R"("best_of": 2, "do_sample": true}})", Endpoint::kGenerateStream),
            "`best_of` != 1 is not supported when streaming tokens");
  EXPECT_EQ(message(p + R"("stop": ["a", "b", "c"]}})"),
            "`stop` supports up to 2 stop sequences. Given: 3");
  EXPECT_EQ(message(p + R"("top_n_tokens": 6}})"),
            "`top_n_tokens` must be >= 0 and <= 5. Given: 6");
  EXPECT_EQ(message(p + R"("truncate": 0}})"),
            "`truncate` must be strictly positive and less than 32. Given: 0");
  EXPECT_EQ(message(p + R"("decoder_input_details": true}})", Endpoint::kGenerateStream),
            "`decoder_input_details` == true is not supported when streaming tokens");
  EXPECT_EQ(message(R"({"inputs": "Hello", "parameters": {"max_new_tokens": 0}})"),
            "`max_new_tokens` must be strictly positive");
  EXPECT_EQ(message(R"({"inputs": ""})"), "`inputs` cannot be empty");
  // Over max_input_tokens (32) but within max_total_tokens (48): TGI checks the total first.
  std::string longInput = "x";
  while (tok_->encode(longInput)->size() < 40) longInput += " x";
  EXPECT_EQ(message(R"({"inputs": ")" + longInput + R"(", "parameters": {"max_new_tokens": 1}})"),
            "`inputs` must have less than 32 tokens. Given: 40");
  EXPECT_NE(message(R"({"inputs": ")" + longInput + R"(", "parameters": {"max_new_tokens": 9}})")
                .find("must be <= 48"),
            std::string::npos);
}

TEST_F(ValidationTest, WatermarkIsABooleanPassedOn) {
  auto w = check(R"({"inputs": "Hi", "parameters": {"max_new_tokens": 4, "watermark": true}})");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE(w->watermark);
  auto off = check(R"({"inputs": "Hi", "parameters": {"max_new_tokens": 4}})");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->watermark);
  auto bad = check(R"({"inputs": "Hi", "parameters": {"watermark": "yes"}})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("watermark"), std::string::npos);
}

TEST_F(ValidationTest, UnimplementedFeaturesAreRefused) {
  EXPECT_EQ(check(R"({"inputs": "Hi", "parameters": {"adapter_id": "lora-1"}})").status().code(),
            StatusCode::kUnimplemented);
}

TEST_F(ValidationTest, GrammarsAreParsedAndCompiled) {
  auto json = check(
      R"({"inputs": "Hi", "parameters": {"max_new_tokens": 4, "grammar": {"type": "json", "value": {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}}}})");
  ASSERT_TRUE(json.ok()) << json.status().message();
  ASSERT_TRUE(json->grammar.has_value());
  EXPECT_EQ(json->grammar->type, Grammar::Type::kJson);
  // The schema's properties keep their order (the output emits them in that order).
  EXPECT_LT(json->grammar->value.find("\"b\""), json->grammar->value.find("\"a\""));
  auto asString = check(
      R"({"inputs": "Hi", "parameters": {"max_new_tokens": 4, "grammar": {"type": "json", "value": "{\"type\": \"boolean\"}"}}})");
  ASSERT_TRUE(asString.ok()) << asString.status().message();
  EXPECT_EQ(asString->grammar->value, R"({"type":"boolean"})");
  auto regex = check(
      R"({"inputs": "Hi", "parameters": {"max_new_tokens": 4, "grammar": {"type": "regex", "value": "[a-z]+"}}})");
  ASSERT_TRUE(regex.ok()) << regex.status().message();
  EXPECT_EQ(regex->grammar->type, Grammar::Type::kRegex);
  // An empty pattern is no grammar (TGI's shards build no grammar for ""): the request generates
  // freely instead of reaching a shard that refuses it.
  auto emptyRegex = check(
      R"({"inputs": "Hi", "parameters": {"max_new_tokens": 4, "grammar": {"type": "regex", "value": ""}}})");
  ASSERT_TRUE(emptyRegex.ok()) << emptyRegex.status().message();
  EXPECT_FALSE(emptyRegex->grammar.has_value());
  auto schema = check(
      R"({"inputs": "Hi", "parameters": {"max_new_tokens": 4, "grammar": {"type": "json_schema", "value": {"name": "x", "schema": {"type": "null"}}}}})");
  ASSERT_TRUE(schema.ok()) << schema.status().message();
  EXPECT_EQ(schema->grammar->value, R"({"type":"null"})");
  // Bad grammars are 422s that name the problem.
  for (const auto& [body, needle] : std::vector<std::pair<std::string, std::string>>{
           {R"({"type": "regex", "value": "(ab"})", "grammar is not valid"},
           {R"({"type": "regex", "value": "a{1,100000000}"})", "grammar is not valid"},
           {R"({"type": "regex", "value": 5})", "parameters.grammar.value"},
           {R"({"type": "json", "value": {"type": "integr"}})", "integr"},
           {R"({"type": "json", "value": "{nope"})", "grammar is not valid"},
           {R"({"type": "json"})", "missing field `value`"},
           {R"({"type": "json_schema", "value": {"name": "x"}})", "missing field `schema`"},
           {R"({"type": "yaml", "value": "x"})", "unknown variant `yaml`"},
           {R"("regex")", "parameters.grammar"},
       }) {
    auto r =
        check(R"({"inputs": "Hi", "parameters": {"max_new_tokens": 4, "grammar": )" + body + "}}");
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << body;
    EXPECT_NE(r.status().message().find(needle), std::string::npos)
        << body << ": " << r.status().message();
  }
}

TEST(ChatRequestTest, ParsesOpenAIsShapeAndMapsItLikeTGI) {
  auto r = parseChatRequest(R"({"model": "m", "messages": [{"role": "user", "content": "hi"}],
      "max_tokens": 5, "max_completion_tokens": 7, "temperature": 0, "top_logprobs": 2,
      "logprobs": true, "stop": "x", "seed": 3, "presence_penalty": 0.5,
      "stream": true, "stream_options": {"include_usage": true},
      "response_format": {"type": "json_object"}})");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->stream && r->includeUsage && r->logprobs);
  EXPECT_EQ(r->maxTokens, 7u);  // max_completion_tokens wins
  ASSERT_TRUE(r->responseFormat.has_value());
  EXPECT_EQ(r->responseFormat->value, R"({"type":"object"})");
  GenerateRequest g = r->toGenerate("prompt");
  EXPECT_FALSE(g.addSpecialTokens);
  EXPECT_FALSE(g.parameters.doSample);  // temperature 0: greedy
  EXPECT_EQ(g.parameters.topNTokens, 2u);
  EXPECT_EQ(g.parameters.presencePenalty, 0.5f);
  EXPECT_EQ(g.parameters.stop, std::vector<std::string>{"x"});
  EXPECT_TRUE(g.parameters.details);
  auto text = parseChatRequest(R"({"messages": [{"role": "user", "content": "hi"}],
      "response_format": {"type": "text"}, "tool_choice": {"type": "function", "function": {"name": "f"}}})");
  ASSERT_TRUE(text.ok()) << text.status().message();
  EXPECT_FALSE(text->responseFormat.has_value());
  EXPECT_EQ(text->toolChoice.mode, ToolChoice::Mode::kFunction);
  EXPECT_EQ(text->toolChoice.function, "f");
  EXPECT_TRUE(text->toGenerate("p").parameters.doSample);  // OpenAI samples by default
}

TEST(ChatRequestTest, BadBodiesNameTheProblem) {
  for (
      const auto& [body, needle] : std::vector<std::pair<std::string, std::string>>{
          {R"({})", "missing field `messages`"},
          {R"({"messages": {}})", "messages: invalid type"},
          {R"({"messages": []})", "`messages` cannot be empty"},
          {R"({"messages": [5]})", "messages[0]"},
          {R"({"messages": [{"content": "x"}]})", "missing field `role`"},
          {R"({"messages": [{"role": "user"}], "n": 3})", "`n` must be 1"},
          {R"({"messages": [{"role": "user"}], "tools": {}})", "tools: invalid type"},
          {R"({"messages": [{"role": "user"}], "tool_choice": "maybe"})", "`tool_choice` must be"},
          {R"({"messages": [{"role": "user"}], "tool_choice": {"type": "function"}})",
           "tool_choice.function.name"},
          {R"({"messages": [{"role": "user"}], "tools": [{}], "response_format": {"type": "json_object"}})",
           "mutually exclusive"},
          {R"({"messages": [{"role": "user"}], "stream_options": 1})", "stream_options"},
          {R"({"messages": [{"role": "user"}], "max_tokens": -1})", "max_tokens"},
      }) {
    auto r = parseChatRequest(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_NE(r.status().message().find(needle), std::string::npos)
        << body << ": " << r.status().message();
  }
}

TEST_F(ValidationTest, PresencePenaltyIsBounded) {
  CompletionRequest c;
  c.prompts = {"Hi"};
  c.presencePenalty = 2.5f;
  auto r = validator_->validate(c.toGenerate(0), Endpoint::kCompletions);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("presence_penalty"), std::string::npos);
  c.presencePenalty = -1.0f;
  auto ok = validator_->validate(c.toGenerate(0), Endpoint::kCompletions);
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->presencePenalty, -1.0f);
}

TEST_F(ValidationTest, TruncateKeepsTheLastTokens) {
  auto full = check(
      R"({"inputs": "one two three four five six seven", "parameters": {"max_new_tokens": 2}})");
  auto cut = check(
      R"({"inputs": "one two three four five six seven", "parameters": {"max_new_tokens": 2, "truncate": 3}})");
  ASSERT_TRUE(full.ok() && cut.ok());
  ASSERT_EQ(cut->inputLength, 3u);
  EXPECT_EQ(cut->inputIds, std::vector<uint32_t>(full->inputIds.end() - 3, full->inputIds.end()));
}

TEST_F(ValidationTest, MalformedBodiesNameTheField) {
  EXPECT_EQ(message("{nope"),
            "Failed to parse the request body as JSON: the request body is not valid JSON (at "
            "byte 3)");
  EXPECT_NE(message(R"({"parameters": {}})").find("missing field `inputs`"), std::string::npos);
  EXPECT_NE(message(R"({"inputs": 5})").find("inputs: invalid type"), std::string::npos);
  EXPECT_NE(message(R"({"inputs": "x", "parameters": {"top_k": 1.5}})").find("parameters.top_k"),
            std::string::npos);
  EXPECT_NE(message(R"({"inputs": "x", "parameters": {"stop": "a"}})").find("parameters.stop"),
            std::string::npos);
  EXPECT_NE(message(R"({"inputs": "x", "parameters": {"max_new_tokens": -1}})")
                .find("parameters.max_new_tokens"),
            std::string::npos);
}

TEST_F(ValidationTest, SeedIsDrawnWhenUnset) {
  auto a = check(R"({"inputs": "Hi", "parameters": {"max_new_tokens": 4, "do_sample": true}})");
  auto b = check(R"({"inputs": "Hi", "parameters": {"max_new_tokens": 4, "do_sample": true}})");
  auto c = check(R"({"inputs": "Hi", "parameters": {"max_new_tokens": 4, "seed": 7}})");
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_NE(a->seed, b->seed);
  EXPECT_EQ(c->seed, 7u);
}

TEST_F(ValidationTest, DeepNestingIsRefusedBeforeAnyValueIsBuilt) {
  // 200,000 levels: a recursive copy, dump or destructor of this would overflow the stack.
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  for (const std::string& body : {R"({"inputs": "x", "parameters": {"grammar": )" + deep + "}}",
                                  deep, R"({"prompt": "x", "stop": )" + deep + "}"}) {
    auto g = parseGenerateRequest(body);
    ASSERT_FALSE(g.ok());
    EXPECT_NE(g.status().message().find("nests deeper than"), std::string::npos)
        << g.status().message();
    auto c = parseCompletionRequest(body);
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.status().message().find("nests deeper than"), std::string::npos);
  }
}

TEST_F(ValidationTest, NonFiniteAndOutOfRangeSamplingValuesAreRefusedWithTheShardsRules) {
  // 1e39 is beyond float: it used to become +inf, pass "> 0", and fail the whole batch at the
  // shard. Tiny values turn logits into infinities.
  for (const char* p :
       {R"({"temperature": 1e39})", R"({"temperature": 1e-30})", R"({"repetition_penalty": 1e39})",
        R"({"repetition_penalty": 1e-40})", R"({"temperature": 1e300})"}) {
    const std::string body = std::string(R"({"inputs": "x", "parameters": )") + p + "}";
    const std::string m = message(body);
    EXPECT_NE(m, "OK") << p;
    EXPECT_TRUE(m.find("temperature") != std::string::npos ||
                m.find("repetition_penalty") != std::string::npos)
        << p << ": " << m;
  }
  EXPECT_EQ(message(R"({"inputs": "x", "parameters": {"temperature": 0.5,
                    "repetition_penalty": 1.2, "max_new_tokens": 4}})"),
            "OK");
}

TEST_F(ValidationTest, CompletionRequestsAreTyped) {
  auto ok = parseCompletionRequest(
      R"({"model": "m", "prompt": ["a", "b"], "max_tokens": 3, "temperature": 0, "stop": "x",
          "stream": false, "unknown": {"ignored": true}})");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->prompts, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(ok->stop, std::vector<std::string>{"x"});
  const GenerateRequest g = ok->toGenerate(1);
  EXPECT_EQ(g.inputs, "b");
  EXPECT_FALSE(g.parameters.doSample);  // temperature 0 is greedy
  EXPECT_EQ(g.parameters.maxNewTokens, 3u);
  // Every field of the wrong type is a 422 naming it (these used to throw from nlohmann and
  // kill the router).
  const std::pair<const char*, const char*> bad[] = {
      {R"({"prompt": "x", "stream": "yes"})", "stream"},
      {R"({"prompt": "x", "model": 5})", "model"},
      {R"({"prompt": "x", "max_tokens": "ten"})", "max_tokens"},
      {R"({"prompt": "x", "max_tokens": -1})", "max_tokens"},
      {R"({"prompt": "x", "temperature": "hot"})", "temperature"},
      {R"({"prompt": "x", "seed": 1.5})", "seed"},
      {R"({"prompt": "x", "stop": [1]})", "stop"},
      {R"({"prompt": 5})", "prompt"},
      {R"({"prompt": ["a", 2]})", "prompt"},
      {R"({"prompt": "x", "suffix": []})", "suffix"},
      {R"({"max_tokens": 3})", "prompt"},
      {R"(["prompt"])", "expected an object"},
      {R"({"prompt": "x", "stream_options": 1})", "stream_options"},
      {R"({"prompt": "x", "stream_options": {"include_usage": "yes"}})", "include_usage"},
      // Not served here: refused rather than ignored (TGI ignores them).
      {R"({"prompt": "x", "n": 2})", "`n`"},
      {R"({"prompt": "x", "n": -1})", "n"},
      {R"({"prompt": "x", "best_of": 2})", "`best_of`"},
      {R"({"prompt": "x", "echo": true})", "`echo`"},
      {R"({"prompt": "x", "echo": "no"})", "echo"},
      {R"({"prompt": "x", "logprobs": 5})", "`logprobs`"},
      {R"({"prompt": "x", "logprobs": true})", "`logprobs`"},
      {R"({"prompt": "x", "logprobs": "no"})", "logprobs"},
      {R"({"prompt": "x", "n": 1.5})", "`n`"},
  };
  for (const auto& [body, field] : bad) {
    auto r = parseCompletionRequest(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_NE(r.status().message().find(field), std::string::npos)
        << body << ": " << r.status().message();
  }
  auto plain = parseCompletionRequest(
      R"({"prompt": "x", "n": 1, "best_of": 1, "echo": false, "logprobs": null,
          "stream": true, "stream_options": {"include_usage": true}})");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE(plain->includeUsage);
  for (const char* off : {R"({"prompt": "x", "logprobs": false, "n": 1.0, "best_of": 1.0})",
                          R"({"prompt": "x", "logprobs": 0})"}) {
    EXPECT_TRUE(parseCompletionRequest(off).ok()) << off;
  }
  auto negative = parseCompletionRequest(R"({"prompt": "x", "temperature": -1})");
  ASSERT_TRUE(negative.ok());
  auto v = validator_->validate(negative->toGenerate(0), Endpoint::kCompletions);
  EXPECT_FALSE(v.ok()) << "a negative temperature must not silently mean greedy";
}

TEST_F(ValidationTest, TokenizeHasTheInputLimit) {
  EXPECT_TRUE(validator_->tokenize("Hello world", true).ok());
  auto big = validator_->tokenize(std::string(5000, 'a') + " b c d e f g", true);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("`inputs` must have less than 32 tokens"),
            std::string::npos)
      << big.status().message();
  EXPECT_FALSE(validator_->tokenize("", true).ok());
}

// /tokenize's `parameters.truncate` keeps the last tokens, as TGI's does, and the input limit
// counts what is kept.
TEST_F(ValidationTest, TokenizeTruncatesFromTheLeft) {
  auto all = validator_->tokenize("Hello world and more words", true);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_GT(all->size(), 2u);
  auto kept = validator_->tokenize("Hello world and more words", true, 2);
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_EQ(kept->size(), 2u);
  EXPECT_EQ(kept->ids[0], all->ids[all->size() - 2]);
  EXPECT_EQ(kept->ids[1], all->ids.back());
  EXPECT_EQ(kept->offsets[1], all->offsets.back());
  auto big = validator_->tokenize(std::string(5000, 'a') + " b c d e f g", true, 4);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(big->size(), 4u);
}

}  // namespace
}  // namespace textgen::router
