// Token choice, the stage after the model (vLLM's Sampler): over a step's logits where the model
// left them (Model::forwardLogits), the arg-max or kernels::sample through the backend, enqueued on
// the backend's stream right after the forward with no synchronisation in between; only the choices
// are downloaded, never the logits. It owns its own backend buffers (inputs, scratch, outputs).
// The per-request side of sampling (parameters, seeded generator, history) is RequestSampler
// (sampling.h); this stage runs a whole step's rows at once.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "textgen/base/status_or.h"
#include "textgen/kernels/sample.h"
#include "textgen/runtime/backend.h"
#include "textgen/runtime/model.h"

namespace textgen::runtime {

// A greedy choice: the arg-max and its log-probability.
struct GreedyToken {
  uint32_t id = 0;
  float logprob = 0.0f;
};

// Per logit row, what kernels::sample needs (row ranges index the shared arrays).
struct SampleBatch {
  std::vector<kernels::SampleRow> rows;
  std::vector<int32_t> historyTokens, historyCounts, biasTokens;
  std::vector<float> biasValues;
  std::vector<uint32_t> masks;  // constrained rows' token bitmasks (SampleRow::maskBegin)
  int64_t maxTopN = 0;
};

// A sampled token with its top-n alternatives (best first).
struct SampledToken {
  uint32_t id = 0;
  float logprob = 0.0f;
  std::vector<std::pair<uint32_t, float>> top;
};

class Sampler {
 public:
  explicit Sampler(Backend& backend) : backend_(backend) {}

  // Each logit row's arg-max (the lowest id among equal maxima) and its log-probability.
  StatusOr<std::vector<GreedyToken>> greedy(const LogitsView& logits);
  // Each logit row's token chosen by kernels::sample (TGI's processors, the row's draw, top-n).
  // INVALID_ARGUMENT unless `batch` has one row per logit row.
  StatusOr<std::vector<SampledToken>> sample(const LogitsView& logits, const SampleBatch& batch);

 private:
  Backend& backend_;
  // Greedy: [ids | logprobs]. Sampling: the inputs [rows | history tokens | counts | bias tokens |
  // bias values | masks], float32 and float64 scratch [rows, vocab], the outputs [ids | logprobs |
  // top ids | top logprobs].
  std::unique_ptr<Buffer> greedyOut_, sampleIn_, sampleWork_, sampleProbs_, sampleOut_;
};

}  // namespace textgen::runtime
