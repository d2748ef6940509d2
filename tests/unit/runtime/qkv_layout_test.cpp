// Fused q/k/v layouts (ArchitectureSpec::qkvLayout): a tiny random Llama written with its q, k and
// v (and their biases) moved into one self_attn.qkv_proj tensor — [q; k; v], [q; k; v] per head
// (GPT-NeoX, BLOOM), per key/value head its query heads then k and v (Falcon's new architecture)
// — gives the separate layout's logits bit for bit, through a spec that names the layout; a fused
// tensor whose rows do not make the layout is an error naming it. (Tensor-parallel splits of the
// fused layouts: tensor_parallel_test.cpp.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "models/registry.h"
#include "runtime/tiny_llama.h"
#include "textgen/runtime/model.h"

namespace textgen::runtime {
namespace {

using testing::TinyLlama;

StatusOr<std::unique_ptr<Model>> makeGraphModel(const std::string& dir, QkvLayout layout,
                                                Backend& backend) {
  const Architecture* llama = findArchitecture("LlamaForCausalLM");
  if (llama == nullptr) return internalError("no Llama");
  Architecture fused = *llama;
  fused.spec.qkvLayout = layout;
  fused.spec.tensors.qkv = "model.layers.{}.self_attn.qkv_proj.weight";
  TG_ASSIGN_OR_RETURN(ModelConfig config, loadArchitectureConfig(dir));
  TG_ASSIGN_OR_RETURN(auto weights, WeightStore::open(dir));
  return loadArchitecture(fused, config, *weights, backend, {});
}

std::string tempDir(const std::string& name) {
  return ::testing::TempDir() + "/textgen-qkv-test-" + std::to_string(::getpid()) + "-" + name;
}

TEST(QkvLayout, FusedLayoutsGiveTheSeparateLayoutsLogits) {
  struct Case {
    int layout;
    QkvLayout kind;
    int64_t kvHeads;
  };
  const Case cases[] = {{1, QkvLayout::kFused, 2},
                        {1, QkvLayout::kFused, 1},
                        {2, QkvLayout::kFusedInterleavedPerHead, 4},
                        {3, QkvLayout::kFusedGrouped, 2},
                        {3, QkvLayout::kFusedGrouped, 1}};
  for (const Case& c : cases) {
    for (bool bias : {false, true}) {
      SCOPED_TRACE(std::string(toString(c.kind)) + " kv heads " + std::to_string(c.kvHeads) +
                   (bias ? " with biases" : ""));
      auto backend = makeCpuBackend(1);
      const TinyLlama separate{.attentionBias = bias, .kvHeads = c.kvHeads};
      TinyLlama fused = separate;
      fused.qkvLayout = c.layout;
      separate.write(tempDir("separate"));
      fused.write(tempDir("fused"));
      auto a = loadModel(tempDir("separate"), *backend);
      ASSERT_TRUE(a.ok()) << a.status();
      auto b = makeGraphModel(tempDir("fused"), c.kind, *backend);
      ASSERT_TRUE(b.ok()) << b.status();
      auto want = testing::prefillLogits(**a, *backend, testing::tinyPrompts());
      auto got = testing::prefillLogits(**b, *backend, testing::tinyPrompts());
      ASSERT_TRUE(want.ok() && got.ok());
      EXPECT_EQ(*got, *want);
      // Read as another layout, the same tensor gives other logits (the layouts are distinct;
      // grouped with one key/value head is [q; k; v] itself, as in Falcon-7B).
      if (c.kind != QkvLayout::kFused && c.kvHeads > 1) {
        auto other = makeGraphModel(tempDir("fused"), QkvLayout::kFused, *backend);
        ASSERT_TRUE(other.ok()) << other.status();
        auto wrong = testing::prefillLogits(**other, *backend, testing::tinyPrompts());
        ASSERT_TRUE(wrong.ok());
        EXPECT_NE(*wrong, *want);
      }
    }
  }
}

TEST(QkvLayout, ALayoutTheShapesCannotMakeIsAnError) {
  auto backend = makeCpuBackend(1);
  // Interleaved per head needs as many key/value heads as heads.
  TinyLlama fused{.kvHeads = 2};
  fused.qkvLayout = 1;
  fused.write(tempDir("bad"));
  auto m = makeGraphModel(tempDir("bad"), QkvLayout::kFusedInterleavedPerHead, *backend);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument) << m.status();
  EXPECT_NE(m.status().message().find("qkv_proj"), std::string::npos) << m.status();
  // A fused tensor of the wrong size is named.
  TinyLlama misshapen{.shapes = {{"model.layers.0.self_attn.q_proj.weight", {8, 32}}}};
  misshapen.qkvLayout = 1;
  misshapen.write(tempDir("misshapen"));
  m = makeGraphModel(tempDir("misshapen"), QkvLayout::kFused, *backend);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("qkv_proj"), std::string::npos) << m.status();
  // The separate names are not read under a fused layout.
  TinyLlama separate;
  separate.write(tempDir("separate-only"));
  m = makeGraphModel(tempDir("separate-only"), QkvLayout::kFusedGrouped, *backend);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound) << m.status();
}

}  // namespace
}  // namespace textgen::runtime
