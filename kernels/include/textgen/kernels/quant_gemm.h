// Linear layers with quantized weights: y[rows, out] = act(x)[rows, in] · deq(W)[out, in]ᵀ, fp32
// accumulation, the result rounded once to the dtype. One runtime layout serves every format the
// loader reads (GPT-Q, AWQ, bitsandbytes nf4/fp4/int8, EETQ, fp8): codes packed along each output's
// inputs, and per-group scales (and zero points) of `groupSize` consecutive inputs.
//
//   deq(W)[o, i] = value(code[o, j]) * scales[o, j / groupSize]   for the column j holding input i
//   value(q) = q - zeros[o, j / groupSize]   kUint4, kUint8 (a signed int8 is stored q + 128, zero
//   128)
//            = kNf4Table[q], kFp4Table[q]     bitsandbytes' code tables
//            = the float8 e4m3fn value of q    kFp8E4M3
//
// Column j holds input perm[j] when a permutation is given (GPT-Q act-order, whose g_idx groups are
// made contiguous at load), else input j.
//
// What happens to the activations (the format's scheme):
//   kNone:    x as it is (W4A16, W8A16).
//   kLlmInt8: LLM.int8 (bitsandbytes' Linear8bitLt, Dettmers et al. 2022): an element with
//             |x| >= threshold is an outlier, and an input column with an outlier in any row is an
//             outlier column, multiplied in full precision. Every other column is quantized per row
//             to int8: x' = rint(x * 127 / a_r) * a_r / 127, a_r the row's absmax over its elements
//             that are not outliers (0 when there are none: the row's x' is 0).
//   kFp8:     W8A8: x' = e4m3(x / s) * s, s = the static input scale, or absmax(x over the whole
//             batch) / 448 (dynamic; 1 when x is all zeros).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "textgen/base/status.h"
#include "textgen/kernels/activation.h"
#include "textgen/kernels/dtype.h"
#include "textgen/kernels/stream.h"

namespace textgen::kernels {

enum class QuantCode : uint8_t { kUint4, kUint8, kNf4, kFp4, kFp8E4M3 };
enum class ActQuant : uint8_t { kNone, kLlmInt8, kFp8 };

constexpr int quantBits(QuantCode c) {
  return c == QuantCode::kUint8 || c == QuantCode::kFp8E4M3 ? 8 : 4;
}
constexpr bool quantHasZeros(QuantCode c) {
  return c == QuantCode::kUint4 || c == QuantCode::kUint8;
}
constexpr std::string_view toString(QuantCode c) {
  switch (c) {
    case QuantCode::kUint4: return "uint4";
    case QuantCode::kUint8: return "uint8";
    case QuantCode::kNf4: return "nf4";
    case QuantCode::kFp4: return "fp4";
    case QuantCode::kFp8E4M3: return "fp8_e4m3fn";
  }
  return "?";
}

// bitsandbytes' 4-bit code tables (values before the absmax scale), index = the 4-bit code.
extern const float kNf4Table[16];
extern const float kFp4Table[16];

// A code's value before scaling (the zero point is not applied).
float quantCodeValue(QuantCode c, uint32_t q);

struct QuantWeight {
  QuantCode code = QuantCode::kUint4;
  // [out, in * bits / 8] bytes: output o's inputs (columns) in order; 4-bit codes two per byte,
  // column 2k in the low nibble of byte k.
  const void* packed = nullptr;
  const float* scales = nullptr;   // [out, in / groupSize]
  const uint8_t* zeros = nullptr;  // [out, in / groupSize] (kUint4, kUint8)
  int64_t groupSize = 0;           // a divisor of in
  const int32_t* perm = nullptr;   // [in] or null: column j holds input perm[j]
  ActQuant act = ActQuant::kNone;
  float threshold = 6.0f;             // kLlmInt8
  const float* inputScale = nullptr;  // kFp8: the static activation scale (1 float), or dynamic
  // kFp8 with one scale for the whole tensor: it (1 float; scales then holds it per output).
  const float* tensorScale = nullptr;
};

struct QuantGemmParams {
  const void* x = nullptr;  // [rows, in]
  QuantWeight w;
  void* y = nullptr;  // [rows, out]
  int64_t rows = 0, in = 0, out = 0;
  DType dtype = DType::kF32;
};

Status validateQuantGemm(const QuantGemmParams& p);
// Bytes of one output row's packed codes.
constexpr int64_t quantRowBytes(QuantCode c, int64_t in) {
  return in * quantBits(c) / 8;
}

// Plain loops on host memory: the readable definition, for tests and the CPU backend.
Status quantGemmReference(const QuantGemmParams& p);
// deq(W) as a dense [out, in] float32 matrix in the inputs' order (host memory).
Status dequantizeWeightReference(const QuantWeight& w, int64_t out, int64_t in, float* dense);
// act(x) of p (host memory): [rows, in] float32.
Status quantizeActivationsReference(const QuantGemmParams& p, float* xq);

// CUDA (defined only in builds with CUDA). Decode-sized batches (16-bit dtypes, a layout whose
// 16-byte code vectors stay within one group) run a GEMV that decodes the codes in registers: on
// the tensor cores up to kMaxQuantMmaRows rows of x as it is (and fp8 W8A8 up to
// kMaxQuantGemvRows), in fp32 up to kMaxQuantGemvRows for LLM.int8 and other fp8 layouts; larger
// ones dequantize the weight into the workspace and run cuBLASLt, or, for fp8 with one tensor
// scale, quantize the activations to e4m3 and run cuBLASLt's FP8 GEMM.
constexpr int64_t kMaxQuantGemvRows = 8;
constexpr int64_t kMaxQuantMmaRows = 64;
class GemmRunner;
// Workspace bytes invokeQuantGemm needs for p.
size_t quantGemmWorkspaceBytes(const QuantGemmParams& p);
Status invokeQuantGemm(const QuantGemmParams& p, void* workspace, size_t workspaceBytes,
                       GemmRunner& gemm, Stream stream);
// A gated projection ([gate; up] stacked: p.out = 2n) with its activation in the GEMV's epilogue:
// y [rows, n] = act(gate) * up, each product rounded to the dtype first, bit for bit
// invokeQuantGemm followed by invokeGatedActivation. Decode-sized batches on the tensor-core GEMV
// only (up to 8 rows); quantGemmGatedTakes says whether p is one. Same workspace as
// invokeQuantGemm.
bool quantGemmGatedTakes(const QuantGemmParams& p);
Status invokeQuantGemmGated(const QuantGemmParams& p, Activation a, void* workspace,
                            size_t workspaceBytes, GemmRunner& gemm, Stream stream);

}  // namespace textgen::kernels
