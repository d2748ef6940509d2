#include "textgen/base/sampling_rules.h"

#include <cmath>
#include <string>

namespace textgen {
namespace {

std::string number(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(v));
  return buf;
}

// v in [lo, hi], finite.
bool within(float v, float lo, float hi) {
  return std::isfinite(v) && v >= lo && v <= hi;
}

}  // namespace

Status checkSamplingValues(const SamplingValues& v) {
  if (!within(v.temperature, kMinTemperature, kMaxTemperature)) {
    return invalidArgumentError("`temperature` must be finite, >= " + number(kMinTemperature) +
                                " and <= " + number(kMaxTemperature) +
                                ". Given: " + number(v.temperature));
  }
  if (!within(v.repetitionPenalty, kMinRepetitionPenalty, kMaxRepetitionPenalty)) {
    return invalidArgumentError(
        "`repetition_penalty` must be finite, >= " + number(kMinRepetitionPenalty) +
        " and <= " + number(kMaxRepetitionPenalty) + ". Given: " + number(v.repetitionPenalty));
  }
  if (!within(v.frequencyPenalty, -kMaxFrequencyPenalty, kMaxFrequencyPenalty))
    return invalidArgumentError("`frequency_penalty` must be >= -2.0 and <= 2.0");
  if (!(std::isfinite(v.topP) && v.topP > 0.0f && v.topP <= 1.0f))
    return invalidArgumentError("`top_p` must be > 0.0 and <= 1.0");
  if (!(std::isfinite(v.typicalP) && v.typicalP > 0.0f && v.typicalP <= 1.0f))
    return invalidArgumentError("`typical_p` must be > 0.0 and <= 1.0");
  if (v.topK < 0) return invalidArgumentError("`top_k` must be >= 0");
  return okStatus();
}

}  // namespace textgen
