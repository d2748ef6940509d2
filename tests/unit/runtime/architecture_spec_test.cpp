// The architecture registry and typed specs (pod-runtime/src/models/): the registry is the only
// list, and a spec asking for a value its graph does not build is refused at load, naming the
// value (UNIMPLEMENTED), before any weight is read.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "models/registry.h"
#include "textgen/runtime/model.h"

namespace textgen::runtime {
namespace {

const std::string kFixture = std::string(TEXTGEN_MODEL_FIXTURES) + "/llama-gqa";

TEST(ArchitectureRegistry, ListsLlamaAndMistralOnce) {
  ASSERT_EQ(architectures().size(), 4u);  // and FalconForCausalLM, RWForCausalLM
  const Architecture* llama = findArchitecture("LlamaForCausalLM");
  const Architecture* mistral = findArchitecture("MistralForCausalLM");
  ASSERT_NE(llama, nullptr);
  ASSERT_NE(mistral, nullptr);
  EXPECT_EQ(findArchitecture("GPT2LMHeadModel"), nullptr);
  EXPECT_FALSE(llama->spec.slidingWindow);
  EXPECT_TRUE(mistral->spec.slidingWindow);
  EXPECT_EQ(llama->spec.norm, NormKind::kRms);
  EXPECT_EQ(llama->spec.position, PositionKind::kRope);
  EXPECT_EQ(llama->spec.tensors.q, "model.layers.{}.self_attn.q_proj.weight");
  EXPECT_EQ(layerName(llama->spec.tensors.down, 3), "model.layers.3.mlp.down_proj.weight");
}

// Loads the llama-gqa fixture with the Llama entry's spec changed by `edit`.
Status loadWith(const std::function<void(ArchitectureSpec&)>& edit) {
  auto config = loadModelConfig(kFixture);
  if (!config.ok()) return config.status();
  auto weights = WeightStore::open(kFixture);
  if (!weights.ok()) return weights.status();
  Architecture a = *findArchitecture("LlamaForCausalLM");
  edit(a.spec);
  auto backend = makeCpuBackend(1);
  auto model = loadArchitecture(a, *config, **weights, *backend, {});
  return model.ok() ? okStatus() : model.status();
}

TEST(ArchitectureSpec, TheRegisteredSpecLoads) {
  EXPECT_TRUE(loadWith([](ArchitectureSpec&) {}).ok());
}

TEST(ArchitectureSpec, ValuesTheGraphDoesNotBuildAreRefusedByName) {
  struct Case {
    std::function<void(ArchitectureSpec&)> edit;
    std::string message;
  };
  const Case cases[] = {
      {[](ArchitectureSpec& s) { s.norm = NormKind::kLayer; }, "norm 'layer'"},
      {[](ArchitectureSpec& s) { s.activation = static_cast<Activation>(9); }, "activation '?'"},
      {[](ArchitectureSpec& s) { s.gatedMlp = false; }, "gatedMlp 'false'"},
      {[](ArchitectureSpec& s) { s.parallelResidual = true; }, "parallelResidual 'true'"},
      {[](ArchitectureSpec& s) { s.position = PositionKind::kAlibi; }, "position 'alibi'"},
      {[](ArchitectureSpec& s) { s.position = PositionKind::kLearned; }, "position 'learned'"},
  };
  for (const Case& c : cases) {
    const Status st = loadWith(c.edit);
    EXPECT_EQ(st.code(), StatusCode::kUnimplemented) << c.message << ": " << st;
    EXPECT_NE(st.message().find("LlamaForCausalLM: " + c.message +
                                " is not implemented by the llama graph"),
              std::string::npos)
        << st;
  }
}

// The gated MLP computes every activation the config parser accepts.
TEST(ArchitectureSpec, TheLlamaGraphBuildsEveryActivation) {
  for (Activation a :
       {Activation::kSilu, Activation::kGelu, Activation::kGeluTanh, Activation::kRelu}) {
    EXPECT_TRUE(loadWith([a](ArchitectureSpec& s) { s.activation = a; }).ok()) << toString(a);
  }
}

// A spec that always has biases needs the bias tensors, whatever config.json says.
TEST(ArchitectureSpec, BiasFlagsLoadTheBiasTensors) {
  Status st = loadWith([](ArchitectureSpec& s) { s.attentionBias = true; });
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st;
  EXPECT_NE(st.message().find("'model.layers.0.self_attn.q_proj.bias' not found"),
            std::string::npos)
      << st;
  st = loadWith([](ArchitectureSpec& s) { s.mlpBias = true; });
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st;
  EXPECT_NE(st.message().find("'model.layers.0.mlp.gate_proj.bias' not found"), std::string::npos)
      << st;
}

// A spec's config-key aliases are applied by the parser: the fixture's config.json with GPT-2's
// spellings, parsed with the spec's dialect, gives the same model as the original.
TEST(ArchitectureSpec, ConfigKeyAliasesAreApplied) {
  static constexpr ArchitectureSpec::ConfigKeyAlias kAliases[] = {{"n_head", "num_attention_heads"},
                                                                  {"n_embd", "hidden_size"},
                                                                  {"n_layer", "num_hidden_layers"}};
  Architecture a = *findArchitecture("LlamaForCausalLM");
  a.spec.configKeyAliases = kAliases;
  std::ifstream in(kFixture + "/config.json");
  auto j = nlohmann::json::parse(in);
  auto want = parseModelConfig(j.dump());
  ASSERT_TRUE(want.ok()) << want.status();
  for (const auto& alias : kAliases) {
    j[std::string(alias.key)] = j[std::string(alias.canonical)];
    j.erase(std::string(alias.canonical));
  }
  auto dialect = [&](std::string_view) -> StatusOr<ConfigDialect> { return configDialect(a.spec); };
  auto config = parseModelConfig(j.dump(), {}, dialect);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->numHeads, want->numHeads);
  EXPECT_EQ(config->hiddenSize, want->hiddenSize);
  EXPECT_EQ(config->numLayers, want->numLayers);
  auto weights = WeightStore::open(kFixture);
  ASSERT_TRUE(weights.ok());
  auto backend = makeCpuBackend(1);
  auto model = loadArchitecture(a, *config, **weights, *backend, {});
  EXPECT_TRUE(model.ok()) << model.status();
  // Both spellings, disagreeing: refused naming both.
  j["num_attention_heads"] = want->numHeads * 2;
  auto both = parseModelConfig(j.dump(), {}, dialect);
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("'n_head'"), std::string::npos) << both.status();
  EXPECT_NE(both.status().message().find("'num_attention_heads'"), std::string::npos)
      << both.status();
}

TEST(ArchitectureSpec, TensorNamesComeFromTheSpec) {
  const Status st = loadWith([](ArchitectureSpec& s) { s.tensors.up = "model.layers.{}.mlp.w3"; });
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st;
  EXPECT_NE(st.message().find("model.layers.0.mlp.w3"), std::string::npos) << st;
}

}  // namespace
}  // namespace textgen::runtime

namespace textgen::runtime {
namespace {

// The registry is the list of architectures: a config.json naming another class parses, and
// loading it is refused naming the class and what the registry serves.
TEST(ArchitectureRegistry, RefusesAClassItDoesNotListNamingWhatItServes) {
  const std::string dir = ::testing::TempDir() + "/gpt2-config";
  std::filesystem::create_directories(dir);
  std::ifstream in(kFixture + "/config.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = text.find("LlamaForCausalLM");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 16, "GPT2LMHeadModel");
  std::ofstream(dir + "/config.json") << text;
  ASSERT_TRUE(loadModelConfig(dir).ok()) << loadModelConfig(dir).status();
  const std::string want =
      "'GPT2LMHeadModel' is not supported (supported: LlamaForCausalLM, MistralForCausalLM, "
      "FalconForCausalLM, RWForCausalLM)";
  // The class is resolved before the rest of config.json is read (as that class spells it).
  auto config = loadArchitectureConfig(dir);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(config.status().message().find(want), std::string::npos) << config.status();
  auto backend = makeCpuBackend(1);
  auto model = loadModel(dir, *backend);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(model.status().message().find(want), std::string::npos) << model.status();
}

}  // namespace
}  // namespace textgen::runtime
