#include "textgen/runtime/sampler.h"

#include <algorithm>
#include <cstring>

#include "layers/workspace.h"

namespace textgen::runtime {
namespace {

float asFloat(int32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

StatusOr<std::vector<GreedyToken>> Sampler::greedy(const LogitsView& logits) {
  const int64_t n = logits.rows;
  // [ids (int32) | logprobs (float)] in one buffer: one download.
  TG_RETURN_IF_ERROR(
      ensureBuffer(backend_, greedyOut_, static_cast<size_t>(std::max<int64_t>(2 * n, 1)) * 4));
  auto* ids = greedyOut_->as<int32_t>();
  TG_RETURN_IF_ERROR(backend_.argmax({.logits = logits.data(),
                                      .ids = ids,
                                      .logprobs = reinterpret_cast<float*>(ids + n),
                                      .rows = n,
                                      .vocab = logits.vocab,
                                      .dtype = logits.dtype}));
  std::vector<int32_t> raw(2 * n);
  TG_RETURN_IF_ERROR(backend_.download(raw.data(), *greedyOut_, raw.size() * 4));
  std::vector<GreedyToken> out(n);
  for (int64_t i = 0; i < n; ++i) {
    out[i].id = static_cast<uint32_t>(raw[i]);
    out[i].logprob = asFloat(raw[n + i]);
  }
  return out;
}

StatusOr<std::vector<SampledToken>> Sampler::sample(const LogitsView& logits,
                                                    const SampleBatch& sb) {
  const int64_t n = logits.rows, vocab = logits.vocab, topN = sb.maxTopN;
  if (static_cast<int64_t>(sb.rows.size()) != n)
    return invalidArgumentError("one sampling row per logit row is required");
  // Inputs in one upload: [rows | history tokens | counts | bias tokens | bias values | masks].
  auto bytesOf = [](const auto& v) { return v.size() * sizeof(v[0]); };
  const size_t oRows = 0, oHist = oRows + bytesOf(sb.rows),
               oCounts = oHist + bytesOf(sb.historyTokens),
               oBiasTok = oCounts + bytesOf(sb.historyCounts),
               oBiasVal = oBiasTok + bytesOf(sb.biasTokens),
               oMasks = oBiasVal + bytesOf(sb.biasValues), total = oMasks + bytesOf(sb.masks);
  std::vector<unsigned char> host(std::max<size_t>(total, 16));
  auto put = [&](size_t at, const auto& v) {
    if (!v.empty()) std::memcpy(host.data() + at, v.data(), bytesOf(v));
  };
  put(oRows, sb.rows);
  put(oHist, sb.historyTokens);
  put(oCounts, sb.historyCounts);
  put(oBiasTok, sb.biasTokens);
  put(oBiasVal, sb.biasValues);
  put(oMasks, sb.masks);
  TG_RETURN_IF_ERROR(ensureBuffer(backend_, sampleIn_, host.size()));
  TG_RETURN_IF_ERROR(backend_.upload(*sampleIn_, host.data(), host.size()));
  TG_RETURN_IF_ERROR(ensureBuffer(backend_, sampleWork_, static_cast<size_t>(n * vocab) * 4));
  TG_RETURN_IF_ERROR(ensureBuffer(backend_, sampleProbs_, static_cast<size_t>(n * vocab) * 8));
  // Outputs in one download: [ids | logprobs | top ids | top logprobs].
  const size_t outWords = static_cast<size_t>(2 * n + 2 * n * topN);
  TG_RETURN_IF_ERROR(ensureBuffer(backend_, sampleOut_, std::max<size_t>(outWords, 1) * 4));
  auto* base = static_cast<unsigned char*>(sampleIn_->data());
  auto* out = sampleOut_->as<int32_t>();
  TG_RETURN_IF_ERROR(
      backend_.sample({.logits = logits.data(),
                       .rowParams = reinterpret_cast<const kernels::SampleRow*>(base + oRows),
                       .historyTokens = reinterpret_cast<const int32_t*>(base + oHist),
                       .historyCounts = reinterpret_cast<const int32_t*>(base + oCounts),
                       .biasTokens = reinterpret_cast<const int32_t*>(base + oBiasTok),
                       .biasValues = reinterpret_cast<const float*>(base + oBiasVal),
                       .masks = reinterpret_cast<const uint32_t*>(base + oMasks),
                       .work = sampleWork_->as<float>(),
                       .probs = sampleProbs_->as<double>(),
                       .ids = out,
                       .logprobs = reinterpret_cast<float*>(out + n),
                       .topIds = out + 2 * n,
                       .topLogprobs = reinterpret_cast<float*>(out + 2 * n + n * topN),
                       .rows = n,
                       .vocab = vocab,
                       .maxTopN = topN,
                       .dtype = logits.dtype}));
  std::vector<int32_t> raw(outWords);
  TG_RETURN_IF_ERROR(backend_.download(raw.data(), *sampleOut_, outWords * 4));
  std::vector<SampledToken> result(n);
  for (int64_t i = 0; i < n; ++i) {
    result[i].id = static_cast<uint32_t>(raw[i]);
    result[i].logprob = asFloat(raw[n + i]);
    for (int32_t j = 0; j < sb.rows[i].topN; ++j) {
      result[i].top.emplace_back(static_cast<uint32_t>(raw[2 * n + i * topN + j]),
                                 asFloat(raw[2 * n + n * topN + i * topN + j]));
    }
  }
  return result;
}

}  // namespace textgen::runtime
