// GPTNeoXForCausalLM's config.json (models/gpt_neox.cpp's prepareGptNeoxConfig): transformers 5's
// rope_parameters and the rotary_pct / rotary_emb_base that released Pythia checkpoints write,
// GPTNeoXConfig's defaults (rotary_pct 0.25, layer_norm_eps 1e-5, attention_bias true), and bad
// values refused naming the field.
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

const std::string kFixture = std::string(TEXTGEN_MODEL_FIXTURES) + "/gptneox-sequential";

json fixtureConfig() {
  std::ifstream in(kFixture + "/config.json");
  return json::parse(in);
}

// A model directory holding `config` and the fixture's weights. Named for this process: ctest runs
// each test in its own process, two at a time, and two tests writing one directory raced (a
// symlink another had just created).
std::string writeModel(const json& config, const std::string& name) {
  const std::string dir =
      ::testing::TempDir() + "/textgen-neox-" + std::to_string(::getpid()) + "-" + name;
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

// The config of a Pythia checkpoint (GPTNeoXConfig before transformers 5).
json pythiaConfig() {
  json j = fixtureConfig();
  j.erase("rope_parameters");
  j.erase("attention_bias");
  j["rotary_pct"] = 0.5;
  j["rotary_emb_base"] = 20000;
  j["rope_scaling"] = nullptr;
  return j;
}

TEST(GptNeoxConfig, TheFixtureParses) {
  auto c = parse(fixtureConfig(), "fixture");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hiddenSize, 64);
  EXPECT_EQ(c->numKvHeads, 4);
  EXPECT_DOUBLE_EQ(c->rope.partialRotaryFactor, 0.5);
  EXPECT_DOUBLE_EQ(c->rope.theta, 20000);
  EXPECT_EQ(c->rotaryDim(), 8);
  EXPECT_DOUBLE_EQ(c->rmsNormEps, 1e-5);  // layer_norm_eps
  EXPECT_TRUE(c->attentionBias);
  EXPECT_EQ(c->hiddenAct, Activation::kGelu);
}

TEST(GptNeoxConfig, PythiaKeysAreReadAsRopeParameters) {
  auto want = parse(fixtureConfig(), "fixture");
  auto c = parse(pythiaConfig(), "pythia");
  ASSERT_TRUE(want.ok() && c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->rope.partialRotaryFactor, want->rope.partialRotaryFactor);
  EXPECT_DOUBLE_EQ(c->rope.theta, want->rope.theta);
  EXPECT_TRUE(c->attentionBias);  // absent: GPTNeoXConfig's default
  // And the model loads from them.
  auto backend = makeCpuBackend(1);
  auto model = loadModel(writeModel(pythiaConfig(), "pythia"), *backend);
  EXPECT_TRUE(model.ok()) << model.status();
}

TEST(GptNeoxConfig, DefaultsAreGptNeoxConfigs) {
  json j = fixtureConfig();
  j.erase("rope_parameters");
  j.erase("layer_norm_eps");
  j.erase("hidden_act");
  auto c = parse(j, "defaults");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->rope.partialRotaryFactor, 0.25);  // rotary_pct's default, not 1
  EXPECT_DOUBLE_EQ(c->rope.theta, 10000);
  EXPECT_DOUBLE_EQ(c->rmsNormEps, 1e-5);
  EXPECT_EQ(c->hiddenAct, Activation::kGelu);
  // rope_parameters without partial_rotary_factor: the same default.
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5000}};
  c = parse(j, "defaults-object");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->rope.partialRotaryFactor, 0.25);
  EXPECT_DOUBLE_EQ(c->rope.theta, 5000);
  j["attention_bias"] = false;
  c = parse(j, "no-bias");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->attentionBias);
}

TEST(GptNeoxConfig, BothSpellingsMustAgree) {
  json j = pythiaConfig();
  j["rope_parameters"] = {{"partial_rotary_factor", 0.5}, {"rope_theta", 20000}};
  EXPECT_TRUE(parse(j, "agree").ok()) << parse(j, "agree").status();
  j["rope_parameters"]["partial_rotary_factor"] = 0.25;
  expectError(parse(j, "pct").status(), StatusCode::kInvalidArgument,
              "'rotary_pct' (0.5) and 'rope_parameters.partial_rotary_factor' (0.25) disagree");
  j["rope_parameters"]["partial_rotary_factor"] = 0.5;
  j["rope_parameters"]["rope_theta"] = 10000;
  expectError(parse(j, "base").status(), StatusCode::kInvalidArgument,
              "'rotary_emb_base' (20000) and 'rope_parameters.rope_theta' (10000) disagree");
  j = pythiaConfig();
  j["partial_rotary_factor"] = 1.0;
  expectError(parse(j, "top").status(), StatusCode::kInvalidArgument,
              "'rotary_pct' (0.5) and 'partial_rotary_factor' (1.0) disagree");
  j = pythiaConfig();
  j["rms_norm_eps"] = 1e-6;
  expectError(parse(j, "eps").status(), StatusCode::kInvalidArgument,
              "'layer_norm_eps' (1e-05) and 'rms_norm_eps' (1e-06) disagree");
}

TEST(GptNeoxConfig, BadValuesAreRefusedNamingTheField) {
  struct Case {
    const char* key;
    json value;
    const char* message;
  };
  const Case cases[] = {
      {"rotary_pct", "half", "'rotary_pct' must be a number"},
      {"rotary_pct", 0, "'rotary_pct' must be a positive number"},
      {"rotary_pct", 2, "'rotary_pct' must be at most 1.0"},
      {"rotary_pct", 0.1, "'partial_rotary_factor' must give an even rotary dimension"},
      {"rotary_emb_base", json::array(), "'rotary_emb_base' must be a number"},
      {"rotary_emb_base", -1, "'rotary_emb_base' must be a positive number"},
      {"layer_norm_eps", "small", "'rms_norm_eps' must be a positive number"},
      {"attention_bias", 1, "'attention_bias' must be true or false"},
      {"hidden_act", "gelu_quick", "'hidden_act' 'gelu_quick' is not supported"},
  };
  for (const Case& c : cases) {
    json j = pythiaConfig();
    j[c.key] = c.value;
    expectError(parse(j, "bad").status(), StatusCode::kInvalidArgument, c.message);
  }
  // use_parallel_residual is read by the graph, at load.
  json j = pythiaConfig();
  j["use_parallel_residual"] = "yes";
  auto backend = makeCpuBackend(1);
  auto model = loadModel(writeModel(j, "parallel"), *backend);
  expectError(model.status(), StatusCode::kInvalidArgument, "'use_parallel_residual'");
}

}  // namespace
}  // namespace textgen::runtime
