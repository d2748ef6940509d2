// Pre-quantized linear layers (config.json's quantization_config) dequantized on the host to the
// dense [out, in] weight, exactly as the reference dequantizers compute it: w = (q - z) * s in
// float32, with s read from its float16, rounded to the compute dtype once. The dense path then
// slices it for the rank (dequantize-then-slice: any tensor-parallel split, act-order included).
//
// GPT-Q (AutoGPTQ / GPTQModel / optimum) "<prefix>.":
//   qweight int32 [in * bits / 32, out]   packed along the inputs, low bits first
//   qzeros  int32 [groups, out * bits / 32] packed along the outputs; checkpoint_format "gptq"
//                                          ("v1") stores zero - 1, read back as (v + 1) mod 2^bits
//   scales  fp16  [groups, out]
//   g_idx   int32 [in]                      each input's group; absent: input / group_size
//                                          (required with desc_act)
// AWQ GEMM (AutoAWQ) "<prefix>.":
//   qweight int32 [in, out / 8], qzeros int32 [groups, out / 8]: word c holds outputs c*8 .. c*8+7,
//   output c*8 + j in nibble [0, 4, 1, 5, 2, 6, 3, 7][j] (AWQ's interleaved order)
//   scales  fp16  [groups, out]; zero_point false: no qzeros, zero 8
// Marlin (IST-DASLab's Layer.pack: quant_method "marlin", or "gptq" with checkpoint_format
// "marlin") "<prefix>.": B int32 [in / 16, out * 2], s fp16 [groups, out], both permuted; 4-bit
// symmetric codes, zero 8 (loader/marlin.h).
// fp8 (quant_method "fp8": vLLM / AutoFP8 / TGI; "compressed-tensors" float-quantized) "<prefix>.":
//   weight       F8_E4M3 [out, in]   (the layer's own name; layers left dense stay 16-bit)
//   weight_scale F32/F16/BF16 [] or [1] (per tensor), [out] or [out, 1] (per output channel)
//   input_scale  F32/F16/BF16 [] or [1], read with a static activation scheme
//   w[o, i] = e4m3(weight[o, i]) * weight_scale; finite non-negative weight scales, a finite
//   positive input scale and no NaN codes, else INVALID_ARGUMENT.
//
// Every shape is checked against the layer's before anything is read, and every g_idx entry against
// the groups: the memory used is the layer's dense size, which the checkpoint's bytes bound.
#pragma once

#include <cstdint>
#include <string>

#include "loader/quantized_tensor.h"
#include "textgen/base/status_or.h"
#include "textgen/runtime/quantization_config.h"
#include "textgen/runtime/tensor.h"
#include "textgen/runtime/weights.h"

namespace textgen::runtime {

// "x.weight" -> "x" (the prefix of a layer's quantized tensors).
std::string quantizedPrefix(const std::string& weightName);

// The layer's codes, scales and zero points as stored (no dequantization).
StatusOr<QuantizedTensor> readQuantizedLinear(const WeightStore& store,
                                              const QuantizationConfig& config,
                                              const std::string& prefix, int64_t out, int64_t in);

// [out, in] in `dtype`: INVALID_ARGUMENT / NOT_FOUND naming the tensor or field at fault.
StatusOr<Tensor> dequantizeLinear(const WeightStore& store, const QuantizationConfig& config,
                                  const std::string& prefix, int64_t out, int64_t in, DType dtype);

}  // namespace textgen::runtime
