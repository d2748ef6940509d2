#include "textgen/kernels/sample.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "elements.h"

namespace textgen::kernels {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void softmaxInPlace(std::vector<double>& v) {
  const double m = *std::max_element(v.begin(), v.end());
  double sum = 0;
  for (double& x : v) sum += (x = std::exp(x - m));
  for (double& x : v) x /= sum;
}

// Indices sorted by logit, best first (ties: lower id first).
std::vector<uint32_t> sortedIds(const float* logits, uint32_t vocab) {
  std::vector<uint32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0u);
  std::stable_sort(ids.begin(), ids.end(),
                   [&](uint32_t a, uint32_t b) { return logits[a] > logits[b]; });
  return ids;
}

void processRow(const SampleParams& sp, const SampleRow& p, float* logits) {
  const auto vocab = static_cast<uint32_t>(sp.vocab);
  // Processors on the raw logits: the watermark first, as TGI.
  if (p.greenBegin >= 0) {
    const uint32_t* green = sp.masks + p.greenBegin;
    for (uint32_t i = 0; i < vocab; ++i) {
      if (green[i / 32] >> (i % 32) & 1u) logits[i] += p.greenDelta;
    }
  }
  if (p.repetitionPenalty > 0.0f && p.repetitionPenalty != 1.0f) {
    for (int32_t h = p.historyBegin; h < p.historyEnd; ++h) {
      const int32_t id = sp.historyTokens[h];
      if (id < 0 || static_cast<uint32_t>(id) >= vocab) continue;
      logits[id] =
          logits[id] < 0 ? logits[id] * p.repetitionPenalty : logits[id] / p.repetitionPenalty;
    }
  }
  if (p.frequencyPenalty != 0.0f || p.presencePenalty != 0.0f) {
    for (int32_t h = p.historyBegin; h < p.historyEnd; ++h) {
      const int32_t id = sp.historyTokens[h];
      if (id < 0 || static_cast<uint32_t>(id) >= vocab) continue;
      logits[id] -= p.frequencyPenalty * static_cast<float>(sp.historyCounts[h]);
      logits[id] -= p.presencePenalty;
    }
  }
  for (int32_t b = p.biasBegin; b < p.biasEnd; ++b) {
    const int32_t id = sp.biasTokens[b];
    if (id >= 0 && static_cast<uint32_t>(id) < vocab) logits[id] += sp.biasValues[b];
  }
  if (p.maskBegin >= 0) {
    const uint32_t* mask = sp.masks + p.maskBegin;
    for (uint32_t i = 0; i < vocab; ++i) {
      if (!(mask[i / 32] >> (i % 32) & 1u)) logits[i] = kNegInf;
    }
  }
  if (!p.doSample) return;
  // Warpers (only when sampling, as in TGI).
  if (p.temperature > 0.0f && p.temperature != 1.0f) {
    for (uint32_t i = 0; i < vocab; ++i) logits[i] /= p.temperature;
  }
  if (p.topK > 0 && static_cast<uint32_t>(p.topK) < vocab) {
    std::vector<float> sorted(logits, logits + vocab);
    std::nth_element(sorted.begin(), sorted.begin() + (p.topK - 1), sorted.end(), std::greater<>());
    const float kth = sorted[p.topK - 1];
    for (uint32_t i = 0; i < vocab; ++i) {
      if (logits[i] < kth) logits[i] = kNegInf;
    }
  }
  if (p.topP > 0.0f && p.topP < 1.0f) {
    // Keep the smallest prefix of tokens (best first) whose probability reaches top_p.
    const std::vector<uint32_t> order = sortedIds(logits, vocab);
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
    std::vector<double> probs(logits, logits + vocab);
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

}  // namespace

Status validateSample(const SampleParams& p) {
  if (p.rows < 0 || p.vocab <= 0 || p.maxTopN < 0) return invalidArgumentError("sample: bad shape");
  if (p.rows > 0 && (!p.logits || !p.rowParams || !p.work || !p.ids || !p.logprobs))
    return invalidArgumentError("sample: a pointer is missing");
  if (p.maxTopN > 0 && (!p.topIds || !p.topLogprobs))
    return invalidArgumentError("sample: top-n outputs are missing");

  return okStatus();
}

Status sampleReference(const SampleParams& sp) {
  TG_RETURN_IF_ERROR(validateSample(sp));
  const Elements e{sp.dtype};
  const auto vocab = static_cast<uint32_t>(sp.vocab);
  for (int64_t r = 0; r < sp.rows; ++r) {
    const SampleRow& p = sp.rowParams[r];
    if (p.topN > sp.maxTopN) return invalidArgumentError("sample: top_n above maxTopN");
    if ((p.maskBegin >= 0 || p.greenBegin >= 0) && !sp.masks)
      return invalidArgumentError("sample: a row has a token mask but no masks are given");
    float* logits = sp.work + r * sp.vocab;
    if (static_cast<const void*>(logits) !=
        static_cast<const void*>(static_cast<const char*>(sp.logits) +
                                 r * sp.vocab * static_cast<int64_t>(dtypeSize(sp.dtype)))) {
      for (uint32_t i = 0; i < vocab; ++i) logits[i] = e.load(sp.logits, r * sp.vocab + i);
    }
    processRow(sp, p, logits);
    // Log-softmax of the processed logits.
    const float m = *std::max_element(logits, logits + vocab);
    double sum = 0;
    for (uint32_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i] - m));
    const auto lse = static_cast<float>(m + std::log(sum));
    uint32_t id = 0;
    if (p.doSample) {
      double cumulative = 0;
      id = vocab - 1;
      for (uint32_t i = 0; i < vocab; ++i) {
        cumulative += std::exp(static_cast<double>(logits[i] - lse));
        if (p.uniform < cumulative) {
          id = i;
          break;
        }
      }
      while (id > 0 && logits[id] - lse == kNegInf) --id;  // rounding at the tail: stay in support
    } else {
      id = static_cast<uint32_t>(std::max_element(logits, logits + vocab) - logits);
    }
    for (uint32_t i = 0; i < vocab; ++i) logits[i] -= lse;  // log-probabilities from here
    sp.ids[r] = static_cast<int32_t>(id);
    sp.logprobs[r] = logits[id];
    if (p.topN > 0) {
      const uint32_t n = std::min(static_cast<uint32_t>(p.topN), vocab);
      std::vector<uint32_t> order(vocab);
      std::iota(order.begin(), order.end(), 0u);
      std::partial_sort(order.begin(), order.begin() + n, order.end(), [&](uint32_t a, uint32_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
      });
      for (uint32_t i = 0; i < n; ++i) {
        sp.topIds[r * sp.maxTopN + i] = static_cast<int32_t>(order[i]);
        sp.topLogprobs[r * sp.maxTopN + i] = logits[order[i]];
      }
    }
  }
  return okStatus();
}

}  // namespace textgen::kernels
