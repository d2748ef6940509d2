// Attention and MLP biases (Llama's attention_bias and mlp_bias) on a tiny random Llama written by
// the test: zero biases give the logits of a model without them, bit for bit; non-zero ones change
// them; a missing or misshapen bias tensor is an error naming it. (Tensor-parallel splits of the
// biases: tensor_parallel_test.cpp.)
#include <gtest/gtest.h>

#include <string>

#include "runtime/tiny_llama.h"
#include "textgen/runtime/model.h"

namespace textgen::runtime {
namespace {

using testing::TinyLlama;

class BiasTest : public ::testing::Test {
 protected:
  std::string dir(const std::string& name) {
    return ::testing::TempDir() + "/textgen-bias-test-" + std::to_string(::getpid()) + "-" + name;
  }
  StatusOr<std::vector<float>> logits(const TinyLlama& m, const std::string& name) {
    const std::string d = dir(name);
    m.write(d);
    auto backend = makeCpuBackend(1);
    TG_ASSIGN_OR_RETURN(auto model, loadModel(d, *backend));
    return testing::prefillLogits(*model, *backend, testing::tinyPrompts());
  }
};

TEST_F(BiasTest, ZeroBiasesEqualNoBiasesAndOthersChangeTheLogits) {
  for (const std::string act : {"silu", "gelu", "gelu_pytorch_tanh", "relu"}) {
    SCOPED_TRACE(act);
    auto none = logits({.hiddenAct = act}, "none");
    ASSERT_TRUE(none.ok()) << none.status();
    auto zero = logits(
        {.attentionBias = true, .mlpBias = true, .biasScale = 0.0f, .hiddenAct = act}, "zero");
    ASSERT_TRUE(zero.ok()) << zero.status();
    EXPECT_EQ(*zero, *none);
    // Each flag alone loads its own biases, and each changes the logits.
    for (const auto& [attn, mlp] :
         std::initializer_list<std::pair<bool, bool>>{{true, false}, {false, true}, {true, true}}) {
      auto biased = logits({.attentionBias = attn, .mlpBias = mlp, .hiddenAct = act}, "biased");
      ASSERT_TRUE(biased.ok()) << biased.status();
      ASSERT_EQ(biased->size(), none->size());
      EXPECT_NE(*biased, *none) << "attention " << attn << " mlp " << mlp;
    }
  }
}

TEST_F(BiasTest, TheActivationChangesTheLogits) {
  auto silu = logits({.hiddenAct = "silu"}, "silu");
  auto gelu = logits({.hiddenAct = "gelu"}, "gelu");
  auto tanh = logits({.hiddenAct = "gelu_pytorch_tanh"}, "tanh");
  auto fast = logits({.hiddenAct = "gelu_fast"}, "fast");
  ASSERT_TRUE(silu.ok() && gelu.ok() && tanh.ok() && fast.ok());
  EXPECT_NE(*silu, *gelu);
  EXPECT_NE(*gelu, *tanh);
  EXPECT_EQ(*tanh, *fast);  // the same function, one kernel
}

TEST_F(BiasTest, MissingOrMisshapenBiasesAreNamed) {
  // config.json says mlp_bias but the checkpoint has none.
  auto missing = logits({.mlpBias = true, .writeBiases = false}, "missing");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status();
  EXPECT_NE(missing.status().message().find("'model.layers.0.mlp.gate_proj.bias' not found"),
            std::string::npos)
      << missing.status();
  const std::pair<const char*, std::vector<int64_t>> bad[] = {
      {"model.layers.1.self_attn.k_proj.bias", {17}},
      {"model.layers.0.self_attn.o_proj.bias", {32, 1}},
      {"model.layers.1.mlp.down_proj.bias", {64}},
      {"model.layers.0.mlp.up_proj.bias", {}},
  };
  for (const auto& [name, shape] : bad) {
    TinyLlama m{.attentionBias = true, .mlpBias = true};
    m.shapes[name] = shape;
    auto r = logits(m, "misshapen");
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find("weight '" + std::string(name) + "' has shape"),
              std::string::npos)
        << r.status();
  }
}

}  // namespace
}  // namespace textgen::runtime
