// The architecture registry and typed specs (pod-runtime/src/models/): the registry is the only
// list, and a spec asking for a value its graph does not build is refused at load, naming the
// value (UNIMPLEMENTED), before any weight is read.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>

#include "models/registry.h"
#include "textgen/runtime/model.h"

namespace textgen::runtime {
namespace {

const std::string kFixture = std::string(TEXTGEN_MODEL_FIXTURES) + "/llama-gqa";

TEST(ArchitectureRegistry, ListsLlamaAndMistralOnce) {
  ASSERT_EQ(architectures().size(), 2u);
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
      {[](ArchitectureSpec& s) { s.activation = Activation::kGelu; }, "activation 'gelu'"},
      {[](ArchitectureSpec& s) { s.activation = Activation::kGeluTanh; }, "activation 'gelu_tanh'"},
      {[](ArchitectureSpec& s) { s.activation = Activation::kRelu; }, "activation 'relu'"},
      {[](ArchitectureSpec& s) { s.gatedMlp = false; }, "gatedMlp 'false'"},
      {[](ArchitectureSpec& s) { s.parallelResidual = true; }, "parallelResidual 'true'"},
      {[](ArchitectureSpec& s) { s.position = PositionKind::kAlibi; }, "position 'alibi'"},
      {[](ArchitectureSpec& s) { s.position = PositionKind::kLearned; }, "position 'learned'"},
      {[](ArchitectureSpec& s) { s.qkvLayout = QkvLayout::kFused; }, "qkvLayout 'fused'"},
      {[](ArchitectureSpec& s) { s.qkvLayout = QkvLayout::kFusedInterleavedPerHead; },
       "qkvLayout 'fused_interleaved_per_head'"},
      {[](ArchitectureSpec& s) { s.attentionBias = true; }, "attentionBias 'true'"},
      {[](ArchitectureSpec& s) { s.mlpBias = true; }, "mlpBias 'true'"},
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

TEST(ArchitectureSpec, ConfigKeyAliasesAreRefusedUntilTheParserAppliesThem) {
  static constexpr ArchitectureSpec::ConfigKeyAlias kAliases[] = {
      {"n_head", "num_attention_heads"}};
  const Status st = loadWith([](ArchitectureSpec& s) { s.configKeyAliases = kAliases; });
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented) << st;
  EXPECT_NE(st.message().find("'n_head' -> 'num_attention_heads'"), std::string::npos) << st;
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
  auto backend = makeCpuBackend(1);
  auto model = loadModel(dir, *backend);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(model.status().message().find(
                "'GPT2LMHeadModel' is not supported (supported: LlamaForCausalLM, "
                "MistralForCausalLM)"),
            std::string::npos)
      << model.status();
}

}  // namespace
}  // namespace textgen::runtime
