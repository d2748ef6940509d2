#include "textgen/kernels/fast_div.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace textgen::kernels {
namespace {

// The divisors a quantized GEMV meets (group sizes, whole rows of every Llama shape, odd ones) and
// the edges of the range, each against every dividend near its multiples and a dense low range.
TEST(FastDivisorTest, QuotientsAreExactBelowTwoToThe31) {
  const std::vector<uint32_t> divisors = {1,
                                          2,
                                          3,
                                          7,
                                          16,
                                          32,
                                          64,
                                          100,
                                          128,
                                          255,
                                          256,
                                          1000,
                                          4096,
                                          8192,
                                          11008,
                                          13824,
                                          28672,
                                          65537,
                                          1u << 20,
                                          (1u << 30) + 3,
                                          (1u << 31) - 1};
  for (uint32_t d : divisors) {
    const FastDivisor f = makeFastDivisor(d);
    for (uint32_t n = 0; n < 200000; ++n) ASSERT_EQ(fastDivide(n, f), n / d) << n << " / " << d;
    for (uint64_t k = 1; k * d < (uint64_t{1} << 31); k = k * 3 + 1) {
      for (int64_t e = -2; e <= 2; ++e) {
        const int64_t n = static_cast<int64_t>(k * d) + e;
        if (n < 0 || n >= (int64_t{1} << 31)) continue;
        const auto u = static_cast<uint32_t>(n);
        ASSERT_EQ(fastDivide(u, f), u / d) << u << " / " << d;
      }
    }
    const uint32_t top = (1u << 31) - 1;
    ASSERT_EQ(fastDivide(top, f), top / d) << d;
  }
}

}  // namespace
}  // namespace textgen::kernels
