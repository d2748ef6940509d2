#include "textgen/base/watermark.h"

#include <cmath>
#include <numeric>
#include <random>
#include <string>

namespace textgen {

Status checkWatermarkParams(double gamma, double delta) {
  if (!(gamma > 0.0 && gamma < 1.0))
    return invalidArgumentError("watermark gamma must be in (0, 1), got " + std::to_string(gamma));
  if (!(delta >= 0.0 && delta <= 100.0))
    return invalidArgumentError("watermark delta must be in [0, 100], got " +
                                std::to_string(delta));
  return okStatus();
}

std::vector<uint32_t> torchCpuRandperm(uint64_t seed, uint32_t n) {
  // torch's CPU generator is an mt19937 initialised from the seed's low 32 bits; randperm swaps
  // position i with i + (draw % (n - i)).
  std::mt19937 engine(static_cast<uint32_t>(seed));
  std::vector<uint32_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0u);
  for (uint32_t i = 0; i + 1 < n; ++i) {
    const uint32_t z = static_cast<uint32_t>(engine()) % (n - i);
    std::swap(perm[i], perm[i + z]);
  }
  return perm;
}

uint32_t greenListSize(uint32_t vocab, double gamma) {
  return static_cast<uint32_t>(static_cast<double>(vocab) * gamma);
}

std::vector<uint32_t> greenListMask(uint32_t previous, uint32_t vocab, double gamma) {
  const std::vector<uint32_t> perm = torchCpuRandperm(kWatermarkHashKey * previous, vocab);
  std::vector<uint32_t> mask((vocab + 31) / 32, 0u);
  const uint32_t size = greenListSize(vocab, gamma);
  for (uint32_t i = 0; i < size; ++i) mask[perm[i] / 32] |= 1u << (perm[i] % 32);
  return mask;
}

std::span<const uint32_t> GreenListCache::mask(uint32_t previous) {
  auto it = entries_.find(previous);
  if (it != entries_.end()) {
    order_.splice(order_.begin(), order_, it->second.pos);
    return it->second.mask;
  }
  if (entries_.size() >= capacity_ && !order_.empty()) {
    entries_.erase(order_.back());
    order_.pop_back();
  }
  order_.push_front(previous);
  Entry& e = entries_[previous];
  e.mask = greenListMask(previous, vocab_, gamma_);
  e.pos = order_.begin();
  return e.mask;
}

WatermarkScore scoreWatermark(std::span<const uint32_t> tokens, uint32_t vocab, double gamma) {
  WatermarkScore s;
  GreenListCache cache(vocab, gamma);
  for (size_t i = 1; i < tokens.size(); ++i) {
    ++s.scored;
    const uint32_t id = tokens[i];
    if (id >= vocab) continue;
    const std::span<const uint32_t> mask = cache.mask(tokens[i - 1]);
    if (mask[id / 32] >> (id % 32) & 1u) ++s.green;
  }
  if (s.scored > 0) {
    const double t = static_cast<double>(s.scored);
    s.z = (static_cast<double>(s.green) - gamma * t) / std::sqrt(t * gamma * (1.0 - gamma));
    s.pValue = 0.5 * std::erfc(s.z / std::sqrt(2.0));
  }
  return s;
}

}  // namespace textgen
