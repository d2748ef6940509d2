// The CPU model against Hugging Face transformers (tests/reference/models, written by
// tools/reference/make_model_fixtures.py): prefill logits and top-5 log-probabilities of the last
// prompt position within stated tolerances, and 32 greedy tokens through the paged KV cache equal
// to transformers' greedy decoding with its KV cache — each prompt alone, and all prompts batched
// with requests joining and leaving at different steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "textgen/runtime/model.h"

namespace textgen::runtime {
namespace {

using nlohmann::json;

// Float32 on both sides; the difference is summation order (BLAS vs PyTorch), so a few ulps of the
// logit scale (logits here reach ~±30).
constexpr float kLogitAtol = 2e-4f;
constexpr float kLogitRtol = 1e-4f;
constexpr int64_t kBlockSize = 4;

const std::string kModels = TEXTGEN_MODEL_FIXTURES;

json readReference(const std::string& dir) {
  std::ifstream in(dir + "/reference.json");
  return json::parse(in);
}

// A request being decoded: its tokens so far and its (scattered) KV blocks.
struct Sequence {
  std::vector<uint32_t> tokens;  // prompt then generated
  std::vector<uint32_t> blocks;
  int64_t cached = 0;  // tokens whose KV is in the cache
  std::vector<uint32_t> generated;
};

uint32_t argmax(const float* logits, int64_t vocab) {
  return static_cast<uint32_t>(std::max_element(logits, logits + vocab) - logits);
}

// Runs one forward over the given sequences: each contributes its uncached tokens.
std::vector<std::vector<float>> step(Model& model, KvCache& cache, std::vector<Sequence*> seqs) {
  ForwardBatch b;
  for (Sequence* s : seqs) {
    const int64_t n = static_cast<int64_t>(s->tokens.size()) - s->cached;
    SequenceRows rows{.firstRow = static_cast<int64_t>(b.tokenIds.size()),
                      .numRows = n,
                      .startPos = s->cached,
                      .blocks = s->blocks};
    for (int64_t p = s->cached; p < s->cached + n; ++p) {
      b.tokenIds.push_back(s->tokens[p]);
      b.slots.push_back(s->blocks[p / kBlockSize] * kBlockSize + p % kBlockSize);
    }
    b.sequences.push_back(rows);
    b.logitRows.push_back(rows.firstRow + n - 1);
  }
  auto logits = model.forward(b, cache);
  EXPECT_TRUE(logits.ok()) << logits.status();
  if (!logits.ok()) return {};
  const int64_t vocab = model.config().vocabSize;
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < seqs.size(); ++i) {
    seqs[i]->cached = static_cast<int64_t>(seqs[i]->tokens.size());
    out.emplace_back(logits->begin() + i * vocab, logits->begin() + (i + 1) * vocab);
  }
  return out;
}

class ModelFixtureTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    const std::string dir = kModels + "/" + GetParam();
    backend_ = makeCpuBackend(1);
    auto model = loadModel(dir, *backend_);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    ref_ = readReference(dir);
    vocab_ = model_->config().vocabSize;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  json ref_;
  int64_t vocab_ = 0;
};

TEST_P(ModelFixtureTest, EachPromptAloneMatchesTransformers) {
  Backend* backend = backend_.get();
  Model* model = model_.get();
  const json& ref = ref_;
  const int64_t vocab = vocab_;
  for (const json& p : ref["prompts"]) {
    SCOPED_TRACE(p["text"].get<std::string>());
    auto cache = KvCache::create(*backend, model->config(), 64, kBlockSize);
    ASSERT_TRUE(cache.ok());
    Sequence s;
    s.tokens = p["input_ids"].get<std::vector<uint32_t>>();
    for (uint32_t b = 0; b < 16; ++b) s.blocks.push_back(63 - 3 * b);  // scattered, descending
    auto logits = step(*model, **cache, {&s});
    ASSERT_EQ(logits.size(), 1u);
    const auto want = p["last_logits"].get<std::vector<float>>();
    ASSERT_EQ(want.size(), static_cast<size_t>(vocab));
    float maxErr = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      const float err = std::fabs(logits[0][i] - want[i]);
      maxErr = std::max(maxErr, err);
      ASSERT_LE(err, kLogitAtol + kLogitRtol * std::fabs(want[i])) << "logit " << i;
    }
    RecordProperty("max_logit_error", std::to_string(maxErr));
    // Top-5 log-probabilities.
    double m = *std::max_element(logits[0].begin(), logits[0].end()), sum = 0;
    for (float l : logits[0]) sum += std::exp(static_cast<double>(l) - m);
    for (const json& t : p["top5"]) {
      const auto id = t[0].get<uint32_t>();
      EXPECT_NEAR(logits[0][id] - m - std::log(sum), t[1].get<double>(), 1e-4) << "token " << id;
    }
    // 32 greedy tokens through the KV cache.
    const auto greedy = p["greedy"].get<std::vector<uint32_t>>();
    std::vector<uint32_t> got{argmax(logits[0].data(), vocab)};
    while (got.size() < greedy.size()) {
      s.tokens.push_back(got.back());
      auto next = step(*model, **cache, {&s});
      ASSERT_EQ(next.size(), 1u);
      got.push_back(argmax(next[0].data(), vocab));
    }
    size_t first = 0;
    while (first < got.size() && got[first] == greedy[first]) ++first;
    EXPECT_EQ(got, greedy) << "first divergence at generated token " << first;
  }
}

TEST_P(ModelFixtureTest, BatchedRequestsJoinAndLeaveMatchAlone) {
  Backend* backend = backend_.get();
  Model* model = model_.get();
  const json& ref = ref_;
  const int64_t vocab = vocab_;
  auto cache = KvCache::create(*backend, model->config(), 64, kBlockSize);
  ASSERT_TRUE(cache.ok());
  // Blocks handed out in a shuffled order so sequences interleave in the cache.
  std::vector<uint32_t> freeBlocks(64);
  std::iota(freeBlocks.begin(), freeBlocks.end(), 0u);
  std::shuffle(freeBlocks.begin(), freeBlocks.end(), std::mt19937(5));
  const auto& prompts = ref["prompts"];
  std::vector<Sequence> seqs(prompts.size());
  std::vector<size_t> want(prompts.size());  // tokens each request generates before it leaves
  for (size_t i = 0; i < prompts.size(); ++i) {
    seqs[i].tokens = prompts[i]["input_ids"].get<std::vector<uint32_t>>();
    for (int b = 0; b < 12; ++b) {
      seqs[i].blocks.push_back(freeBlocks.back());
      freeBlocks.pop_back();
    }
    want[i] = 32 - 6 * i;  // request i leaves after 32, 26, 20, 14 tokens
  }
  // Request i joins at step 3*i: its prefill runs in the same forward as the others' decodes.
  for (int stepNo = 0; stepNo < 64; ++stepNo) {
    std::vector<Sequence*> active;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (stepNo >= static_cast<int>(3 * i) && seqs[i].generated.size() < want[i])
        active.push_back(&seqs[i]);
    }
    if (active.empty()) break;
    auto logits = step(*model, **cache, active);
    ASSERT_EQ(logits.size(), active.size());
    for (size_t a = 0; a < active.size(); ++a) {
      const uint32_t next = argmax(logits[a].data(), vocab);
      active[a]->generated.push_back(next);
      active[a]->tokens.push_back(next);
    }
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    auto greedy = prompts[i]["greedy"].get<std::vector<uint32_t>>();
    greedy.resize(want[i]);
    EXPECT_EQ(seqs[i].generated, greedy) << "request " << i << " (" << prompts[i]["text"] << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelFixtureTest,
                         ::testing::Values("llama-gqa", "llama-tied-linear", "llama-dynamic",
                                           "mistral-sharded"),
                         [](const ::testing::TestParamInfo<const char*>& param) {
                           std::string name = param.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace textgen::runtime
