// config.json's quantization_config as a typed struct: how a pre-quantized checkpoint's linear
// layers are stored. Recognised without any flag, as transformers does; anything unsupported or
// contradictory is an error naming the field. The layers' tensors are read by loader/dequantize.h.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string_view>

#include "textgen/base/status_or.h"

namespace textgen::runtime {

enum class QuantMethod {
  kNone,  // a dense checkpoint
  kGptq,  // AutoGPTQ / GPTQModel / optimum: qweight, qzeros, scales, g_idx
  kAwq,   // AutoAWQ's GEMM layout: qweight, qzeros, scales
  // float8 e4m3fn weights with weight_scale (and input_scale): quant_method "fp8" (vLLM, AutoFP8,
  // TGI) or "compressed-tensors" float-quantized (llm-compressor)
  kFp8,
  // IST-DASLab's Marlin layout (B, s; 4-bit symmetric, group 128 or per channel): quant_method
  // "marlin" (vLLM, TGI's --quantize marlin), or "gptq" with checkpoint_format "marlin" (AutoGPTQ)
  kMarlin,
};

constexpr std::string_view toString(QuantMethod m) {
  switch (m) {
    case QuantMethod::kNone: return "none";
    case QuantMethod::kGptq: return "gptq";
    case QuantMethod::kAwq: return "awq";
    case QuantMethod::kFp8: return "fp8";
    case QuantMethod::kMarlin: return "marlin";
  }
  return "?";
}

struct QuantizationConfig {
  QuantMethod method = QuantMethod::kNone;
  int bits = 0;           // GPT-Q: 4 or 8; AWQ, Marlin: 4
  int64_t groupSize = 0;  // inputs per group of scales and zeros; 0: one group (group_size -1)
  bool descAct = false;   // GPT-Q act-order: each input's group given by g_idx
  bool sym = true;        // GPT-Q: symmetric (zero 2^(bits-1), still read from qzeros)
  // GPT-Q checkpoint_format "gptq" ("v1", AutoGPTQ's): qzeros hold zero - 1 (modulo 2^bits);
  // "gptq_v2": the zeros themselves.
  bool zerosMinusOne = true;
  bool zeroPoint = true;  // AWQ zero_point: false reads no qzeros (zero 2^(bits-1))
  // Marlin: quant_method "gptq" with checkpoint_format "marlin" (which --quantize gptq names too,
  // as vLLM accepts it), rather than quant_method "marlin".
  bool marlinAsGptq = false;
  // fp8: how the activations are quantized. kStatic reads each layer's input_scale; kDynamic
  // takes absmax / 448 per batch; kNone keeps them in the compute dtype (W8A16: compressed-tensors'
  // per-token dynamic scheme, which the runtime layout does not model, or no input_activations).
  enum class Fp8Activations { kDynamic, kStatic, kNone };
  Fp8Activations fp8Activations = Fp8Activations::kDynamic;

  bool quantized() const { return method != QuantMethod::kNone; }
};

// --quantize values that quantize a dense float16/bfloat16/float32 checkpoint as it is loaded
// (TGI's names): every linear layer but the logits head.
enum class LoadQuantization {
  kNone,
  kBitsandbytes,     // LLM.int8: int8 weights per output, outlier decomposition at 6.0
  kBitsandbytesNf4,  // NF4, absmax per block of 64
  kBitsandbytesFp4,  // FP4, absmax per block of 64
  kEetq,             // int8 weights per output, 16-bit activations
  kFp8,              // float8 e4m3fn weights, one scale per tensor; fp8 activations
};

constexpr std::string_view toString(LoadQuantization q) {
  switch (q) {
    case LoadQuantization::kNone: return "none";
    case LoadQuantization::kBitsandbytes: return "bitsandbytes";
    case LoadQuantization::kBitsandbytesNf4: return "bitsandbytes-nf4";
    case LoadQuantization::kBitsandbytesFp4: return "bitsandbytes-fp4";
    case LoadQuantization::kEetq: return "eetq";
    case LoadQuantization::kFp8: return "fp8";
  }
  return "?";
}

// The load-time format a --quantize value names; kNone for the others (pre-quantized formats).
constexpr LoadQuantization loadQuantizationOf(std::string_view flag) {
  for (auto q :
       {LoadQuantization::kBitsandbytes, LoadQuantization::kBitsandbytesNf4,
        LoadQuantization::kBitsandbytesFp4, LoadQuantization::kEetq, LoadQuantization::kFp8})
    if (flag == toString(q)) return q;
  return LoadQuantization::kNone;
}

// The quantization_config of a config.json object (kNone when absent or null).
StatusOr<QuantizationConfig> parseQuantizationConfig(const nlohmann::json& config);

}  // namespace textgen::runtime
