// The token-choice stage over logits where the model left them: the greedy arg-max and
// kernels::sample through the backend give what each request's host choice gives on the same
// logits, and the model's logits view is what its host path downloads (CPU backend).
#include "textgen/runtime/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "textgen/runtime/sampling.h"

namespace textgen::runtime {
namespace {

constexpr int64_t kVocab = 257;

// Rows of random logits in a backend buffer, and the view over them.
struct DeviceLogits {
  std::vector<float> host;
  std::unique_ptr<Buffer> buffer;
  LogitsView view() const {
    return {.buffer = buffer.get(),
            .rows = static_cast<int64_t>(host.size()) / kVocab,
            .vocab = kVocab,
            .dtype = kernels::DType::kF32};
  }
};

DeviceLogits randomLogits(Backend& backend, int64_t rows, uint64_t seed) {
  DeviceLogits d;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  d.host.resize(rows * kVocab);
  for (float& x : d.host) x = normal(rng);
  auto b = backend.allocate(d.host.size() * sizeof(float));
  EXPECT_TRUE(b.ok()) << b.status();
  d.buffer = std::move(*b);
  EXPECT_TRUE(backend.upload(*d.buffer, d.host.data(), d.host.size() * sizeof(float)).ok());
  return d;
}

TEST(SamplerTest, GreedyIsEachRowsArgmaxWithItsLogprob) {
  auto backend = makeCpuBackend(1);
  DeviceLogits l = randomLogits(*backend, 4, 1);
  // Equal maxima in row 2: the lowest id wins, as std::max_element.
  l.host[2 * kVocab + 17] = l.host[2 * kVocab + 90] = 50.0f;
  ASSERT_TRUE(backend->upload(*l.buffer, l.host.data(), l.host.size() * sizeof(float)).ok());
  Sampler sampler(*backend);
  auto picks = sampler.greedy(l.view());
  ASSERT_TRUE(picks.ok()) << picks.status();
  ASSERT_EQ(picks->size(), 4u);
  std::vector<float> lp(kVocab);
  for (int64_t r = 0; r < 4; ++r) {
    const float* row = l.host.data() + r * kVocab;
    const auto want = static_cast<uint32_t>(std::max_element(row, row + kVocab) - row);
    logSoftmax(std::span<const float>(row, kVocab), lp);
    EXPECT_EQ((*picks)[r].id, want) << "row " << r;
    EXPECT_NEAR((*picks)[r].logprob, lp[want], 1e-5f) << "row " << r;
  }
  EXPECT_EQ((*picks)[2].id, 17u);
}

// One step's SampleBatch, laid out as the engine lays it out (one row per request).
SampleBatch sampleBatch(std::vector<RequestSampler>& requests,
                        const std::vector<TokenCounts>& histories) {
  SampleBatch sb;
  for (size_t i = 0; i < requests.size(); ++i) {
    RequestSampler::SampleInputs in = requests[i].sampleInputs(histories[i], kVocab);
    kernels::SampleRow row = requests[i].sampleRow(in);
    row.historyBegin = static_cast<int32_t>(sb.historyTokens.size());
    row.historyEnd += row.historyBegin;
    row.biasBegin = static_cast<int32_t>(sb.biasTokens.size());
    row.biasEnd += row.biasBegin;
    sb.historyTokens.insert(sb.historyTokens.end(), in.historyTokens.begin(),
                            in.historyTokens.end());
    sb.historyCounts.insert(sb.historyCounts.end(), in.historyCounts.begin(),
                            in.historyCounts.end());
    sb.biasTokens.insert(sb.biasTokens.end(), in.biasTokens.begin(), in.biasTokens.end());
    sb.biasValues.insert(sb.biasValues.end(), in.biasValues.begin(), in.biasValues.end());
    sb.maxTopN = std::max<int64_t>(sb.maxTopN, row.topN);
    sb.rows.push_back(row);
  }
  return sb;
}

TEST(SamplerTest, SampleGivesEachRequestsHostChoice) {
  auto backend = makeCpuBackend(1);
  std::vector<SamplingParams> params(4);
  params[0].repetitionPenalty = 1.3f;
  params[0].logitBias = {{3, 5.0f}, {200, -2.0f}};
  params[1].doSample = true;
  params[1].seed = 7;
  params[1].topK = 20;
  params[1].topNTokens = 3;
  params[2].doSample = true;
  params[2].seed = 8;
  params[2].temperature = 0.7f;
  params[2].topP = 0.9f;
  params[2].frequencyPenalty = 0.4f;
  params[3].doSample = true;
  params[3].seed = 9;
  params[3].typicalP = 0.8f;
  params[3].topNTokens = 5;
  const std::vector<std::vector<uint32_t>> histories{{1, 3, 3, 9}, {}, {4, 4, 4, 100}, {256}};
  std::vector<RequestSampler> staged, host;
  std::vector<TokenCounts> counts;
  for (size_t i = 0; i < params.size(); ++i) {
    staged.emplace_back(params[i]);
    host.emplace_back(params[i]);
    counts.emplace_back(histories[i]);
  }
  Sampler sampler(*backend);
  for (uint64_t step = 0; step < 20; ++step) {  // the generators advance one draw a step
    DeviceLogits l = randomLogits(*backend, 4, 100 + step);
    auto got = sampler.sample(l.view(), sampleBatch(staged, counts));
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), 4u);
    for (size_t i = 0; i < params.size(); ++i) {
      std::vector<float> row(l.host.begin() + i * kVocab, l.host.begin() + (i + 1) * kVocab);
      const TokenChoice want = host[i].choose(row, histories[i]);
      EXPECT_EQ((*got)[i].id, want.id) << "step " << step << " row " << i;
      EXPECT_EQ((*got)[i].logprob, want.logprob) << "step " << step << " row " << i;
      EXPECT_EQ((*got)[i].top, want.top) << "step " << step << " row " << i;
    }
  }
}

TEST(SamplerTest, SampleWantsOneRowPerLogitRow) {
  auto backend = makeCpuBackend(1);
  DeviceLogits l = randomLogits(*backend, 2, 3);
  SampleBatch sb;
  sb.rows.resize(1);
  Sampler sampler(*backend);
  EXPECT_EQ(sampler.sample(l.view(), sb).status().code(), StatusCode::kInvalidArgument);
}

// The model leaves the requested rows' logits in its buffer: the view downloads to what the host
// path returns, and the sampler's greedy choice is the reference's first greedy token.
TEST(SamplerTest, ModelLogitsViewFeedsTheSampler) {
  const std::string dir = std::string(TEXTGEN_MODEL_FIXTURES) + "/llama-gqa";
  auto backend = makeCpuBackend(1);
  auto model = loadModel(dir, *backend);
  ASSERT_TRUE(model.ok()) << model.status();
  Model& m = **model;
  auto cache = KvCache::create(*backend, m.kvShape(), 16, 4);
  ASSERT_TRUE(cache.ok()) << cache.status();
  std::ifstream in(dir + "/reference.json");
  const nlohmann::json ref = nlohmann::json::parse(in);
  const auto prompt = ref["prompts"][0]["input_ids"].get<std::vector<uint32_t>>();
  ASSERT_LE(prompt.size(), 8u);
  std::vector<uint32_t> blocks{0, 1};
  ForwardBatch b;
  b.tokenIds = prompt;
  for (uint32_t p = 0; p < prompt.size(); ++p) b.slots.push_back(p);
  b.sequences.push_back({.firstRow = 0,
                         .numRows = static_cast<int64_t>(prompt.size()),
                         .startPos = 0,
                         .blocks = blocks});
  b.logitRows = {1, static_cast<int64_t>(prompt.size()) - 1};
  auto view = m.forwardLogits(b, **cache);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->rows, 2);
  EXPECT_EQ(view->vocab, m.config().vocabSize);
  EXPECT_EQ(view->dtype, m.dtype());
  auto downloaded = downloadLogits(*backend, *view);
  ASSERT_TRUE(downloaded.ok()) << downloaded.status();
  Sampler sampler(*backend);
  auto picks = sampler.greedy(*view);
  ASSERT_TRUE(picks.ok()) << picks.status();
  auto host = m.forward(b, **cache);  // the same forward again: the same KV, the same logits
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_EQ(*downloaded, *host);
  const int64_t vocab = m.config().vocabSize;
  for (int64_t r = 0; r < 2; ++r) {
    const float* row = host->data() + r * vocab;
    EXPECT_EQ((*picks)[r].id, static_cast<uint32_t>(std::max_element(row, row + vocab) - row));
  }
  EXPECT_EQ((*picks)[1].id, ref["prompts"][0]["greedy"][0].get<uint32_t>());
}

}  // namespace
}  // namespace textgen::runtime
