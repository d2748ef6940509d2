#include "loader/load_quantizer.h"

#include <array>
#include <cmath>
#include <cstring>
#include <mutex>

#include "textgen/kernels/fp8.h"

namespace textgen::runtime {

using kernels::ActQuant;
using kernels::QuantCode;

namespace {

// |x| folded into a running absmax as std::fmax does (a NaN never wins), without its call.
inline float absMax(float amax, float x) {
  const float a = std::fabs(x);
  return a > amax ? a : amax;
}

// Round to nearest, ties to even, of |y| < 2^22 (std::nearbyint under the default rounding mode,
// without its call): adding 1.5 * 2^23 leaves no fraction bits.
inline float roundEven(float y) {
  constexpr float kMagic = 12582912.0f;
  return (y + kMagic) - kMagic;
}

// bitsandbytes' nf4 decision for x = w / absmax: the number of table midpoints below x (as
// quantized_tensor.cpp's lower_bound), found in four branch-free steps.
const std::array<float, 16> kNf4Mid = [] {
  std::array<float, 16> m{};
  for (int c = 1; c < 16; ++c)
    m[c - 1] = 0.5f * (kernels::kNf4Table[c - 1] + kernels::kNf4Table[c]);
  m[15] = INFINITY;  // never read: the search's largest index is 14
  return m;
}();

inline uint8_t nf4Code(float x) {
  int base = 0;
  base += kNf4Mid[base + 7] < x ? 8 : 0;
  base += kNf4Mid[base + 3] < x ? 4 : 0;
  base += kNf4Mid[base + 1] < x ? 2 : 0;
  base += kNf4Mid[base] < x ? 1 : 0;
  return static_cast<uint8_t>(base);
}

// bitsandbytes' fp4 decision: the magnitude's class (how many of the kernel's thresholds it
// exceeds) mapped to its code, the sign bit 8 for x < 0.
inline uint8_t fp4Code(float x) {
  static constexpr uint8_t kCodeOfClass[8] = {0b0000, 0b0001, 0b0110, 0b0111,
                                              0b0100, 0b0101, 0b0010, 0b0011};
  const float a = std::fabs(x);
  const int cls = (a > 0.00260417f) + (a > 0.0859375f) + (a > 0.20833333f) + (a > 0.29166667f) +
                  (a > 0.4166667f) + (a > 0.583333f) + (a > 0.8333333f);
  return static_cast<uint8_t>((x < 0 ? 8 : 0) | kCodeOfClass[cls]);
}

template <QuantCode kCode>
void quantizeBnb4Blocks(const float* w, int64_t block, int64_t b0, int64_t b1, float* scales,
                        uint8_t* packed) {
  for (int64_t b = b0; b < b1; ++b) {
    const float* x = w + b * block;
    float amax = 0.0f;
    for (int64_t k = 0; k < block; ++k) amax = absMax(amax, x[k]);
    scales[b] = amax;
    const float inv = 1.0f / amax;  // inf for an all-zero block: 0 * inf is NaN, coded 0
    uint8_t* dst = packed + b * block / 2;
    for (int64_t k = 0; k < block; k += 2) {
      float v0 = x[k] * inv, v1 = x[k + 1] * inv;
      if (std::isnan(v0)) v0 = 0.0f;
      if (std::isnan(v1)) v1 = 0.0f;
      const uint8_t c0 = kCode == QuantCode::kNf4 ? nf4Code(v0) : fp4Code(v0);
      const uint8_t c1 = kCode == QuantCode::kNf4 ? nf4Code(v1) : fp4Code(v1);
      dst[k / 2] = static_cast<uint8_t>(c0 | (c1 << 4));  // even input in the low nibble
    }
  }
}

}  // namespace

uint8_t floatToFp8E4M3Fast(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return 0x7f;          // NaN
  if (u >= 0x43e00000u) return sign | 0x7e;  // |f| >= 448 (infinity too): the largest finite
  if (u < 0x3c800000u) {
    // |f| < 2^-6: subnormal codes, steps of 2^-9 (the code 8, 2^-6, is the first normal one).
    float a;
    std::memcpy(&a, &u, sizeof a);
    return sign | static_cast<uint8_t>(roundEven(a * 512.0f));
  }
  // Normal: the mantissa rounded from 23 bits to 3, to nearest even (a carry steps the exponent),
  // the exponent rebiased from 127 to 7. Below 448 the result is at most 448's code, 0x7e.
  const uint32_t r = (u + 0x7ffffu + ((u >> 20) & 1u)) >> 20;
  return sign | static_cast<uint8_t>(r - (120u << 3));
}

StatusOr<PackedQuantized> quantizeBnb4Packed(const float* w, int64_t out, int64_t in,
                                             QuantCode code) {
  const int64_t block = bnb4BlockSize(in);
  if (block == 0)
    return invalidArgumentError("bitsandbytes 4-bit: the layer's " + std::to_string(in) +
                                " inputs are odd: 4-bit codes pack in pairs");
  PackedQuantized p;
  p.code = code;
  p.out = out;
  p.in = in;
  p.groupSize = block;
  p.packed.resize(static_cast<size_t>(out * kernels::quantRowBytes(code, in)));
  p.scales.resize(static_cast<size_t>(out * (in / block)));
  // Blocks run along each row and rows follow each other: block b is inputs [b * block, ...) of
  // the flattened tensor and packed bytes [b * block / 2, ...).
  parallelFor(
      out * (in / block),
      [&](int64_t b0, int64_t b1) {
        if (code == QuantCode::kNf4)
          quantizeBnb4Blocks<QuantCode::kNf4>(w, block, b0, b1, p.scales.data(), p.packed.data());
        else
          quantizeBnb4Blocks<QuantCode::kFp4>(w, block, b0, b1, p.scales.data(), p.packed.data());
      },
      rowGrain(block));
  return p;
}

PackedQuantized quantizeInt8Packed(const float* w, int64_t out, int64_t in, ActQuant act) {
  PackedQuantized p;
  p.code = QuantCode::kUint8;
  p.act = act;
  p.out = out;
  p.in = in;
  p.groupSize = in;
  p.packed.resize(static_cast<size_t>(out * in));
  p.scales.resize(static_cast<size_t>(out));
  p.zeros.assign(static_cast<size_t>(out), 128);
  parallelFor(
      out,
      [&](int64_t o0, int64_t o1) {
        for (int64_t o = o0; o < o1; ++o) {
          const float* x = w + o * in;
          uint8_t* dst = p.packed.data() + o * in;
          float amax = 0.0f;
          for (int64_t i = 0; i < in; ++i) amax = absMax(amax, x[i]);
          p.scales[o] = amax / 127.0f;
          if (!(amax > 0.0f)) {
            std::memset(dst, 128, static_cast<size_t>(in));
            continue;
          }
          const float mul = 127.0f / amax;
          for (int64_t i = 0; i < in; ++i) {
            float v = roundEven(x[i] * mul);  // |x * mul| <= 127 (+ rounding) or NaN
            if (std::isnan(v)) v = 0.0f;      // a NaN or infinite weight: no code holds it
            v = v < -127.0f ? -127.0f : (v > 127.0f ? 127.0f : v);
            dst[i] = static_cast<uint8_t>(static_cast<int>(v) + 128);
          }
        }
      },
      rowGrain(in));
  return p;
}

PackedQuantized quantizeFp8Packed(const float* w, int64_t out, int64_t in) {
  const int64_t n = out * in;
  constexpr int64_t kGrain = int64_t{1} << 16;
  float amax = 0.0f;
  std::mutex m;
  parallelFor(
      n,
      [&](int64_t k0, int64_t k1) {
        float local = 0.0f;
        for (int64_t k = k0; k < k1; ++k) local = absMax(local, w[k]);
        const std::lock_guard<std::mutex> lock(m);
        amax = std::fmax(amax, local);
      },
      kGrain);
  const float mul = kernels::kFp8E4M3Max / std::fmax(amax, 1e-12f);
  PackedQuantized p;
  p.code = QuantCode::kFp8E4M3;
  p.act = ActQuant::kFp8;
  p.out = out;
  p.in = in;
  p.groupSize = in;
  p.packed.resize(static_cast<size_t>(n));
  parallelFor(
      n,
      [&](int64_t k0, int64_t k1) {
        for (int64_t k = k0; k < k1; ++k) p.packed[k] = floatToFp8E4M3Fast(w[k] * mul);
      },
      kGrain);
  p.scales.assign(static_cast<size_t>(out), 1.0f / mul);
  p.tensorScale = 1.0f / mul;
  return p;
}

}  // namespace textgen::runtime
