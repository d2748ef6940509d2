// Choosing the next token of one request, in TGI's order: repetition penalty, frequency penalty and
// logit bias on the raw logits, then the warpers temperature, top-k, top-p and typical-p; the
// returned log-probabilities are those of the processed distribution. Each request has its own
// seeded generator, so its draws never depend on the other requests of the batch.
#pragma once

#include <cstdint>
#include <map>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "textgen/base/status.h"
#include "textgen/kernels/sample.h"

namespace textgen::runtime {

struct SamplingParams {
  float temperature = 1.0f;  // 0 means 1
  uint32_t topK = 0;         // 0: off
  float topP = 1.0f;         // 0 or 1: off
  float typicalP = 1.0f;     // 0 or 1: off
  bool doSample = false;     // false: arg-max
  uint64_t seed = 0;
  float repetitionPenalty = 1.0f;  // 0 or 1: off
  float frequencyPenalty = 0.0f;
  float presencePenalty = 0.0f;  // OpenAI's: once per distinct token of the history
  std::map<uint32_t, float> logitBias;
  uint32_t topNTokens = 0;
  // Constrained output (TGI's grammar): a regular expression or a JSON Schema the generated text
  // must match; empty: unconstrained. Tokens that cannot continue a match are masked out.
  enum class Grammar { kNone, kJson, kRegex };
  Grammar grammarType = Grammar::kNone;
  std::string grammar;
  // Kirchenbauer's watermark (TGI's `watermark`): the engine's green list after the previous token
  // gets its delta (textgen/base/watermark.h).
  bool watermark = false;

  // Whether a penalty reads the history: without one the history changes no logit (the kernels
  // then subtract 0 from each of its tokens'), so it is neither counted nor sent.
  bool penalized() const {
    return (repetitionPenalty > 0.0f && repetitionPenalty != 1.0f) || frequencyPenalty != 0.0f ||
           presencePenalty != 0.0f;
  }
};

// INVALID_ARGUMENT naming the first bad field (TGI's validation rules).
Status validateSamplingParams(const SamplingParams& p);

struct TokenChoice {
  uint32_t id = 0;
  float logprob = 0.0f;                         // of id, in the processed distribution
  std::vector<std::pair<uint32_t, float>> top;  // topNTokens best (id, logprob), best first
};

// The distinct tokens of a request's history with their counts (the penalties' input), kept up to
// date one token at a time, in first-seen order.
class TokenCounts {
 public:
  TokenCounts() = default;
  explicit TokenCounts(std::span<const uint32_t> tokens) {
    for (uint32_t id : tokens) add(id);
  }
  void add(uint32_t id) {
    auto [it, inserted] = index_.emplace(id, tokens_.size());
    if (inserted) {
      tokens_.push_back(static_cast<int32_t>(id));
      counts_.push_back(1);
    } else {
      ++counts_[it->second];
    }
  }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  const std::vector<int32_t>& counts() const { return counts_; }

 private:
  std::unordered_map<uint32_t, size_t> index_;
  std::vector<int32_t> tokens_, counts_;
};

// One request's side of token choice: its parameters and seeded generator. It builds the request's
// row of a step's kernels::sample inputs (Sampler, sampler.h, runs the step's rows where the logits
// are), and chooses on the host from downloaded logits (steps with prompt log-probabilities).
class RequestSampler {
 public:
  explicit RequestSampler(SamplingParams params);
  // `logits` is modified in place. `history`: every token so far (prompt and generated), for the
  // penalties. `mask`: the allowed tokens' bitmask (kernels::SampleRow::maskBegin), or empty.
  // `green`: the watermark's green list (same layout) whose logits get `greenDelta`, or empty.
  TokenChoice choose(std::span<float> logits, std::span<const uint32_t> history,
                     std::span<const uint32_t> mask = {}, std::span<const uint32_t> green = {},
                     float greenDelta = 0.0f);
  const SamplingParams& params() const { return params_; }

  // The inputs of kernels::sample for this step: distinct history tokens with counts, the bias, and
  // (when sampling) this step's draw from the request's generator, which advances.
  struct SampleInputs {
    std::vector<int32_t> historyTokens, historyCounts, biasTokens;
    std::vector<float> biasValues;
    double uniform = 0.0;
  };
  SampleInputs sampleInputs(const TokenCounts& history, uint32_t vocab);
  // Advances the generator as one step's draw would (a resumed request replaying its output).
  void skipDraw();
  // Speculative steps draw for every proposed position up front: saveDraws() before them, then
  // restoreDraws(used) leaves the generator as `used` single steps would have (the draws of the
  // rejected positions are taken again by the steps that choose those positions).
  void saveDraws() { saved_ = rng_; }
  void restoreDraws(int64_t used) {
    rng_ = saved_;
    for (int64_t i = 0; i < used; ++i) skipDraw();
  }
  // The row parameters for those inputs (history and bias ranges start at 0).
  kernels::SampleRow sampleRow(const SampleInputs& in) const;

 private:
  SamplingParams params_;
  std::mt19937_64 rng_, saved_;
};

// Natural-log softmax of raw logits (prefill log-probabilities).
void logSoftmax(std::span<const float> logits, std::span<float> out);

}  // namespace textgen::runtime
