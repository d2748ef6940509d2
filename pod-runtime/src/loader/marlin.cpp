#include "loader/marlin.h"

#include <array>
#include <cstring>

#include "loader/parallel_for.h"

namespace textgen::runtime {
namespace {

using Perm = std::array<int32_t, kMarlinPermLength>;

// Position x of a 1024-code run of B's tile row holds code perm[x] of the unpermuted run (tile
// t = perm[x] / 256, at row (perm[x] % 256) / 16 and column perm[x] % 16 of the tile). Thread
// i of a warp (0..31) takes, in each of the run's 4 tiles, the elements of tile column i / 4 and
// i / 4 + 8 at tile rows 2(i % 4), 2(i % 4) + 1, 2(i % 4) + 8, 2(i % 4) + 9 (an mma.sync B
// fragment); within each group of 8 the even-indexed come first, then the odd ones.
Perm marlinPerm() {
  Perm perm{};
  int n = 0;
  for (int i = 0; i < 32; ++i) {
    int fragment[8];
    int f = 0;
    for (int half = 0; half < 2; ++half) {
      const int rows[4] = {2 * (i % 4), 2 * (i % 4) + 1, 2 * (i % 4) + 8, 2 * (i % 4) + 9};
      for (int row : rows) fragment[f++] = 16 * row + i / 4 + 8 * half;
    }
    for (int tile = 0; tile < 4; ++tile) {
      constexpr int kEvenThenOdd[8] = {0, 2, 4, 6, 1, 3, 5, 7};
      for (int m = 0; m < 8; ++m) perm[n + m] = fragment[kEvenThenOdd[m]] + 256 * tile;
      n += 8;
    }
  }
  return perm;
}

// Scales: position x of a run holds scale sperm[x] of the run. Several groups: runs of 64, an
// 8x8 transpose (x = 8a + b holds a + 8b); one group: runs of 32, x = 8a + b holds
// 2a + {0, 1, 8, 9, 16, 17, 24, 25}[b].
std::vector<int32_t> scalePerm(bool grouped) {
  std::vector<int32_t> p;
  if (grouped) {
    for (int a = 0; a < 8; ++a)
      for (int b = 0; b < 8; ++b) p.push_back(a + 8 * b);
  } else {
    constexpr int kPairs[8] = {0, 1, 8, 9, 16, 17, 24, 25};
    for (int a = 0; a < 4; ++a)
      for (int b : kPairs) p.push_back(2 * a + b);
  }
  return p;
}

}  // namespace

QuantizedTensor unpackMarlin(std::string_view packedB, const std::vector<float>& s, int64_t out,
                             int64_t in, int64_t groups) {
  static const Perm kPerm = marlinPerm();
  QuantizedTensor q;
  q.code = kernels::QuantCode::kUint4;
  q.out = out;
  q.in = in;
  q.groups = groups;
  q.groupSize = in / groups;
  q.codes.resize(static_cast<size_t>(out * in));
  const int64_t rowCodes = out * kMarlinTile;  // codes per tile row of B
  parallelFor(in / kMarlinTile, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t x = 0; x < rowCodes; x += 8) {
        uint32_t word;  // little-endian, as safetensors stores it
        std::memcpy(&word, packedB.data() + 4 * ((r * rowCodes + x) / 8), 4);
        for (int64_t m = 0; m < 8; ++m) {
          const int64_t pos = x + m;
          const int64_t e = pos - pos % kMarlinPermLength + kPerm[pos % kMarlinPermLength];
          const int64_t k = r * kMarlinTile + (e % 256) / kMarlinTile;  // input
          const int64_t n = (e / 256) * kMarlinTile + e % kMarlinTile;  // output
          q.codes[n * in + k] = static_cast<uint8_t>((word >> (4 * m)) & 0xf);
        }
      }
    }
  });
  const std::vector<int32_t> sperm = scalePerm(groups > 1);
  const auto run = static_cast<int64_t>(sperm.size());
  q.scales.resize(static_cast<size_t>(out * groups));
  for (int64_t x = 0; x < groups * out; ++x) {
    const int64_t flat = x - x % run + sperm[x % run];  // [groups, out] index of stored scale x
    q.scales[(flat % out) * groups + flat / out] = s[x];
  }
  q.zeros.assign(static_cast<size_t>(out * groups), 8);
  return q;
}

}  // namespace textgen::runtime
