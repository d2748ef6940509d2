// T5 on the CUDA backend (runtime_cuda_test, label gpu): float32 against transformers' float32
// reference as the CPU test does (decode steps replaying CUDA graphs with the cross-attention
// tables in them), bfloat16 against transformers' bfloat16 run on the GPU
// (reference-bfloat16.json, tools/reference/make_t5_dtype_references.py): the first step's logits
// within 8 bf16 ulps of the row's scale, greedy tokens equal until a divergence only a near-tie of
// transformers' own logits explains. float16 is refused, naming the reason.
#include <gtest/gtest.h>

#include <cmath>

#include "runtime/t5_runner.h"

namespace textgen::runtime {
namespace {

using kernels::DType;
using nlohmann::json;
using t5test::runT5Greedy;

constexpr int kSteps = 24;

std::string fixture(const std::string& name) {
  const char* env = std::getenv("TEXTGEN_MODEL_FIXTURES");
  return (env && *env ? std::string(env) : std::string(TEXTGEN_MODEL_FIXTURES)) + "/" + name;
}

class T5CudaTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    auto b = makeCudaBackend(0);
    if (!b.ok()) GTEST_SKIP() << "no GPU: " << b.status();
    backend_ = std::move(*b);
  }
  std::unique_ptr<Backend> backend_;
};

TEST_P(T5CudaTest, Float32EqualsTransformersWithGraphs) {
  const std::string dir = fixture(GetParam());
  const json ref = t5test::readT5Reference(dir);
  auto model = loadModel(dir, *backend_, {.dtype = DType::kF32, .graphBatchSizes = {1, 2, 4}});
  ASSERT_TRUE(model.ok()) << model.status();
  const auto prompts = t5test::t5Prompts(ref);
  const t5test::T5Trace t = runT5Greedy(**model, *backend_, prompts, kSteps, {0, 3, 3, 7});
  ASSERT_TRUE(t.error.empty()) << t.error;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const json& p = ref["prompts"][i];
    EXPECT_EQ(t.tokens[i], p["greedy"].get<std::vector<uint32_t>>()) << "prompt " << i;
    const json& full = p["decoder_logits"]["full"];
    for (size_t s = 0; s < full.size(); ++s) {
      const auto want = full[s].get<std::vector<float>>();
      for (size_t v = 0; v < want.size(); ++v)
        ASSERT_NEAR(t.logits[i][s][v], want[v], 4e-4f + 2e-4f * std::fabs(want[v]))
            << "prompt " << i << " step " << s << " logit " << v;
    }
  }
}

TEST_P(T5CudaTest, BFloat16FollowsTransformersBFloat16) {
  const std::string dir = fixture(GetParam());
  std::ifstream in(dir + "/reference-bfloat16.json");
  if (!in) GTEST_SKIP() << "no reference-bfloat16.json (make_t5_dtype_references.py)";
  const json ref = json::parse(in);
  auto model = loadModel(dir, *backend_, {.dtype = DType::kBF16, .graphBatchSizes = {1, 2, 4}});
  ASSERT_TRUE(model.ok()) << model.status();
  for (size_t i = 0; i < ref["prompts"].size(); ++i) {
    const json& p = ref["prompts"][i];
    const auto prompt = p["input_ids"].get<std::vector<uint32_t>>();
    const t5test::T5Trace t = runT5Greedy(**model, *backend_, {prompt}, kSteps);
    ASSERT_TRUE(t.error.empty()) << t.error;
    const auto first = p["first_logits"].get<std::vector<float>>();
    float maxAbs = 0, maxErr = 0;
    for (float x : first) maxAbs = std::max(maxAbs, std::fabs(x));
    const float ulp = std::ldexp(1.0f, std::ilogb(std::max(maxAbs, 1e-6f)) - 7);
    for (size_t v = 0; v < first.size(); ++v)
      maxErr = std::max(maxErr, std::fabs(t.logits[0][0][v] - first[v]));
    EXPECT_LE(maxErr, 8 * ulp) << "prompt " << i << ": first-step logits";
    const auto want = p["greedy"].get<std::vector<uint32_t>>();
    const auto& got = t.tokens[0];
    size_t k = 0;
    while (k < want.size() && got[k] == want[k]) ++k;
    if (k < want.size()) {
      const float gap = p["gaps"][k].get<float>();
      const auto top5 = p["top5"][k].get<std::vector<uint32_t>>();
      EXPECT_LE(gap, 2 * 8 * ulp) << "prompt " << i << ": diverges at " << k << " (got " << got[k]
                                  << ", want " << want[k] << ") where the gap is " << gap;
      EXPECT_NE(std::find(top5.begin(), top5.end(), got[k]), top5.end());
    }
    std::printf(
        "%s prompt %zu bf16: %zu/%zu tokens before the first divergence, first-step max "
        "logit error %.3g (8 ulps %.3g)\n",
        GetParam(), i, k, want.size(), maxErr, 8 * ulp);
  }
}

TEST_P(T5CudaTest, Float16IsRefusedWithTheReason) {
  auto model =
      loadModel(fixture(GetParam()), *backend_, {.dtype = DType::kF16, .graphBatchSizes = {}});
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("float16 overflows"), std::string::npos)
      << model.status();
}

INSTANTIATE_TEST_SUITE_P(Fixtures, T5CudaTest,
                         ::testing::Values("t5-gated-gelu", "t5-relu-tied", "t5-gated-gelu-tied"),
                         [](const auto& p) {
                           std::string n = p.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace textgen::runtime
