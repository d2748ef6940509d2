// The load-time quantizers (--quantize) as the loader runs them: a weight's rows straight from the
// checkpoint into the kernels' runtime layout (PackedQuantized), every loop on every core, no
// float32 copy of the layer and no one-code-per-byte intermediate. Each equals pack() of its
// readable definition in loader/quantized_tensor.h (quantizeBnb4, quantizeInt8Rowwise,
// quantizeFp8PerTensor) bit for bit: tests/unit/runtime/load_quantizer_test.cpp compares them.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "loader/quantized_tensor.h"

namespace textgen::runtime {

// A weight's rows where the loader finds them (the checkpoint's mapping, any row order, each
// row float32, bfloat16 or float16): the quantizers read them directly, converting one row at a
// time into a per-thread float32 row (exact), so no float32 copy of the layer is ever made.
struct WeightRows {
  enum class Type { kF32, kBF16, kF16 };
  struct Row {
    const void* data = nullptr;  // `cols` values
    Type type = Type::kF32;
  };
  int64_t cols = 0;
  std::vector<Row> rows;

  int64_t out() const { return static_cast<int64_t>(rows.size()); }
  // Row o as float32: its own values when stored so, else converted into scratch[cols].
  const float* row(int64_t o, float* scratch) const;
  // A dense float32 [out, in] matrix's rows.
  static WeightRows dense(const float* w, int64_t out, int64_t in);
};

// bitsandbytes nf4 / fp4, absmax per block of bnb4BlockSize(in) inputs. INVALID_ARGUMENT for an
// odd `in`.
StatusOr<PackedQuantized> quantizeBnb4Packed(const WeightRows& w, kernels::QuantCode code);
// int8 per output channel, symmetric (LLM.int8 with kLlmInt8 activations, EETQ with none).
PackedQuantized quantizeInt8Packed(const WeightRows& w, kernels::ActQuant act);
// float8 e4m3fn with one scale for the tensor (TGI's fp8_quantize).
PackedQuantized quantizeFp8Packed(const WeightRows& w);

// The same of a dense float32 [out, in] matrix.
inline StatusOr<PackedQuantized> quantizeBnb4Packed(const float* w, int64_t out, int64_t in,
                                                    kernels::QuantCode code) {
  return quantizeBnb4Packed(WeightRows::dense(w, out, in), code);
}
inline PackedQuantized quantizeInt8Packed(const float* w, int64_t out, int64_t in,
                                          kernels::ActQuant act) {
  return quantizeInt8Packed(WeightRows::dense(w, out, in), act);
}
inline PackedQuantized quantizeFp8Packed(const float* w, int64_t out, int64_t in) {
  return quantizeFp8Packed(WeightRows::dense(w, out, in));
}

// kernels::floatToFp8E4M3 (saturating, round to nearest even, NaN 0x7f) in integer operations.
inline uint8_t floatToFp8E4M3Fast(float f) {
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
    return sign | static_cast<uint8_t>((a * 512.0f + 8388608.0f) - 8388608.0f);  // round even
  }
  // Normal: the mantissa rounded from 23 bits to 3, to nearest even (a carry steps the exponent),
  // the exponent rebiased from 127 to 7. Below 448 the result is at most 448's code, 0x7e.
  const uint32_t r = (u + 0x7ffffu + ((u >> 20) & 1u)) >> 20;
  return sign | static_cast<uint8_t>(r - (120u << 3));
}

}  // namespace textgen::runtime
