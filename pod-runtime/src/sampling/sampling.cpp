#include "textgen/runtime/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>

#include "textgen/base/check.h"
#include "textgen/base/sampling_rules.h"

namespace textgen::runtime {
namespace {}  // namespace

Status validateSamplingParams(const SamplingParams& p) {
  // The router's ranges (one definition, textgen/base/sampling_rules.h); 0 means "off" here.
  auto off = [](float v) { return v == 0.0f ? 1.0f : v; };
  TG_RETURN_IF_ERROR(checkSamplingValues({.temperature = off(p.temperature),
                                          .repetitionPenalty = off(p.repetitionPenalty),
                                          .frequencyPenalty = p.frequencyPenalty,
                                          .topP = off(p.topP),
                                          .typicalP = off(p.typicalP),
                                          .topK = p.topK}));
  if (p.topNTokens > kMaxTopNTokens) {
    return invalidArgumentError("top_n_tokens must be at most " + std::to_string(kMaxTopNTokens) +
                                ", not " + std::to_string(p.topNTokens));
  }
  if (!(p.presencePenalty >= -2.0f && p.presencePenalty <= 2.0f))
    return invalidArgumentError("presence_penalty must be >= -2.0 and <= 2.0");
  for (const auto& [id, bias] : p.logitBias) {
    if (!std::isfinite(bias) || std::fabs(bias) > 100.0f)
      return invalidArgumentError("logit_bias of token " + std::to_string(id) +
                                  " must be finite, in [-100, 100] (OpenAI's range)");
  }
  return okStatus();
}

RequestSampler::RequestSampler(SamplingParams params)
    : params_(std::move(params)), rng_(params_.seed) {}

void logSoftmax(std::span<const float> logits, std::span<float> out) {
  const float m = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l - m));
  const auto lse = static_cast<float>(m + std::log(sum));
  for (size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - lse;
}

TokenChoice RequestSampler::choose(std::span<float> logits, std::span<const uint32_t> history,
                                   std::span<const uint32_t> mask, std::span<const uint32_t> green,
                                   float greenDelta) {
  const SamplingParams& p = params_;
  const auto vocab = static_cast<uint32_t>(logits.size());
  SampleInputs in = sampleInputs(p.penalized() ? TokenCounts(history) : TokenCounts(), vocab);
  kernels::SampleRow row = sampleRow(in);
  std::vector<uint32_t> masks(mask.begin(), mask.end());
  if (!mask.empty()) row.maskBegin = 0;
  if (!green.empty()) {
    row.greenBegin = static_cast<int64_t>(masks.size());
    row.greenDelta = greenDelta;
    masks.insert(masks.end(), green.begin(), green.end());
  }
  const auto n = static_cast<int64_t>(std::min(p.topNTokens, vocab));
  int32_t id = 0;
  float logprob = 0.0f;
  std::vector<int32_t> topIds(n);
  std::vector<float> topLogprobs(n);
  // The kernels' reference is the sampler: the CUDA kernel is tested against the same code.
  const Status st = kernels::sampleReference({.logits = logits.data(),
                                              .rowParams = &row,
                                              .historyTokens = in.historyTokens.data(),
                                              .historyCounts = in.historyCounts.data(),
                                              .biasTokens = in.biasTokens.data(),
                                              .biasValues = in.biasValues.data(),
                                              .masks = masks.empty() ? nullptr : masks.data(),
                                              .work = logits.data(),
                                              .ids = &id,
                                              .logprobs = &logprob,
                                              .topIds = topIds.data(),
                                              .topLogprobs = topLogprobs.data(),
                                              .rows = 1,
                                              .vocab = static_cast<int64_t>(vocab),
                                              .maxTopN = n,
                                              .dtype = kernels::DType::kF32});
  TG_CHECK(st.ok());  // the inputs are built above; validated parameters cannot fail
  TokenChoice c;
  c.id = static_cast<uint32_t>(id);
  c.logprob = logprob;
  for (int64_t i = 0; i < n; ++i)
    c.top.emplace_back(static_cast<uint32_t>(topIds[i]), topLogprobs[i]);
  return c;
}

RequestSampler::SampleInputs RequestSampler::sampleInputs(const TokenCounts& history,
                                                          uint32_t vocab) {
  SampleInputs in;
  for (size_t i = 0; i < history.tokens().size(); ++i) {
    if (static_cast<uint32_t>(history.tokens()[i]) >= vocab) continue;
    in.historyTokens.push_back(history.tokens()[i]);
    in.historyCounts.push_back(history.counts()[i]);
  }
  for (const auto& [id, bias] : params_.logitBias) {
    in.biasTokens.push_back(static_cast<int32_t>(id));
    in.biasValues.push_back(bias);
  }
  // One uniform draw per step from this request's own generator, when sampling.
  in.uniform = params_.doSample ? std::uniform_real_distribution<double>(0.0, 1.0)(rng_) : 0.0;
  return in;
}

void RequestSampler::skipDraw() {
  if (params_.doSample) (void)std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
}

kernels::SampleRow RequestSampler::sampleRow(const SampleInputs& in) const {
  const SamplingParams& p = params_;
  kernels::SampleRow row;
  row.temperature = p.temperature;
  row.topK = static_cast<int32_t>(std::min<uint32_t>(p.topK, INT32_MAX));
  row.topP = p.topP;
  row.typicalP = p.typicalP;
  row.doSample = p.doSample ? 1 : 0;
  row.repetitionPenalty = p.repetitionPenalty;
  row.frequencyPenalty = p.frequencyPenalty;
  row.presencePenalty = p.presencePenalty;
  row.topN = static_cast<int32_t>(p.topNTokens);
  row.uniform = in.uniform;
  row.historyEnd = static_cast<int32_t>(in.historyTokens.size());
  row.biasEnd = static_cast<int32_t>(in.biasTokens.size());
  return row;
}

}  // namespace textgen::runtime
