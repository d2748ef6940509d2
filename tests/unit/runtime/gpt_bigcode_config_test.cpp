// GPTBigCodeForCausalLM's config.json (models/gpt_bigcode.cpp's prepareGptBigcodeConfig): GPT-2's
// key spellings, num_key_value_heads from multi_query (as GPTBigCodeConfig sets it, whatever
// config.json says), n_inner null as 4 * n_embd, the class's defaults, and bad values refused
// naming the field.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "textgen/runtime/model.h"

namespace textgen::runtime {
namespace {

using kernels::Activation;
using nlohmann::json;

const std::string kFixture = std::string(TEXTGEN_MODEL_FIXTURES) + "/bigcode-mqa";

json fixtureConfig() {
  std::ifstream in(kFixture + "/config.json");
  return json::parse(in);
}

// Named for this process (ctest runs tests two at a time, each in its own process).
std::string writeModel(const json& config, const std::string& name) {
  const std::string dir =
      ::testing::TempDir() + "/textgen-bigcode-" + std::to_string(::getpid()) + "-" + name;
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << config.dump();
  std::filesystem::remove(dir + "/model.safetensors");
  std::filesystem::create_symlink(kFixture + "/model.safetensors", dir + "/model.safetensors");
  return dir;
}

StatusOr<ModelConfig> parse(const json& config, const std::string& name) {
  return loadArchitectureConfig(writeModel(config, name));
}

void expectError(const Status& st, StatusCode code, const std::string& substring) {
  ASSERT_FALSE(st.ok()) << substring;
  EXPECT_EQ(st.code(), code) << st;
  EXPECT_NE(st.message().find(substring), std::string::npos)
      << "expected '" << substring << "' in: " << st;
}

TEST(GptBigcodeConfig, TheFixtureParses) {
  auto c = parse(fixtureConfig(), "fixture");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hiddenSize, 64);
  EXPECT_EQ(c->numLayers, 2);
  EXPECT_EQ(c->numHeads, 4);
  EXPECT_EQ(c->numKvHeads, 1);
  EXPECT_EQ(c->headDim, 16);
  EXPECT_EQ(c->intermediateSize, 128);
  EXPECT_EQ(c->maxPositionEmbeddings, 256);
  EXPECT_DOUBLE_EQ(c->rmsNormEps, 1e-5);
  EXPECT_TRUE(c->tieWordEmbeddings);
  EXPECT_EQ(c->hiddenAct, Activation::kGeluTanh);
}

TEST(GptBigcodeConfig, DefaultsAreGptBigcodeConfigs) {
  json j = fixtureConfig();
  for (const char* key : {"multi_query", "num_key_value_heads", "layer_norm_epsilon",
                          "tie_word_embeddings", "activation_function"})
    j.erase(key);
  j["n_inner"] = nullptr;
  auto c = parse(j, "defaults");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->numKvHeads, 1);             // multi_query defaults to true
  EXPECT_EQ(c->intermediateSize, 4 * 64);  // n_inner null: 4 * n_embd
  EXPECT_DOUBLE_EQ(c->rmsNormEps, 1e-5);
  EXPECT_TRUE(c->tieWordEmbeddings);
  EXPECT_EQ(c->hiddenAct, Activation::kGeluTanh);
  j["activation_function"] = "gelu";
  c = parse(j, "gelu");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hiddenAct, Activation::kGelu);
}

TEST(GptBigcodeConfig, MultiQuerySetsTheKeyValueHeads) {
  json j = fixtureConfig();
  j["multi_query"] = false;  // num_key_value_heads stays 1 in the file: GPTBigCodeConfig ignores it
  auto c = parse(j, "mha");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->numKvHeads, 4);
  j["multi_query"] = true;
  j["num_key_value_heads"] = 4;
  c = parse(j, "mqa");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->numKvHeads, 1);
}

TEST(GptBigcodeConfig, BadValuesAreRefusedNamingTheField) {
  struct Case {
    const char* key;
    json value;
    StatusCode code;
    const char* message;
  };
  const Case cases[] = {
      {"multi_query", "yes", StatusCode::kInvalidArgument, "'multi_query' must be true or false"},
      {"scale_attn_weights", 0, StatusCode::kInvalidArgument,
       "'scale_attn_weights' must be true or false"},
      {"scale_attn_weights", false, StatusCode::kUnimplemented,
       "'scale_attn_weights' false (unscaled attention scores) is not implemented"},
      {"n_head", 3, StatusCode::kInvalidArgument, "'hidden_size' must be a multiple of"},
      {"n_head", "4", StatusCode::kInvalidArgument, "'num_attention_heads' must be a positive"},
      {"n_embd", -64, StatusCode::kInvalidArgument, "'hidden_size' must be a positive integer"},
      {"n_inner", 0, StatusCode::kInvalidArgument, "'intermediate_size' must be a positive"},
      {"n_positions", 1.5, StatusCode::kInvalidArgument, "'max_position_embeddings' must be a"},
      {"layer_norm_epsilon", -1, StatusCode::kInvalidArgument,
       "'rms_norm_eps' must be a positive number"},
      {"activation_function", "gelu_quick", StatusCode::kInvalidArgument,
       "'hidden_act' 'gelu_quick' is not supported"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key);
    json j = fixtureConfig();
    j[c.key] = c.value;
    expectError(parse(j, "bad").status(), c.code, c.message);
  }
  // Both spellings, disagreeing.
  json j = fixtureConfig();
  j["hidden_size"] = 128;
  expectError(parse(j, "both").status(), StatusCode::kInvalidArgument,
              "'n_embd' (64) and 'hidden_size' (128) disagree");
}

// A table of positions shorter than n_positions cannot serve the context it promises.
TEST(GptBigcodeConfig, APositionTableShorterThanTheContextIsRefused) {
  json j = fixtureConfig();
  j["n_positions"] = 512;
  auto backend = makeCpuBackend(1);
  auto model = loadModel(writeModel(j, "positions"), *backend);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("transformer.wpe.weight"), std::string::npos)
      << model.status();
}

}  // namespace
}  // namespace textgen::runtime
