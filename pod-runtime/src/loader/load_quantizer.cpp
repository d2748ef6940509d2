#include "loader/load_quantizer.h"

#include <array>
#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

#include "textgen/kernels/fp8.h"
#include "textgen/kernels/half.h"

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

// One row's blocks: scales[g] and the row's packed bytes.
template <QuantCode kCode>
void quantizeBnb4Row(const float* x, int64_t in, int64_t block, float* scales, uint8_t* packed) {
  for (int64_t g = 0; g < in / block; ++g, x += block) {
    float amax = 0.0f;
    for (int64_t k = 0; k < block; ++k) amax = absMax(amax, x[k]);
    scales[g] = amax;
    const float inv = 1.0f / amax;  // inf for an all-zero block: 0 * inf is NaN, coded 0
    uint8_t* dst = packed + g * block / 2;
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

// fn(o, row) for rows [o0, o1), each row float32 (a thread's scratch row when converted).
template <typename Fn>
void forRows(const WeightRows& w, int64_t o0, int64_t o1, Fn&& fn) {
  std::vector<float> scratch(static_cast<size_t>(w.cols));
  for (int64_t o = o0; o < o1; ++o) fn(o, w.row(o, scratch.data()));
}

}  // namespace

const float* WeightRows::row(int64_t o, float* scratch) const {
  const Row& r = rows[o];
  const auto* bytes = static_cast<const unsigned char*>(r.data);
  // The mapping gives no alignment: each value read by memcpy (one load).
  if (r.type == Type::kF32) {
    if (reinterpret_cast<uintptr_t>(bytes) % alignof(float) == 0)
      return static_cast<const float*>(r.data);
    std::memcpy(scratch, bytes, static_cast<size_t>(cols) * sizeof(float));
    return scratch;
  }
  for (int64_t i = 0; i < cols; ++i) {
    uint16_t h;
    std::memcpy(&h, bytes + 2 * i, 2);
    scratch[i] = r.type == Type::kBF16 ? kernels::bf16ToFloat(h) : kernels::f16ToFloat(h);
  }
  return scratch;
}

WeightRows WeightRows::dense(const float* w, int64_t out, int64_t in) {
  WeightRows r;
  r.cols = in;
  r.rows.resize(static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o) r.rows[o] = {w + o * in, Type::kF32};
  return r;
}

StatusOr<PackedQuantized> quantizeBnb4Packed(const WeightRows& w, QuantCode code) {
  const int64_t out = w.out(), in = w.cols;
  const int64_t block = bnb4BlockSize(in);
  if (block == 0)
    return invalidArgumentError("bitsandbytes 4-bit: the layer's " + std::to_string(in) +
                                " inputs are odd: 4-bit codes pack in pairs");
  PackedQuantized p;
  p.code = code;
  p.out = out;
  p.in = in;
  p.groupSize = block;
  const int64_t rowBytes = kernels::quantRowBytes(code, in), groups = in / block;
  p.packed.resize(static_cast<size_t>(out * rowBytes));
  p.scales.resize(static_cast<size_t>(out * groups));
  parallelFor(
      out,
      [&](int64_t o0, int64_t o1) {
        forRows(w, o0, o1, [&](int64_t o, const float* x) {
          float* scales = p.scales.data() + o * groups;
          uint8_t* packed = p.packed.data() + o * rowBytes;
          if (code == QuantCode::kNf4)
            quantizeBnb4Row<QuantCode::kNf4>(x, in, block, scales, packed);
          else
            quantizeBnb4Row<QuantCode::kFp4>(x, in, block, scales, packed);
        });
      },
      rowGrain(in));
  return p;
}

PackedQuantized quantizeInt8Packed(const WeightRows& w, ActQuant act) {
  const int64_t out = w.out(), in = w.cols;
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
        forRows(w, o0, o1, [&](int64_t o, const float* x) {
          uint8_t* dst = p.packed.data() + o * in;
          float amax = 0.0f;
          for (int64_t i = 0; i < in; ++i) amax = absMax(amax, x[i]);
          p.scales[o] = amax / 127.0f;
          if (!(amax > 0.0f)) {
            std::memset(dst, 128, static_cast<size_t>(in));
            return;
          }
          const float mul = 127.0f / amax;
          for (int64_t i = 0; i < in; ++i) {
            float v = roundEven(x[i] * mul);  // |x * mul| <= 127 (+ rounding) or NaN
            if (std::isnan(v)) v = 0.0f;      // a NaN or infinite weight: no code holds it
            v = v < -127.0f ? -127.0f : (v > 127.0f ? 127.0f : v);
            dst[i] = static_cast<uint8_t>(static_cast<int>(v) + 128);
          }
        });
      },
      rowGrain(in));
  return p;
}

PackedQuantized quantizeFp8Packed(const WeightRows& w) {
  const int64_t out = w.out(), in = w.cols;
  // The tensor's absmax (a pass over every row), then every value coded against it.
  float amax = 0.0f;
  std::mutex m;
  parallelFor(
      out,
      [&](int64_t o0, int64_t o1) {
        float local = 0.0f;
        forRows(w, o0, o1, [&](int64_t, const float* x) {
          for (int64_t i = 0; i < in; ++i) local = absMax(local, x[i]);
        });
        const std::lock_guard<std::mutex> lock(m);
        amax = std::fmax(amax, local);
      },
      rowGrain(in));
  const float mul = kernels::kFp8E4M3Max / std::fmax(amax, 1e-12f);
  PackedQuantized p;
  p.code = QuantCode::kFp8E4M3;
  p.act = ActQuant::kFp8;
  p.out = out;
  p.in = in;
  p.groupSize = in;
  p.packed.resize(static_cast<size_t>(out * in));
  parallelFor(
      out,
      [&](int64_t o0, int64_t o1) {
        forRows(w, o0, o1, [&](int64_t o, const float* x) {
          uint8_t* dst = p.packed.data() + o * in;
          for (int64_t i = 0; i < in; ++i) dst[i] = floatToFp8E4M3Fast(x[i] * mul);
        });
      },
      rowGrain(in));
  p.scales.assign(static_cast<size_t>(out), 1.0f / mul);
  p.tensorScale = 1.0f / mul;
  return p;
}

}  // namespace textgen::runtime
