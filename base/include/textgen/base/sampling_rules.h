// The ranges every sampling value must lie in, one definition for the router's validation and the
// shard's: a value the router lets through is one the shard takes, so a request that passed
// validation never fails its batch at the shard. Bounds keep every processed logit finite in
// float32 (a temperature or penalty of 1e-38 turns logits into infinities and the draw into NaN).
#pragma once

#include <cstdint>

#include "textgen/base/status.h"

namespace textgen {

// Values as the sampler uses them (defaults applied: 1 means "off" for the multiplicative ones).
struct SamplingValues {
  float temperature = 1.0f;
  float repetitionPenalty = 1.0f;
  float frequencyPenalty = 0.0f;
  float topP = 1.0f;
  float typicalP = 1.0f;
  int64_t topK = 0;  // 0: off
};

inline constexpr float kMinTemperature = 1e-4f;
inline constexpr float kMaxTemperature = 1e4f;
inline constexpr float kMinRepetitionPenalty = 1e-4f;
inline constexpr float kMaxRepetitionPenalty = 1e4f;
inline constexpr float kMaxFrequencyPenalty = 2.0f;  // and -2 at the least, as OpenAI and TGI
// The most alternatives a generated token may list (top_n_tokens): the router's
// --max-top-n-tokens (TGI's default 5) may not exceed it, and the shard refuses more. The
// sampler's work and memory grow with it for every row of a batch.
inline constexpr uint32_t kMaxTopNTokens = 1024;

// INVALID_ARGUMENT naming the first value out of range (backquoted field names, as TGI's
// messages); non-finite values are out of every range.
Status checkSamplingValues(const SamplingValues& v);

}  // namespace textgen
