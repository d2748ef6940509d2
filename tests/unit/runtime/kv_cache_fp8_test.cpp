// The demo model (models/demo, float32 on the CPU backend) served with an fp8 KV cache
// (EngineOptions::kvCacheDtype, --kv-cache-dtype) next to the float32 cache:
//  - Warmup gives the same byte budget four times the blocks (one byte an element against four);
//  - teacher-forced over a 202-token passage: the most likely next token agrees at nearly every
//    position and the perplexity moves by well under 1% (measured: e4m3fn 198/202 positions,
//    -0.32%; e5m2 194/202, +0.34%; the largest |key| or |value| is about 10, far from either
//    format's saturation);
//  - greedy generation compared as vLLM compares outputs: the first token equal, then tokens equal
//    up to the first divergence, and there each side's token among the other's 5 most likely. This
//    small model has many near ties: the first divergence comes after 1 to 48 tokens (printed), so
//    nothing is asserted about how late it comes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "textgen/runtime/engine.h"

namespace textgen::runtime {
namespace {

constexpr int64_t kBlockSize = 16;
constexpr int64_t kBudget = 6 << 20;  // bytes: 1 MiB a layer for keys and values
constexpr uint32_t kNewTokens = 48;
constexpr uint32_t kTopN = 5;

const char* const kPrompts[] = {"The Python interpreter", "A list comprehension", "To open a file",
                                "The :mod:`os` module provides", "Exceptions are raised when"};

struct Generated {
  std::vector<uint32_t> ids;
  std::vector<float> logprobs;
  std::vector<std::vector<uint32_t>> top;  // per token: the kTopN most likely ids
};

class KvCacheFp8Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    backend_ = makeCpuBackend(2).release();
    auto m = loadModel(TEXTGEN_DEMO_MODEL, *backend_);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = m->release();
    auto t = tokenizer::Tokenizer::fromDirectory(TEXTGEN_DEMO_MODEL);
    ASSERT_TRUE(t.ok()) << t.status();
    tok_ = t->release();
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete model_;
    delete backend_;
  }

  static std::unique_ptr<Engine> engine(kernels::KvCacheDType cache, WarmupResult* warm) {
    auto e = std::make_unique<Engine>(
        *model_, *tok_, *backend_,
        EngineOptions{.blockSize = kBlockSize, .kvCacheBytes = kBudget, .kvCacheDtype = cache});
    auto w = e->warmup(0, {}, std::nullopt, 256, std::nullopt);
    EXPECT_TRUE(w.ok()) << w.status();
    if (w.ok() && warm) *warm = *w;
    return e;
  }

  // Greedy generation of kNewTokens after each prompt, all prompts in one batch.
  static std::vector<Generated> generate(Engine& e) {
    std::vector<RequestSpec> specs;
    uint32_t nextBlock = 0;
    for (uint64_t i = 0; i < std::size(kPrompts); ++i) {
      auto enc = tok_->encode(kPrompts[i]);
      EXPECT_TRUE(enc.ok());
      RequestSpec r;
      r.id = i;
      r.inputIds = enc->ids;
      r.sampling.topNTokens = kTopN;
      r.stopping.maxNewTokens = kNewTokens;
      r.stopping.ignoreEosToken = true;
      const auto blocks = (r.inputIds.size() + kNewTokens + kBlockSize - 1) / kBlockSize;
      for (size_t b = 0; b < blocks; ++b) r.blocks.push_back(nextBlock++);
      specs.push_back(std::move(r));
    }
    std::vector<Generated> out(specs.size());
    auto absorb = [&](const StepResult& s) {
      for (const GenerationResult& g : s.generations) {
        Generated& o = out[g.requestId];
        o.ids.insert(o.ids.end(), g.tokens.ids.begin(), g.tokens.ids.end());
        o.logprobs.insert(o.logprobs.end(), g.tokens.logprobs.begin(), g.tokens.logprobs.end());
        for (const TokenList& t : g.topTokens) o.top.push_back(t.ids);
      }
    };
    auto step = e.prefill(1, std::move(specs), std::nullopt);
    EXPECT_TRUE(step.ok()) << step.status();
    while (step.ok()) {
      absorb(*step);
      if (!step->batch) break;
      step = e.decode({step->batch->id});
      EXPECT_TRUE(step.ok()) << step.status();
    }
    return out;
  }

  static Backend* backend_;
  static Model* model_;
  static tokenizer::Tokenizer* tok_;
};

Backend* KvCacheFp8Test::backend_ = nullptr;
Model* KvCacheFp8Test::model_ = nullptr;
tokenizer::Tokenizer* KvCacheFp8Test::tok_ = nullptr;

TEST_F(KvCacheFp8Test, WarmupGivesTheSameBytesFourTimesTheBlocksOfAFloat32Cache) {
  WarmupResult f32, fp8;
  engine(kernels::KvCacheDType::kAuto, &f32);
  engine(kernels::KvCacheDType::kFp8E4M3, &fp8);
  const KvShape kv = model_->kvShape();
  EXPECT_EQ(KvCache::bytesPerBlock(kv, kBlockSize, kernels::DType::kF32),
            4 * KvCache::bytesPerBlock(kv, kBlockSize, kernels::DType::kF32,
                                       kernels::KvCacheDType::kFp8E5M2));
  EXPECT_EQ(KvCache::bytesPerBlock(kv, kBlockSize, kernels::DType::kBF16),
            2 * KvCache::bytesPerBlock(kv, kBlockSize, kernels::DType::kBF16,
                                       kernels::KvCacheDType::kFp8E4M3));
  const int64_t f32Blocks = kBudget / KvCache::bytesPerBlock(kv, kBlockSize, kernels::DType::kF32);
  EXPECT_EQ(f32.maxSupportedTotalTokens, f32Blocks * kBlockSize);
  EXPECT_EQ(fp8.maxSupportedTotalTokens, 4 * f32.maxSupportedTotalTokens);
}

TEST_F(KvCacheFp8Test, GreedyOutputFollowsTheFloat32CacheUntilANearTie) {
  auto ref = engine(kernels::KvCacheDType::kAuto, nullptr);
  const std::vector<Generated> want = generate(*ref);
  for (kernels::KvCacheDType cache :
       {kernels::KvCacheDType::kFp8E4M3, kernels::KvCacheDType::kFp8E5M2}) {
    SCOPED_TRACE(std::string(kernels::kvCacheDTypeName(cache)));
    auto e = engine(cache, nullptr);
    const std::vector<Generated> got = generate(*e);
    ASSERT_EQ(got.size(), want.size());
    for (size_t p = 0; p < want.size(); ++p) {
      SCOPED_TRACE(kPrompts[p]);
      ASSERT_EQ(got[p].ids.size(), kNewTokens);
      ASSERT_EQ(want[p].ids.size(), kNewTokens);
      ASSERT_EQ(got[p].top.size(), kNewTokens);
      // The first token comes from the prompt's own keys and values, read back from fp8: its
      // logprob moves a little (up to 0.18 measured, e4m3fn on "A list comprehension"), not the
      // choice.
      EXPECT_EQ(got[p].ids[0], want[p].ids[0]);
      EXPECT_NEAR(got[p].logprobs[0], want[p].logprobs[0], 0.3f);
      size_t first = 0;
      while (first < kNewTokens && got[p].ids[first] == want[p].ids[first]) ++first;
      std::printf("%s, %s: %zu of %u tokens equal before the first divergence\n",
                  std::string(kernels::kvCacheDTypeName(cache)).c_str(), kPrompts[p], first,
                  kNewTokens);
      if (first == kNewTokens) continue;
      auto among = [](uint32_t id, const std::vector<uint32_t>& top) {
        return std::find(top.begin(), top.end(), id) != top.end();
      };
      EXPECT_TRUE(among(got[p].ids[first], want[p].top[first])) << "token " << first;
      EXPECT_TRUE(among(want[p].ids[first], got[p].top[first])) << "token " << first;
    }
  }
}

// Teacher-forced: one prefill of a reStructuredText passage in the style of the demo's corpus, the
// logits of every position, with the float32 cache and each fp8 one.
constexpr const char* kPassage =
    "The :mod:`os` module provides a portable way of using operating system dependent "
    "functionality. If you just want to read or write a file see :func:`open`, if you want to "
    "manipulate paths, see the :mod:`os.path` module, and if you want to read all the lines in "
    "all the files on the command line see the :mod:`fileinput` module.\n\n"
    ".. function:: getenv(key, default=None)\n\n"
    "   Return the value of the environment variable *key* as a string if it exists, or "
    "*default* if it doesn't. *key* is a string. Note that since :func:`getenv` uses "
    ":data:`os.environ`, the mapping of :func:`getenv` is similarly also captured on import, and "
    "the function may not reflect future environment changes.\n\n"
    ".. exception:: error\n\n"
    "   An alias for the built-in :exc:`OSError` exception.\n";

TEST_F(KvCacheFp8Test, TeacherForcedLogitsOfAPassageStayClose) {
  auto enc = tok_->encode(kPassage);
  ASSERT_TRUE(enc.ok());
  const std::vector<uint32_t>& ids = enc->ids;
  const auto n = static_cast<int64_t>(ids.size());
  std::vector<uint32_t> blocks;
  for (int64_t i = 0; i < n; i += kBlockSize)
    blocks.push_back(static_cast<uint32_t>(blocks.size()));
  ForwardBatch b;
  b.sequences.push_back({.firstRow = 0, .numRows = n, .startPos = 0, .blocks = blocks});
  for (int64_t i = 0; i < n; ++i) {
    b.tokenIds.push_back(ids[i]);
    b.slots.push_back(static_cast<uint32_t>(i));
    b.logitRows.push_back(i);
  }
  const int64_t vocab = model_->config().vocabSize;
  float maxKey = 0.0f;
  auto run = [&](kernels::KvCacheDType cache) {
    auto kv = KvCache::create(*backend_, model_->kvShape(), static_cast<int64_t>(blocks.size()),
                              kBlockSize, model_->dtype(), cache);
    EXPECT_TRUE(kv.ok());
    auto logits = model_->forward(b, **kv);
    EXPECT_TRUE(logits.ok()) << logits.status();
    if (cache == kernels::KvCacheDType::kAuto) {
      for (int64_t l = 0; l < model_->kvShape().layers; ++l) {
        const auto* k = static_cast<const float*>((*kv)->keys(l));
        const auto* v = static_cast<const float*>((*kv)->values(l));
        for (int64_t i = 0; i < n * model_->kvShape().kvHeads * model_->kvShape().headDim; ++i)
          maxKey = std::max({maxKey, std::fabs(k[i]), std::fabs(v[i])});
      }
    }
    // Log-softmax of each row.
    std::vector<float> out = logits.ok() ? *logits : std::vector<float>(n * vocab);
    for (int64_t r = 0; r < n; ++r) {
      float* row = out.data() + r * vocab;
      const float m = *std::max_element(row, row + vocab);
      double sum = 0.0;
      for (int64_t j = 0; j < vocab; ++j) sum += std::exp(row[j] - m);
      const auto lse = static_cast<float>(m + std::log(sum));
      for (int64_t j = 0; j < vocab; ++j) row[j] -= lse;
    }
    return out;
  };
  const std::vector<float> ref = run(kernels::KvCacheDType::kAuto);
  std::printf("%lld tokens; largest |key| or |value| in the float32 cache %.2f\n",
              static_cast<long long>(n), maxKey);
  auto nll = [&](const std::vector<float>& lp) {
    double s = 0.0;
    for (int64_t r = 0; r + 1 < n; ++r) s -= lp[r * vocab + ids[r + 1]];
    return s / static_cast<double>(n - 1);
  };
  for (kernels::KvCacheDType cache :
       {kernels::KvCacheDType::kFp8E4M3, kernels::KvCacheDType::kFp8E5M2}) {
    const std::vector<float> got = run(cache);
    int64_t sameTop = 0;
    double maxDiff = 0.0, meanDiff = 0.0;
    for (int64_t r = 0; r < n; ++r) {
      const float* a = got.data() + r * vocab;
      const float* w = ref.data() + r * vocab;
      sameTop += std::max_element(a, a + vocab) - a == std::max_element(w, w + vocab) - w;
      for (int64_t j = 0; j < vocab; ++j) {
        // Differences of the likely tokens' logprobs (the tail's are noise far below them).
        if (w[j] < -10.0f) continue;
        const double d = std::fabs(a[j] - w[j]);
        maxDiff = std::max(maxDiff, d);
      }
      if (r + 1 < n) meanDiff += std::fabs(a[ids[r + 1]] - w[ids[r + 1]]);
    }
    meanDiff /= static_cast<double>(n - 1);
    const double pplRef = std::exp(nll(ref)), ppl = std::exp(nll(got));
    std::printf(
        "%s: top-1 equal at %lld of %lld positions; |logprob difference| of the next token mean "
        "%.4f, of likely tokens max %.4f; perplexity %.4f against %.4f (%+.2f%%)\n",
        std::string(kernels::kvCacheDTypeName(cache)).c_str(), static_cast<long long>(sameTop),
        static_cast<long long>(n), meanDiff, maxDiff, ppl, pplRef, 100.0 * (ppl / pplRef - 1.0));
    // Bounds about twice the measured differences (e5m2 has one mantissa bit less than e4m3fn);
    // the perplexity within the budget for 8-bit formats, either way.
    const bool e4m3 = cache == kernels::KvCacheDType::kFp8E4M3;
    EXPECT_GE(static_cast<double>(sameTop), (e4m3 ? 0.95 : 0.92) * static_cast<double>(n));
    EXPECT_LT(meanDiff, e4m3 ? 0.075 : 0.15);
    EXPECT_LT(std::fabs(ppl / pplRef - 1.0), 0.01);
  }
}

}  // namespace
}  // namespace textgen::runtime
