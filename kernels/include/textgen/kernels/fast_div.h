// Division by a divisor fixed for a kernel launch, as a multiply-high, an add and a shift (the
// round-up method of Granlund and Montgomery): a 32-bit integer division by a runtime divisor is
// about twenty instructions on a GPU, which a decode GEMV pays on every step of every lane.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define TG_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TG_HOST_DEVICE inline
#endif

namespace textgen::kernels {

struct FastDivisor {
  uint32_t mul = 1;
  uint32_t shift = 0;
};

// For 1 <= d < 2^31. The quotient is exact for every 0 <= n < 2^31.
inline FastDivisor makeFastDivisor(uint32_t d) {
  uint32_t s = 0;
  while ((uint64_t{1} << s) < d) ++s;
  const uint64_t m = ((uint64_t{1} << 32) * ((uint64_t{1} << s) - d)) / d + 1;
  return {static_cast<uint32_t>(m), s};
}

TG_HOST_DEVICE uint32_t fastDivide(uint32_t n, FastDivisor d) {
#if defined(__CUDA_ARCH__)
  const uint32_t hi = __umulhi(n, d.mul);
#else
  const auto hi = static_cast<uint32_t>((uint64_t{n} * d.mul) >> 32);
#endif
  return (hi + n) >> d.shift;
}

}  // namespace textgen::kernels

#undef TG_HOST_DEVICE
