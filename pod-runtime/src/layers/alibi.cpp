#include "layers/alibi.h"

#include <cmath>
#include <string>

#include "textgen/base/check.h"

namespace textgen::runtime {
namespace {

// 2^floor(log2(n)) for n > 0.
int64_t powerOfTwoAtMost(int64_t n) {
  int64_t p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

}  // namespace

std::vector<float> bloomAlibiSlopes(int64_t numHeads) {
  TG_CHECK(numHeads > 0);
  const int64_t closest = powerOfTwoAtMost(numHeads);
  // torch: base = tensor(2 ** (-(2 ** -(log2(closest) - 3))), float32); slopes = pow(base, 1..P).
  const auto powers = [](double base, int64_t first, int64_t count, int64_t step,
                         std::vector<float>& out) {
    const auto b = static_cast<double>(static_cast<float>(base));
    for (int64_t i = 0; i < count; ++i)
      out.push_back(static_cast<float>(std::pow(b, static_cast<double>(first + i * step))));
  };
  std::vector<float> slopes;
  powers(std::exp2(-8.0 / static_cast<double>(closest)), 1, closest, 1, slopes);
  if (closest != numHeads) {
    // The odd powers 1, 3, 5, ... of 2^(-8 / 2P) for the remaining heads.
    powers(std::exp2(-4.0 / static_cast<double>(closest)), 1, numHeads - closest, 2, slopes);
  }
  return slopes;
}

std::vector<float> mptAlibiSlopes(int64_t numHeads, double alibiBiasMax) {
  TG_CHECK(numHeads > 0);
  const int64_t closest = powerOfTwoAtMost(numHeads);
  const int64_t q = closest == numHeads ? numHeads : 2 * closest;  // 2^ceil(log2(numHeads))
  // torch: base = arange(1, Q + 1).float() * (alibiBiasMax / Q); slopes = 1.0 / pow(2, base),
  // each step in float32.
  const auto step = static_cast<float>(alibiBiasMax / static_cast<double>(q));
  std::vector<float> all;
  for (int64_t k = 1; k <= q; ++k) {
    const float m = static_cast<float>(k) * step;
    all.push_back(1.0f / static_cast<float>(std::exp2(static_cast<double>(m))));
  }
  if (q == numHeads) return all;
  // concat(slopes[1::2], slopes[::2])[:numHeads]: k = 2, 4, ..., Q, then k = 1, 3, ...
  std::vector<float> slopes;
  for (int64_t i = 1; i < q; i += 2) slopes.push_back(all[i]);
  for (int64_t i = 0; i < q && static_cast<int64_t>(slopes.size()) < numHeads; i += 2)
    slopes.push_back(all[i]);
  slopes.resize(numHeads);
  return slopes;
}

StatusOr<std::vector<float>> alibiSlopesForRank(const std::vector<float>& slopes, int rank,
                                                int world) {
  const auto h = static_cast<int64_t>(slopes.size());
  if (world <= 0 || rank < 0 || rank >= world)
    return invalidArgumentError("alibi: rank " + std::to_string(rank) + " of " +
                                std::to_string(world));
  if (h == 0 || h % world != 0)
    return invalidArgumentError("alibi: " + std::to_string(h) + " heads do not divide over " +
                                std::to_string(world) + " ranks");
  const int64_t per = h / world;
  return std::vector<float>(slopes.begin() + rank * per, slopes.begin() + (rank + 1) * per);
}

}  // namespace textgen::runtime
