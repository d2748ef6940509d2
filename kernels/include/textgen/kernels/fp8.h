// Host conversions between float and the two 8-bit float formats (OCP FP8, as PyTorch's
// float8_e4m3fn and float8_e5m2 and CUDA's __nv_fp8_e4m3 / __nv_fp8_e5m2 define them), bit-exact
// with CUDA's saturating round-to-nearest-even conversion (__nv_cvt_float_to_fp8 with
// __NV_SATFINITE): values beyond the largest finite one become it, NaN stays NaN.
//   e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa; no infinities; 0x7f / 0xff are NaN; max 448.
//   e5m2:   1 sign, 5 exponent (bias 15), 2 mantissa; IEEE-like (infinities, NaNs); max 57344.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace textgen::kernels {

constexpr float kFp8E4M3Max = 448.0f;
constexpr float kFp8E5M2Max = 57344.0f;

namespace fp8_detail {

// Decodes sign | exponent | mantissa with `mbits` mantissa bits and exponent bias `bias`.
inline float decode(uint8_t v, int mbits, int bias) {
  const int ebits = 7 - mbits;
  const int e = (v >> mbits) & ((1 << ebits) - 1);
  const int m = v & ((1 << mbits) - 1);
  float mag = e == 0 ? std::ldexp(static_cast<float>(m), 1 - bias - mbits)
                     : std::ldexp(static_cast<float>(m + (1 << mbits)), e - bias - mbits);
  return (v & 0x80) ? -mag : mag;
}

// Round-to-nearest-even of |f| onto the format's grid, saturated to `maxCode` (the largest
// finite magnitude's bits). NaN handled by the caller.
inline uint8_t encodeMagnitude(float a, int mbits, int bias, uint8_t maxCode) {
  const float maxVal = decode(maxCode, mbits, bias);
  if (a >= maxVal) return maxCode;
  // The spacing of representable values around a: 2^(max(exp, 1 - bias) - mbits).
  int exp;
  std::frexp(a, &exp);  // a = f * 2^exp, f in [0.5, 1): the unbiased exponent is exp - 1
  int e = exp - 1;
  if (e < 1 - bias) e = 1 - bias;  // subnormal range
  const float ulp = std::ldexp(1.0f, e - mbits);
  float q = std::nearbyint(a / ulp);  // ties to even under the default rounding mode
  // q * ulp on the grid; q may reach 2^(mbits+1) (rounding up into the next binade): fine.
  const float v = q * ulp;
  if (v >= maxVal) return maxCode;
  // Encode v exactly.
  if (v == 0.0f) return 0;
  int ve;
  std::frexp(v, &ve);
  int be = ve - 1 + bias;  // biased exponent
  if (be <= 0) {           // subnormal: v = m * 2^(1 - bias - mbits)
    const int m = static_cast<int>(std::ldexp(v, bias - 1 + mbits));
    return static_cast<uint8_t>(m);
  }
  const int m = static_cast<int>(std::ldexp(v, -(ve - 1) + mbits)) - (1 << mbits);
  return static_cast<uint8_t>((be << mbits) | m);
}

}  // namespace fp8_detail

inline float fp8E4M3ToFloat(uint8_t v) {
  if ((v & 0x7f) == 0x7f) return NAN;
  return fp8_detail::decode(v, 3, 7);
}

inline uint8_t floatToFp8E4M3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  return sign | fp8_detail::encodeMagnitude(std::fabs(f), 3, 7, 0x7e);
}

inline float fp8E5M2ToFloat(uint8_t v) {
  if ((v & 0x7c) == 0x7c) return (v & 0x03) ? NAN : ((v & 0x80) ? -INFINITY : INFINITY);
  return fp8_detail::decode(v, 2, 15);
}

inline uint8_t floatToFp8E5M2(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  return sign | fp8_detail::encodeMagnitude(std::fabs(f), 2, 15, 0x7b);
}

}  // namespace textgen::kernels
