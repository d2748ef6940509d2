// Sampling and stopping: each processor's effect, seeded determinism independent of the batch, and
// TGI's order of stopping reasons.
#include "textgen/runtime/sampling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "textgen/base/sampling_rules.h"
#include "textgen/runtime/stopping.h"

namespace textgen::runtime {
namespace {

std::vector<float> logits() {
  return {1.0f, 3.0f, 2.0f, 0.5f, -1.0f};
}

TEST(SamplingTest, GreedyTakesArgmaxWithProcessedLogprob) {
  RequestSampler s({});
  auto l = logits();
  TokenChoice c = s.choose(l, {});
  EXPECT_EQ(c.id, 1u);
  double sum = 0;
  for (float x : logits()) sum += std::exp(x);
  EXPECT_NEAR(c.logprob, 3.0 - std::log(sum), 1e-5);
}

TEST(SamplingTest, RepetitionAndFrequencyPenaltiesAndBias) {
  SamplingParams p;
  p.repetitionPenalty = 2.0f;  // token 1 (3.0 -> 1.5) loses to token 2
  RequestSampler s(p);
  auto l = logits();
  EXPECT_EQ(s.choose(l, std::vector<uint32_t>{1}).id, 2u);
  p = {};
  p.frequencyPenalty = 0.6f;  // token 1 seen twice: 3.0 - 1.2 = 1.8 < 2.0
  RequestSampler f(p);
  l = logits();
  EXPECT_EQ(f.choose(l, std::vector<uint32_t>{1, 1}).id, 2u);
  p = {};
  p.logitBias[4] = 10.0f;
  RequestSampler b(p);
  l = logits();
  EXPECT_EQ(b.choose(l, {}).id, 4u);
}

// The engine keeps and sends a request's token history only when a penalty reads it; each penalty
// alone must count (presence alone is OpenAI's, and repetition 0 is "off", as 1).
TEST(SamplingTest, AnyPenaltyAloneReadsTheHistory) {
  SamplingParams p;
  EXPECT_FALSE(p.penalized());
  p.repetitionPenalty = 0.0f;
  EXPECT_FALSE(p.penalized());
  p.repetitionPenalty = 1.1f;
  EXPECT_TRUE(p.penalized());
  p = {};
  p.frequencyPenalty = -0.5f;
  EXPECT_TRUE(p.penalized());
  p = {};
  p.presencePenalty = 0.25f;
  EXPECT_TRUE(p.penalized());
  // Presence alone changes the choice through the history: token 1 (3.0 - 1.5) loses to token 2.
  p.presencePenalty = 1.5f;
  RequestSampler s(p);
  auto l = logits();
  EXPECT_EQ(s.choose(l, std::vector<uint32_t>{1}).id, 2u);
  // Without a penalty the history changes nothing.
  RequestSampler none({});
  l = logits();
  EXPECT_EQ(none.choose(l, std::vector<uint32_t>{1, 1, 1}).id, 1u);
}

TEST(SamplingTest, TopKTopPTypicalRestrictTheSupport) {
  for (int trial = 0; trial < 200; ++trial) {
    SamplingParams p;
    p.doSample = true;
    p.seed = trial;
    p.topK = 2;
    RequestSampler k(p);
    auto l = logits();
    const uint32_t id = k.choose(l, {}).id;
    EXPECT_TRUE(id == 1 || id == 2) << id;
    p.topK = 0;
    p.topP = 0.5f;  // the best token alone has more than half the mass
    RequestSampler tp(p);
    l = logits();
    EXPECT_EQ(tp.choose(l, {}).id, 1u);
  }
  SamplingParams p;
  p.doSample = true;
  p.typicalP = 0.2f;
  p.seed = 1;
  RequestSampler t(p);
  auto l = logits();
  const TokenChoice c = t.choose(l, {});
  EXPECT_FALSE(std::isinf(c.logprob));
}

TEST(SamplingTest, SeededDrawsAreReproducibleAndTopNIsSorted) {
  SamplingParams p;
  p.doSample = true;
  p.seed = 42;
  p.temperature = 1.5f;
  p.topNTokens = 3;
  RequestSampler a(p), b(p);
  std::map<uint32_t, int> seen;
  for (int i = 0; i < 300; ++i) {
    auto la = logits(), lb = logits();
    const TokenChoice x = a.choose(la, {}), y = b.choose(lb, {});
    ASSERT_EQ(x.id, y.id);  // same seed, same draws, whatever else the batch holds
    ASSERT_EQ(x.top.size(), 3u);
    EXPECT_EQ(x.top[0].first, 1u);
    EXPECT_GE(x.top[0].second, x.top[1].second);
    ++seen[x.id];
  }
  EXPECT_GE(seen.size(), 3u);  // actually samples
}

TEST(SamplingTest, ValidationNamesTheParameter) {
  SamplingParams p;
  p.topP = 1.5f;
  EXPECT_NE(validateSamplingParams(p).message().find("top_p"), std::string::npos);
  p = {};
  p.temperature = -0.1f;
  EXPECT_NE(validateSamplingParams(p).message().find("temperature"), std::string::npos);
  p = {};
  p.repetitionPenalty = NAN;
  EXPECT_FALSE(validateSamplingParams(p).ok());
  // top_n_tokens: the sampler's work and memory grow with it for every row of the batch.
  p = {};
  p.topNTokens = kMaxTopNTokens;
  EXPECT_TRUE(validateSamplingParams(p).ok());
  p.topNTokens = kMaxTopNTokens + 1;
  EXPECT_NE(validateSamplingParams(p).message().find("top_n_tokens"), std::string::npos);
  p.topNTokens = 500000000;
  EXPECT_FALSE(validateSamplingParams(p).ok());
}

TEST(StoppingTest, LengthBeforeEosBeforeStopSequence) {
  StoppingCriteria s({.maxNewTokens = 3, .stopSequences = {"end."}, .ignoreEosToken = false},
                     {2, 9});
  EXPECT_FALSE(s.update(5, "the"));
  EXPECT_EQ(s.update(9, " en"), FinishReason::kEosToken);
  StoppingCriteria t({.maxNewTokens = 2, .stopSequences = {}, .ignoreEosToken = false}, {2});
  EXPECT_FALSE(t.update(5, "a"));
  EXPECT_EQ(t.update(2, "b"), FinishReason::kLength);  // length is checked first, as in TGI
  StoppingCriteria u({.maxNewTokens = 10, .stopSequences = {"end."}, .ignoreEosToken = true}, {2});
  EXPECT_FALSE(u.update(2, "the e"));
  EXPECT_FALSE(u.update(3, "nd"));
  EXPECT_EQ(u.update(4, "."), FinishReason::kStopSequence);
}

}  // namespace
}  // namespace textgen::runtime
