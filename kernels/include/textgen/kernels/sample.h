// Logit processing and token choice, TGI's order (penalties, bias, then when sampling temperature,
// top-k, top-p, typical-p), for a batch of rows each with its own parameters. The random draw is an
// input (`uniform`, from each request's own seeded generator on the host), so the device and the
// host choose the same token from the same draw. The CPU reference is the host sampler itself
// (runtime::RequestSampler calls it); the CUDA kernel is tested against it.
//
// Per row: repetition penalty once per distinct earlier token (divide positive logits, multiply
// negative ones), frequency penalty times its count, logit bias; if sampling, divide by the
// temperature, keep the top_k largest (ties at the k-th kept), keep the smallest best-first prefix
// (ties by lower id) whose probability reaches top_p, keep the tokens whose surprisal is closest to
// the entropy (stable order) until typical_p; then log-softmax; the token is the first id whose
// cumulative probability (in id order, float64) exceeds `uniform` — or the arg-max when not
// sampling (lowest id among maxima); top-n: the n best log-probabilities, ties by lower id.
#pragma once

#include <cstdint>

#include "textgen/base/status.h"
#include "textgen/kernels/dtype.h"
#include "textgen/kernels/stream.h"

namespace textgen::kernels {

struct SampleRow {
  float temperature = 1.0f;        // 0 or 1: off
  int32_t topK = 0;                // 0: off
  float topP = 1.0f;               // 0 or 1: off
  float typicalP = 1.0f;           // 0 or 1: off
  int32_t doSample = 0;            // 0: arg-max
  float repetitionPenalty = 1.0f;  // 0 or 1: off
  float frequencyPenalty = 0.0f;
  float presencePenalty = 0.0f;              // once per distinct history token
  int32_t topN = 0;                          // <= SampleParams::maxTopN
  double uniform = 0.0;                      // in [0, 1): the draw when sampling
  int32_t historyBegin = 0, historyEnd = 0;  // this row's entries of historyTokens/Counts
  int32_t biasBegin = 0, biasEnd = 0;        // this row's entries of biasTokens/Values
  // Constrained decoding: the word of SampleParams::masks where this row's allowed-token bitmask
  // ((vocab + 31) / 32 words; bit id % 32 of word id / 32) starts; -1: every token allowed. Tokens
  // outside the mask get -inf after the penalties and the bias, before the warpers.
  int64_t maskBegin = -1;
  // Watermark (Kirchenbauer et al.): the word of SampleParams::masks where this row's green list
  // bitmask starts (same layout); -1: none. greenDelta is added to the green tokens' raw logits
  // before anything else (TGI's order: the watermark, then the penalties).
  int64_t greenBegin = -1;
  float greenDelta = 0.0f;
};

struct SampleParams {
  const void* logits = nullptr;            // [rows, vocab] in dtype
  const SampleRow* rowParams = nullptr;    // [rows]
  const int32_t* historyTokens = nullptr;  // distinct earlier tokens of each row
  const int32_t* historyCounts = nullptr;  // how often each occurred
  const int32_t* biasTokens = nullptr;
  const float* biasValues = nullptr;
  const uint32_t* masks = nullptr;  // token bitmasks (SampleRow::maskBegin, greenBegin)
  float* work = nullptr;            // [rows, vocab] float32 scratch; may equal logits for float32
  double* probs = nullptr;       // [rows, vocab] float64 scratch (device top-p/typical-p searches)
  int32_t* ids = nullptr;        // [rows]
  float* logprobs = nullptr;     // [rows]: of the chosen token, after processing
  int32_t* topIds = nullptr;     // [rows, maxTopN], best first
  float* topLogprobs = nullptr;  // [rows, maxTopN]
  int64_t rows = 0, vocab = 0, maxTopN = 0;
  DType dtype = DType::kF32;
};

Status validateSample(const SampleParams& p);
// Host memory.
Status sampleReference(const SampleParams& p);
Status invokeSample(const SampleParams& p, Stream stream);

}  // namespace textgen::kernels
