#include "textgen/runtime/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace textgen::runtime {
namespace {

// base ** (2i / dim) in float32, as torch evaluates `base ** (arange(0, dim, 2).float() / dim)`.
float positionFrequency(double base, int64_t i, int64_t dim) {
  const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
  return std::pow(static_cast<float>(base), exponent);
}

// Llama 3.1: wavelengths shorter than original/high kept, longer than original/low divided by the
// factor, and a smooth blend between.
void applyLlama3(const RopeConfig& r, std::vector<float>& f) {
  const auto twoPi = static_cast<float>(2.0 * std::numbers::pi);
  const auto lowWavelen =
      static_cast<float>(static_cast<double>(r.originalMaxPositionEmbeddings) / r.lowFreqFactor);
  const auto highWavelen =
      static_cast<float>(static_cast<double>(r.originalMaxPositionEmbeddings) / r.highFreqFactor);
  const auto factor = static_cast<float>(r.factor);
  for (float& inv : f) {
    const float wavelen = twoPi / inv;
    float scaled = wavelen > lowWavelen ? inv / factor : inv;
    if (!(wavelen < highWavelen) && !(wavelen > lowWavelen)) {
      const float smooth = (static_cast<float>(r.originalMaxPositionEmbeddings) / wavelen -
                            static_cast<float>(r.lowFreqFactor)) /
                           static_cast<float>(r.highFreqFactor - r.lowFreqFactor);
      scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
    }
    inv = scaled;
  }
}

// YaRN: interpolated (divided by the factor) below the correction range, extrapolated (kept) above
// it, a linear ramp between.
std::vector<float> yarnFrequencies(const RopeConfig& r, int64_t dim) {
  const double base = r.theta;
  auto correctionDim = [&](double rotations) {
    return (static_cast<double>(dim) *
            std::log(static_cast<double>(r.originalMaxPositionEmbeddings) /
                     (rotations * 2.0 * std::numbers::pi))) /
           (2.0 * std::log(base));
  };
  double low = correctionDim(r.betaFast), high = correctionDim(r.betaSlow);
  if (r.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // no zero-width ramp
  const auto factor = static_cast<float>(r.factor);
  std::vector<float> f(dim / 2);
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float pos = positionFrequency(base, i, dim);
    const float extrapolation = 1.0f / pos, interpolation = 1.0f / (factor * pos);
    const float ramp = std::clamp(
        (static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low), 0.0f,
        1.0f);
    const float keep = 1.0f - ramp;
    f[i] = interpolation * (1.0f - keep) + extrapolation * keep;
  }
  return f;
}

}  // namespace

std::vector<float> ropeInverseFrequencies(const ModelConfig& c, int64_t seqLen) {
  const RopeConfig& r = c.rope;
  const int64_t dim = c.rotaryDim();
  if (r.type == RopeType::kYarn) return yarnFrequencies(r, dim);
  double base = r.theta;
  if (r.type == RopeType::kDynamic && seqLen > c.maxPositionEmbeddings) {
    const double ratio =
        r.factor * static_cast<double>(seqLen) / static_cast<double>(c.maxPositionEmbeddings);
    base = r.theta * std::pow(ratio - (r.factor - 1.0),
                              static_cast<double>(dim) / static_cast<double>(dim - 2));
  }
  std::vector<float> f(dim / 2);
  for (int64_t i = 0; i < dim / 2; ++i) {
    f[i] = 1.0f / positionFrequency(base, i, dim);
    if (r.type == RopeType::kLinear) f[i] /= static_cast<float>(r.factor);
  }
  if (r.type == RopeType::kLlama3) applyLlama3(r, f);
  return f;
}

float ropeAttentionScaling(const ModelConfig& c) {
  return c.rope.type == RopeType::kYarn ? static_cast<float>(c.rope.attentionFactor) : 1.0f;
}

}  // namespace textgen::runtime
