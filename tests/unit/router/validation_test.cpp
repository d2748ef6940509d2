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
  auto v =
      roomy.validate(*parseGenerateRequest(R"({"inputs": "Hello world"})"), Endpoint::kGenerate);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->maxNewTokens, 100u);
  EXPECT_EQ(v->temperature, 1.0f);
  EXPECT_EQ(v->topP, 1.0f);
  EXPECT_EQ(v->topK, 0u);
  EXPECT_FALSE(v->doSample);
  EXPECT_EQ(v->inputIds.front(), 1u);  // <s> added (llama2 config adds bos)
  EXPECT_EQ(v->inputLength, v->inputIds.size());
}

TEST_F(ValidationTest, MaxNewTokensDefaultIs100AndNullFillsTheBudget) {
  const size_t n = tok_->encode("Hello")->size();
  EXPECT_EQ(message(R"({"inputs": "Hello"})"),
            "`inputs` tokens + `max_new_tokens` must be <= 48. Given: " + std::to_string(n) +
                " `inputs` tokens and 100 `max_new_tokens`");
  auto v = check(R"({"inputs": "Hello", "parameters": {"max_new_tokens": null}})");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->maxNewTokens, 48u - v->inputLength);
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

TEST_F(ValidationTest, UnimplementedFeaturesAreRefused) {
  auto w = check(R"({"inputs": "Hi", "parameters": {"max_new_tokens": 4, "watermark": true}})");
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(w.status().message().find("watermark"), std::string::npos);
  EXPECT_EQ(check(R"({"inputs": "Hi", "parameters": {"grammar": {"type": "json", "value": {}}}})")
                .status()
                .code(),
            StatusCode::kUnimplemented);
  EXPECT_EQ(check(R"({"inputs": "Hi", "parameters": {"adapter_id": "lora-1"}})").status().code(),
            StatusCode::kUnimplemented);
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
  EXPECT_EQ(message("{nope"), "Failed to parse the request body as JSON");
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

}  // namespace
}  // namespace textgen::router
