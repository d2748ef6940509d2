// The engine on the CUDA backend: Warmup sizes the KV pool from free device memory (a real prefill
// first, then memoryFraction of the device less a margin) and reports it as
// max_supported_total_tokens; running out of device memory is a RESOURCE_EXHAUSTED error naming
// the sizes, never a crash; and the engine keeps serving after one.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "textgen/grammar/grammar.h"
#include "textgen/runtime/engine.h"
#include "textgen/tokenizer/tokenizer.h"

namespace textgen::runtime {
namespace {

std::string fixture() {
  const char* env = std::getenv("TEXTGEN_MODEL_FIXTURES");
  return std::string(env && *env ? env : TEXTGEN_MODEL_FIXTURES) + "/llama-gqa";
}

class CudaEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto b = makeCudaBackend(0);
    if (!b.ok()) GTEST_SKIP() << b.status();
    backend_ = std::move(*b);
    auto m = loadModel(fixture(), *backend_,
                       {.dtype = kernels::DType::kF16, .graphBatchSizes = {1, 2, 4}});
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
    auto t = tokenizer::Tokenizer::fromDirectory(fixture());
    ASSERT_TRUE(t.ok());
    tok_ = std::move(*t);
    std::ifstream in(fixture() + "/reference.json");
    ref_ = nlohmann::json::parse(in);
  }

  // The router's warmup batch: one request of `tokens` prompt tokens in blocks 0..n.
  std::vector<RequestSpec> warmupBatch(uint32_t tokens) const {
    RequestSpec r;
    r.id = 0;
    const auto prompt = ref_["prompts"][0]["input_ids"].get<std::vector<uint32_t>>();
    for (uint32_t i = 0; i < tokens; ++i) r.inputIds.push_back(prompt[i % prompt.size()]);
    r.stopping.maxNewTokens = 1;
    for (uint32_t b = 0; b < (tokens + 1 + 15) / 16; ++b) r.blocks.push_back(b);
    return {r};
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<tokenizer::Tokenizer> tok_;
  nlohmann::json ref_;
};

TEST_F(CudaEngineTest, WarmupSizesTheKvPoolFromFreeDeviceMemory) {
  const MemoryInfo before = *backend_->memoryInfo();
  Engine engine(*model_, *tok_, *backend_, {.blockSize = 16, .kvCacheBytes = 0});
  auto w = engine.warmup(0, warmupBatch(200), std::nullopt, 200, std::nullopt);
  ASSERT_TRUE(w.ok()) << w.status();
  const MemoryInfo after = *backend_->memoryInfo();
  const int64_t perToken = KvCache::bytesPerBlock(model_->kvShape(), 16, kernels::DType::kF16) / 16;
  const double expected = 0.93 * static_cast<double>(before.free) / static_cast<double>(perToken);
  std::printf("free before %zu MiB, after %zu MiB, max_supported_total_tokens %u (%.0f expected)\n",
              before.free >> 20, after.free >> 20, w->maxSupportedTotalTokens, expected);
  // The pool takes ~93% of what was free (less the warmup's activations and block rounding).
  EXPECT_GT(static_cast<double>(w->maxSupportedTotalTokens),
            0.9 * std::min(expected, 4294967295.0));
  EXPECT_LT(after.free, before.free / 8);
  // It serves afterwards.
  RequestSpec r = warmupBatch(5)[0];
  r.id = 7;
  r.stopping.maxNewTokens = 4;
  r.stopping.ignoreEosToken = true;
  auto out = engine.prefill(1, {r}, std::nullopt);
  ASSERT_TRUE(out.ok()) << out.status();
}

TEST_F(CudaEngineTest, MemoryFractionTooSmallIsAClearError) {
  Engine engine(*model_, *tok_, *backend_,
                {.blockSize = 16, .kvCacheBytes = 0, .memoryFraction = 0.001});
  auto w = engine.warmup(0, warmupBatch(64), std::nullopt, 64, std::nullopt);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kResourceExhausted) << w.status();
  EXPECT_NE(w.status().message().find("not enough device memory for the KV cache"),
            std::string::npos)
      << w.status();
}

TEST_F(CudaEngineTest, AnImpossibleAllocationIsResourceExhaustedAndTheDeviceStaysUsable) {
  auto huge = backend_->allocate(size_t{1} << 50);  // a petabyte
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted) << huge.status();
  EXPECT_NE(huge.status().message().find("out of device memory"), std::string::npos);
  // A KV budget larger than the device fails the same way, then a sane one works.
  Engine engine(*model_, *tok_, *backend_, {.blockSize = 16, .kvCacheBytes = int64_t{1} << 46});
  auto w = engine.warmup(0, warmupBatch(32), std::nullopt, 32, std::nullopt);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kResourceExhausted) << w.status();
  Engine ok(*model_, *tok_, *backend_, {.blockSize = 16, .kvCacheBytes = 64 << 20});
  ASSERT_TRUE(ok.warmup(0, warmupBatch(32), std::nullopt, 32, std::nullopt).ok());
}

// Sampling with every processor on the device gives the tokens the CPU backend gives for the same
// seed (float32 on both: the draws are the request's own, the logits equal to a few ulps).
TEST_F(CudaEngineTest, SeededSamplingOnTheDeviceEqualsTheCpu) {
  auto run = [&](Backend& backend) -> std::vector<uint32_t> {
    // Decode graphs where the backend has them (the CPU backend has none).
    std::vector<int64_t> graphs;
    if (std::string(backend.name()) == "cuda") graphs = {1};
    auto m =
        loadModel(fixture(), backend, {.dtype = kernels::DType::kF32, .graphBatchSizes = graphs});
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return {};
    Engine engine(**m, *tok_, backend, {.blockSize = 16, .kvCacheBytes = 64 << 20});
    EXPECT_TRUE(engine.warmup(0, {}, std::nullopt, 64, std::nullopt).ok());
    std::vector<uint32_t> out;
    for (uint64_t id = 1; id <= 3; ++id) {
      RequestSpec r = warmupBatch(6)[0];
      r.id = id;
      r.stopping.maxNewTokens = 24;
      r.stopping.ignoreEosToken = true;
      r.blocks = {static_cast<uint32_t>(2 * id), static_cast<uint32_t>(2 * id + 1)};  // 32 slots
      r.sampling.doSample = true;
      r.sampling.seed = 1000 + id;
      r.sampling.temperature = 0.9f;
      r.sampling.topK = id == 1 ? 0 : 40;
      r.sampling.topP = id == 2 ? 0.9f : 1.0f;
      r.sampling.typicalP = id == 3 ? 0.95f : 1.0f;
      r.sampling.repetitionPenalty = 1.1f;
      r.sampling.frequencyPenalty = 0.2f;
      r.sampling.topNTokens = 2;
      auto s = engine.prefill(id, {r}, std::nullopt);
      while (s.ok()) {
        for (const auto& g : s->generations) out.push_back(g.tokens.ids[0]);
        if (!s->batch) break;
        s = engine.decode({id});
      }
      EXPECT_TRUE(s.ok()) << s.status();
    }
    return out;
  };
  auto cpu = makeCpuBackend(1);
  const std::vector<uint32_t> onCpu = run(*cpu), onGpu = run(*backend_);
  ASSERT_EQ(onCpu.size(), 72u);
  EXPECT_EQ(onGpu, onCpu);
}

// Constrained decoding on the device: the sample kernel's token masks choose what the CPU
// reference chooses (greedy, seeded sampling, several constrained rows in one batch with an
// unconstrained one), and every constrained output that ends by EOS matches its grammar.
TEST_F(CudaEngineTest, ConstrainedDecodingOnTheDeviceEqualsTheCpu) {
  using G = SamplingParams::Grammar;
  const std::vector<std::pair<G, std::string>> grammars = {
      {G::kRegex, "[a-z]{2,6}( [a-z]{2,6}){0,3}\\."},
      {G::kJson,
       R"({"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]},
           "tag": {"type": "string", "maxLength": 4}}, "required": ["ok", "n", "tag"]})"},
      {G::kNone, ""},
  };
  struct Out {
    std::vector<uint32_t> ids;
    std::vector<std::string> texts;
    std::vector<bool> eos;
  };
  auto run = [&](Backend& backend) -> Out {
    std::vector<int64_t> graphs;
    if (std::string(backend.name()) == "cuda") graphs = {1, 2, 4, 8};
    auto m =
        loadModel(fixture(), backend, {.dtype = kernels::DType::kF32, .graphBatchSizes = graphs});
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return {};
    Engine engine(**m, *tok_, backend, {.blockSize = 16, .kvCacheBytes = 64 << 20});
    EXPECT_TRUE(engine.warmup(0, {}, std::nullopt, 64, std::nullopt).ok());
    std::vector<RequestSpec> batch;
    for (uint64_t id = 1; id <= 6; ++id) {
      RequestSpec r = warmupBatch(6)[0];
      r.id = id;
      r.stopping.maxNewTokens = 60;
      r.blocks = {static_cast<uint32_t>(5 * id), static_cast<uint32_t>(5 * id + 1),
                  static_cast<uint32_t>(5 * id + 2), static_cast<uint32_t>(5 * id + 3),
                  static_cast<uint32_t>(5 * id + 4)};
      r.sampling.grammarType = grammars[id % 3].first;
      r.sampling.grammar = grammars[id % 3].second;
      r.sampling.doSample = id > 3;
      r.sampling.seed = 77 + id;
      r.sampling.temperature = 1.3f;
      r.sampling.topNTokens = id == 5 ? 2 : 0;
      batch.push_back(r);
    }
    Out out;
    out.texts.resize(7);
    out.eos.resize(7);
    auto s = engine.prefill(1, batch, std::nullopt);
    while (s.ok()) {
      for (const auto& g : s->generations) {
        EXPECT_FALSE(g.error.has_value()) << *g.error;
        if (g.error) continue;
        out.ids.push_back(g.tokens.ids[0]);
        if (g.finished) {
          out.texts[g.requestId] = g.finished->text;
          out.eos[g.requestId] = g.finished->reason == FinishReason::kEosToken;
        }
      }
      if (!s->batch) break;
      s = engine.decode({1});
    }
    EXPECT_TRUE(s.ok()) << s.status();
    return out;
  };
  auto cpu = makeCpuBackend(1);
  const Out onCpu = run(*cpu), onGpu = run(*backend_);
  ASSERT_FALSE(onCpu.ids.empty());
  EXPECT_EQ(onGpu.ids, onCpu.ids);
  for (uint64_t id = 1; id <= 6; ++id) {
    const auto& [type, source] = grammars[id % 3];
    if (type == G::kNone || !onGpu.eos[id]) continue;
    auto g = grammar::Grammar::compile(
        type == G::kJson ? grammar::Kind::kJsonSchema : grammar::Kind::kRegex, source);
    ASSERT_TRUE(g.ok());
    EXPECT_TRUE((*g)->matches(onGpu.texts[id])) << id << ": " << onGpu.texts[id];
  }
}

// An fp8 KV cache (--kv-cache-dtype) on the device: Warmup's pool from the same free memory holds
// about twice the tokens of the float16 cache, and greedy decoding (prefill, then decode graphs)
// follows the float16 cache's tokens: equal up to the first divergence, and there each side's
// token among the other's 5 most likely (vLLM's comparison; a random fixture has near ties).
TEST_F(CudaEngineTest, AnFp8KvCacheHoldsTwiceTheTokensAndDecodesLikeAFloat16One) {
  struct Run {
    uint32_t maxTokens = 0;
    std::vector<uint32_t> ids;
    std::vector<std::vector<uint32_t>> top;
  };
  auto run = [&](kernels::KvCacheDType cache) {
    Run out;
    Engine engine(*model_, *tok_, *backend_,
                  {.blockSize = 16, .kvCacheBytes = 0, .kvCacheDtype = cache});
    auto w = engine.warmup(0, warmupBatch(200), std::nullopt, 200, std::nullopt);
    EXPECT_TRUE(w.ok()) << w.status();
    if (!w.ok()) return out;
    out.maxTokens = w->maxSupportedTotalTokens;
    RequestSpec r;
    r.id = 1;
    r.inputIds = ref_["prompts"][0]["input_ids"].get<std::vector<uint32_t>>();
    r.stopping.maxNewTokens = 24;
    r.stopping.ignoreEosToken = true;
    r.sampling.topNTokens = 5;
    for (uint32_t b = 0; b < (r.inputIds.size() + 24 + 15) / 16; ++b) r.blocks.push_back(b);
    auto s = engine.prefill(1, {r}, std::nullopt);
    while (s.ok()) {
      for (const auto& g : s->generations) {
        out.ids.push_back(g.tokens.ids[0]);
        out.top.push_back(g.topTokens.empty() ? std::vector<uint32_t>{} : g.topTokens[0].ids);
      }
      if (!s->batch) break;
      s = engine.decode({s->batch->id});
    }
    EXPECT_TRUE(s.ok()) << s.status();
    return out;
  };
  const Run f16 = run(kernels::KvCacheDType::kAuto);
  for (kernels::KvCacheDType cache :
       {kernels::KvCacheDType::kFp8E4M3, kernels::KvCacheDType::kFp8E5M2}) {
    SCOPED_TRACE(std::string(kernels::kvCacheDTypeName(cache)));
    const Run fp8 = run(cache);
    std::printf("%s: max_supported_total_tokens %u (float16 cache: %u)\n",
                std::string(kernels::kvCacheDTypeName(cache)).c_str(), fp8.maxTokens,
                f16.maxTokens);
    EXPECT_GT(static_cast<double>(fp8.maxTokens), 1.8 * static_cast<double>(f16.maxTokens));
    ASSERT_EQ(fp8.ids.size(), 24u);
    ASSERT_EQ(f16.ids.size(), 24u);
    size_t first = 0;
    while (first < fp8.ids.size() && fp8.ids[first] == f16.ids[first]) ++first;
    std::printf("%s: %zu of 24 greedy tokens equal to the float16 cache's before a divergence\n",
                std::string(kernels::kvCacheDTypeName(cache)).c_str(), first);
    if (first < fp8.ids.size()) {
      auto among = [](uint32_t id, const std::vector<uint32_t>& top) {
        return std::find(top.begin(), top.end(), id) != top.end();
      };
      EXPECT_TRUE(among(fp8.ids[first], f16.top[first])) << "token " << first;
      EXPECT_TRUE(among(f16.ids[first], fp8.top[first])) << "token " << first;
    }
  }
}

}  // namespace
}  // namespace textgen::runtime
