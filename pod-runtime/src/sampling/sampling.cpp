#include "textgen/runtime/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>

namespace textgen::runtime {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void softmaxInPlace(std::vector<double>& v) {
  const double m = *std::max_element(v.begin(), v.end());
  double sum = 0;
  for (double& x : v) sum += (x = std::exp(x - m));
  for (double& x : v) x /= sum;
}

// Indices sorted by logit, best first (ties: lower id first, for determinism).
std::vector<uint32_t> sortedIds(std::span<const float> logits) {
  std::vector<uint32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0u);
  std::stable_sort(ids.begin(), ids.end(),
                   [&](uint32_t a, uint32_t b) { return logits[a] > logits[b]; });
  return ids;
}

}  // namespace

Status validateSamplingParams(const SamplingParams& p) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature))
    return invalidArgumentError("temperature must be >= 0");
  if (!(p.topP >= 0.0f && p.topP <= 1.0f)) return invalidArgumentError("top_p must be in [0, 1]");
  if (!(p.typicalP >= 0.0f && p.typicalP <= 1.0f))
    return invalidArgumentError("typical_p must be in [0, 1]");
  if (!(p.repetitionPenalty >= 0.0f) || !std::isfinite(p.repetitionPenalty)) {
    return invalidArgumentError("repetition_penalty must be >= 0");
  }
  if (!std::isfinite(p.frequencyPenalty))
    return invalidArgumentError("frequency_penalty must be finite");
  for (const auto& [id, bias] : p.logitBias) {
    if (!std::isfinite(bias))
      return invalidArgumentError("logit_bias of token " + std::to_string(id) + " must be finite");
  }
  return okStatus();
}

Sampler::Sampler(SamplingParams params) : params_(std::move(params)), rng_(params_.seed) {}

void logSoftmax(std::span<const float> logits, std::span<float> out) {
  const float m = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l - m));
  const auto lse = static_cast<float>(m + std::log(sum));
  for (size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - lse;
}

TokenChoice Sampler::choose(std::span<float> logits, std::span<const uint32_t> history) {
  const SamplingParams& p = params_;
  const auto vocab = static_cast<uint32_t>(logits.size());
  // Processors on the raw logits.
  if (p.repetitionPenalty > 0.0f && p.repetitionPenalty != 1.0f) {
    std::vector<bool> seen(vocab, false);
    for (uint32_t id : history) {
      if (id < vocab && !seen[id]) {
        seen[id] = true;
        logits[id] =
            logits[id] < 0 ? logits[id] * p.repetitionPenalty : logits[id] / p.repetitionPenalty;
      }
    }
  }
  if (p.frequencyPenalty != 0.0f) {
    std::unordered_map<uint32_t, int> counts;
    for (uint32_t id : history) {
      if (id < vocab) ++counts[id];
    }
    for (const auto& [id, n] : counts) logits[id] -= p.frequencyPenalty * static_cast<float>(n);
  }
  for (const auto& [id, bias] : p.logitBias) {
    if (id < vocab) logits[id] += bias;
  }
  // Warpers (only when sampling, as in TGI).
  if (p.doSample) {
    if (p.temperature > 0.0f && p.temperature != 1.0f) {
      for (float& l : logits) l /= p.temperature;
    }
    if (p.topK > 0 && p.topK < vocab) {
      std::vector<float> sorted(logits.begin(), logits.end());
      std::nth_element(sorted.begin(), sorted.begin() + (p.topK - 1), sorted.end(),
                       std::greater<>());
      const float kth = sorted[p.topK - 1];
      for (float& l : logits) {
        if (l < kth) l = kNegInf;
      }
    }
    if (p.topP > 0.0f && p.topP < 1.0f) {
      // Keep the smallest prefix of tokens (best first) whose probability reaches top_p.
      const std::vector<uint32_t> order = sortedIds(logits);
      std::vector<double> probs(vocab);
      for (uint32_t i = 0; i < vocab; ++i) probs[i] = logits[order[i]];
      softmaxInPlace(probs);
      double cumulative = 0;
      uint32_t keep = 0;
      while (keep < vocab) {
        cumulative += probs[keep++];
        if (cumulative >= p.topP) break;
      }
      for (uint32_t i = keep; i < vocab; ++i) logits[order[i]] = kNegInf;
    }
    if (p.typicalP > 0.0f && p.typicalP < 1.0f) {
      // Keep tokens whose surprisal is closest to the entropy, up to typical_p of the mass.
      std::vector<double> probs(logits.begin(), logits.end());
      softmaxInPlace(probs);
      double entropy = 0;
      for (double q : probs) {
        if (q > 0) entropy -= q * std::log(q);
      }
      std::vector<uint32_t> order(vocab);
      std::iota(order.begin(), order.end(), 0u);
      auto deviation = [&](uint32_t i) {
        return probs[i] > 0 ? std::fabs(-std::log(probs[i]) - entropy) : INFINITY;
      };
      std::stable_sort(order.begin(), order.end(),
                       [&](uint32_t a, uint32_t b) { return deviation(a) < deviation(b); });
      double cumulative = 0;
      uint32_t keep = 0;
      while (keep < vocab) {
        cumulative += probs[order[keep++]];
        if (cumulative >= p.typicalP) break;
      }
      for (uint32_t i = keep; i < vocab; ++i) logits[order[i]] = kNegInf;
    }
  }
  std::vector<float> logprobs(vocab);
  logSoftmax(logits, logprobs);
  TokenChoice c;
  if (p.doSample) {
    // One uniform draw per step from this request's own generator.
    const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
    double cumulative = 0;
    c.id = vocab - 1;
    for (uint32_t i = 0; i < vocab; ++i) {
      cumulative += std::exp(static_cast<double>(logprobs[i]));
      if (u < cumulative) {
        c.id = i;
        break;
      }
    }
    while (c.id > 0 && logprobs[c.id] == kNegInf) --c.id;  // rounding at the tail: stay in support
  } else {
    c.id = static_cast<uint32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  c.logprob = logprobs[c.id];
  if (p.topNTokens > 0) {
    const uint32_t n = std::min(p.topNTokens, vocab);
    std::vector<uint32_t> order(vocab);
    std::iota(order.begin(), order.end(), 0u);
    std::partial_sort(order.begin(), order.begin() + n, order.end(), [&](uint32_t a, uint32_t b) {
      return logprobs[a] > logprobs[b] || (logprobs[a] == logprobs[b] && a < b);
    });
    for (uint32_t i = 0; i < n; ++i) c.top.emplace_back(order[i], logprobs[order[i]]);
  }
  return c;
}

}  // namespace textgen::runtime
