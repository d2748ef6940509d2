// One linear layer's quantized weight on the host, between the checkpoint (or the load-time
// quantizer) and the device: one code per byte, per-group scales and zero points, and each input's
// group. The loader slices it for the rank, stacks parts (q/k/v, gate/up) and packs it into the
// kernels' runtime layout (textgen/kernels/quant_gemm.h); a layer that cannot take that layout is
// dequantized instead (dense).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loader/parallel_for.h"
#include "textgen/base/status_or.h"
#include "textgen/kernels/quant_gemm.h"
#include "textgen/runtime/tensor.h"

namespace textgen::runtime {

struct QuantizedTensor {
  kernels::QuantCode code = kernels::QuantCode::kUint4;
  kernels::ActQuant act = kernels::ActQuant::kNone;
  float threshold = 6.0f;  // kLlmInt8
  int64_t out = 0, in = 0;
  int64_t groupSize = 0;            // inputs per group when gIdx is empty (a divisor of in)
  int64_t groups = 0;               // scales per output
  std::vector<uint8_t> codes;       // [out, in]
  std::vector<float> scales;        // [out, groups]
  std::vector<uint8_t> zeros;       // [out, groups] (codes with zero points), else empty
  std::vector<int32_t> gIdx;        // [in]: input i's group; empty: i / groupSize
  std::optional<float> inputScale;  // kFp8: the checkpoint's static activation scale
  bool perTensorScale = false;      // one scale for the whole tensor (fp8)

  int64_t groupOf(int64_t i) const { return gIdx.empty() ? i / groupSize : gIdx[i]; }
};

// Shapes and values checked: codes within the code's range, groups in range, sizes consistent.
Status validate(const QuantizedTensor& q, const std::string& name);

// The dense [out, in] weight: (value(code) - zero) * scale in float32, rounded once to `dtype`.
Tensor dequantize(const QuantizedTensor& q, DType dtype);

// Output rows [r0, r0 + rows), as a row selection keeps them: `rowOf(k)` is the source row of
// the result's row k.
QuantizedTensor takeRows(const QuantizedTensor& q, const std::vector<int64_t>& rowsKept);
// Input columns [c0, c0 + cols): whole groups when they align, else every group kept and each
// column's group carried in gIdx (a row-parallel split of an act-order layer).
QuantizedTensor takeColumns(const QuantizedTensor& q, int64_t c0, int64_t cols);
// Parts stacked along the outputs: INVALID_ARGUMENT when their formats or input groups differ.
// Static fp8 input scales may differ: the stack takes the largest (TGI's and vLLM's rule).
StatusOr<QuantizedTensor> stackOutputs(std::vector<QuantizedTensor> parts);

// A std::vector<T> whose resize leaves new elements uninitialised: a buffer that the threads
// filling it touch first (no serial zero-fill of a layer's gigabytes before the parallel loop).
template <typename T>
struct DefaultInitAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  using std::allocator<T>::allocator;
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
using HostBytes = std::vector<uint8_t, DefaultInitAllocator<uint8_t>>;

// The runtime layout's host bytes (textgen/kernels/quant_gemm.h's QuantWeight).
struct PackedQuantized {
  kernels::QuantCode code = kernels::QuantCode::kUint4;
  kernels::ActQuant act = kernels::ActQuant::kNone;
  float threshold = 6.0f;
  int64_t out = 0, in = 0, groupSize = 0;
  HostBytes packed;            // [out, quantRowBytes(code, in)]
  std::vector<float> scales;   // [out, in / groupSize]
  std::vector<uint8_t> zeros;  // [out, in / groupSize] or empty
  std::vector<int32_t> perm;   // [in] or empty (identity)
  std::optional<float> inputScale;
  std::optional<float> tensorScale;
};

// Columns sorted by group when groups are not contiguous (act-order): the permutation then makes
// every runtime group a run of equal size, the largest that divides every run.
PackedQuantized pack(const QuantizedTensor& q);

// Load-time quantizers of a dense float32 [out, in] weight (--quantize): the readable
// definitions, one code per byte. The loader runs loader/load_quantizer.h's, which write the packed
// layout directly and equal pack() of these bit for bit
// (tests/unit/runtime/load_quantizer_test.cpp). bitsandbytes 4-bit's block: 64, or the largest even
// divisor of `in` below 64 (0: `in` is odd).
int64_t bnb4BlockSize(int64_t in);
// bitsandbytes 4-bit (nf4 / fp4): absmax per block of 64 inputs (the largest even divisor of `in`
// below 64 when 64 does not divide it), each value the nearest code of w / absmax (bitsandbytes'
// decision thresholds). INVALID_ARGUMENT for an odd `in`.
StatusOr<QuantizedTensor> quantizeBnb4(const float* w, int64_t out, int64_t in,
                                       kernels::QuantCode code);
// int8 per output channel, symmetric: q = rint(w * 127 / absmax), scale absmax / 127
// (bitsandbytes' LLM.int8 weights with kLlmInt8 activations, EETQ's with none).
QuantizedTensor quantizeInt8Rowwise(const float* w, int64_t out, int64_t in, kernels::ActQuant act);
// float8 e4m3fn with one scale for the tensor, as TGI's fp8_quantize: w * (448 / absmax), its
// reciprocal the scale; dynamic per-tensor fp8 activations.
QuantizedTensor quantizeFp8PerTensor(const float* w, int64_t out, int64_t in);

}  // namespace textgen::runtime
