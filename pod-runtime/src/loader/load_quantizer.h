// The load-time quantizers (--quantize) as the loader runs them: a dense float32 [out, in] weight
// straight into the kernels' runtime layout (PackedQuantized), every loop on every core, no
// one-code-per-byte intermediate. Each equals pack() of its readable definition in
// loader/quantized_tensor.h (quantizeBnb4, quantizeInt8Rowwise, quantizeFp8PerTensor) bit for bit:
// tests/unit/runtime/load_quantizer_test.cpp compares them.
#pragma once

#include <cstdint>

#include "loader/quantized_tensor.h"

namespace textgen::runtime {

// bitsandbytes nf4 / fp4, absmax per block of bnb4BlockSize(in) inputs. INVALID_ARGUMENT for an
// odd `in`.
StatusOr<PackedQuantized> quantizeBnb4Packed(const float* w, int64_t out, int64_t in,
                                             kernels::QuantCode code);
// int8 per output channel, symmetric (LLM.int8 with kLlmInt8 activations, EETQ with none).
PackedQuantized quantizeInt8Packed(const float* w, int64_t out, int64_t in, kernels::ActQuant act);
// float8 e4m3fn with one scale for the tensor (TGI's fp8_quantize).
PackedQuantized quantizeFp8Packed(const float* w, int64_t out, int64_t in);

// kernels::floatToFp8E4M3 (saturating, round to nearest even, NaN 0x7f) in integer operations.
uint8_t floatToFp8E4M3Fast(float f);

}  // namespace textgen::runtime
