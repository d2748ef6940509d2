#include "textgen/kernels/quant_gemm.h"

#include <cmath>
#include <string>
#include <vector>

#include "elements.h"
#include "textgen/kernels/fp8.h"

namespace textgen::kernels {

// bitsandbytes csrc/kernels.cu: nf4_dequantization_lut, and dDequantizeFP4Tree's values by code
// (bit 3 the sign).
const float kNf4Table[16] = {-1.0f,
                             -0.6961928009986877f,
                             -0.5250730514526367f,
                             -0.39491748809814453f,
                             -0.28444138169288635f,
                             -0.18477343022823334f,
                             -0.09105003625154495f,
                             0.0f,
                             0.07958029955625534f,
                             0.16093020141124725f,
                             0.24611230194568634f,
                             0.33791524171829224f,
                             0.44070982933044434f,
                             0.5626170039176941f,
                             0.7229568362236023f,
                             1.0f};
const float kFp4Table[16] = {
    0.0f,  5.208333333e-03f,  0.66666667f,  1.0f,  0.33333333f,  0.5f,  0.16666667f,  0.25f,
    -0.0f, -5.208333333e-03f, -0.66666667f, -1.0f, -0.33333333f, -0.5f, -0.16666667f, -0.25f};

float quantCodeValue(QuantCode c, uint32_t q) {
  switch (c) {
    case QuantCode::kUint4:
    case QuantCode::kUint8: return static_cast<float>(q);
    case QuantCode::kNf4: return kNf4Table[q & 15];
    case QuantCode::kFp4: return kFp4Table[q & 15];
    case QuantCode::kFp8E4M3: return fp8E4M3ToFloat(static_cast<uint8_t>(q));
  }
  return 0.0f;
}

Status validateQuantGemm(const QuantGemmParams& p) {
  const QuantWeight& w = p.w;
  if (p.rows < 0 || p.in <= 0 || p.out <= 0) return invalidArgumentError("quant gemm: bad shape");
  if (w.groupSize <= 0 || p.in % w.groupSize != 0)
    return invalidArgumentError("quant gemm: group size " + std::to_string(w.groupSize) +
                                " does not divide the " + std::to_string(p.in) + " inputs");
  if (quantBits(w.code) == 4 && p.in % 2 != 0)
    return invalidArgumentError("quant gemm: 4-bit codes need an even number of inputs");
  if (!w.packed || !w.scales || (quantHasZeros(w.code) && !w.zeros))
    return invalidArgumentError(std::string("quant gemm: ") + std::string(toString(w.code)) +
                                " weights need codes, scales" +
                                (quantHasZeros(w.code) ? " and zero points" : ""));
  if (w.act == ActQuant::kFp8 && w.code != QuantCode::kFp8E4M3)
    return invalidArgumentError("quant gemm: fp8 activations need fp8 weights");
  if (w.act == ActQuant::kLlmInt8 && !(w.threshold > 0.0f))
    return invalidArgumentError("quant gemm: LLM.int8 needs a positive outlier threshold");
  if (p.rows > 0 && (!p.x || !p.y)) return invalidArgumentError("quant gemm: x and y are required");
  return okStatus();
}

namespace {

uint32_t codeAt(const QuantWeight& w, int64_t in, int64_t o, int64_t j) {
  const auto* row = static_cast<const uint8_t*>(w.packed) + o * quantRowBytes(w.code, in);
  if (quantBits(w.code) == 8) return row[j];
  return (row[j / 2] >> (4 * (j % 2))) & 15u;
}

}  // namespace

Status dequantizeWeightReference(const QuantWeight& w, int64_t out, int64_t in, float* dense) {
  QuantGemmParams p{.w = w, .rows = 0, .in = in, .out = out};
  TG_RETURN_IF_ERROR(validateQuantGemm(p));
  const int64_t groups = in / w.groupSize;
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t j = 0; j < in; ++j) {
      const int64_t g = o * groups + j / w.groupSize;
      float v = quantCodeValue(w.code, codeAt(w, in, o, j));
      if (quantHasZeros(w.code)) v -= static_cast<float>(w.zeros[g]);
      const int64_t i = w.perm ? w.perm[j] : j;
      if (i < 0 || i >= in)
        return invalidArgumentError("quant gemm: a permutation entry is out of range");
      dense[o * in + i] = v * w.scales[g];
    }
  }
  return okStatus();
}

Status quantizeActivationsReference(const QuantGemmParams& p, float* xq) {
  TG_RETURN_IF_ERROR(validateQuantGemm(p));
  const Elements e{p.dtype};
  const int64_t n = p.rows * p.in;
  for (int64_t k = 0; k < n; ++k) xq[k] = e.load(p.x, k);
  switch (p.w.act) {
    case ActQuant::kNone: return okStatus();
    case ActQuant::kFp8: {
      float s = p.w.inputScale ? *p.w.inputScale : 0.0f;
      if (!p.w.inputScale) {
        float amax = 0.0f;
        for (int64_t k = 0; k < n; ++k) amax = std::fmax(amax, std::fabs(xq[k]));
        s = amax > 0.0f ? amax / kFp8E4M3Max : 1.0f;
      }
      for (int64_t k = 0; k < n; ++k) xq[k] = fp8E4M3ToFloat(floatToFp8E4M3(xq[k] / s)) * s;
      return okStatus();
    }
    case ActQuant::kLlmInt8: {
      const float t = p.w.threshold;
      std::vector<char> outlierCol(static_cast<size_t>(p.in), 0);
      for (int64_t r = 0; r < p.rows; ++r)
        for (int64_t i = 0; i < p.in; ++i)
          if (std::fabs(xq[r * p.in + i]) >= t) outlierCol[i] = 1;
      for (int64_t r = 0; r < p.rows; ++r) {
        float* x = xq + r * p.in;
        float amax = 0.0f;
        for (int64_t i = 0; i < p.in; ++i)
          if (std::fabs(x[i]) < t) amax = std::fmax(amax, std::fabs(x[i]));
        for (int64_t i = 0; i < p.in; ++i) {
          if (outlierCol[i]) continue;
          x[i] = amax > 0.0f ? std::nearbyint(x[i] * (127.0f / amax)) * (amax / 127.0f) : 0.0f;
        }
      }
      return okStatus();
    }
  }
  return okStatus();
}

Status quantGemmReference(const QuantGemmParams& p) {
  TG_RETURN_IF_ERROR(validateQuantGemm(p));
  if (p.rows == 0) return okStatus();
  std::vector<float> w(static_cast<size_t>(p.out * p.in));
  std::vector<float> x(static_cast<size_t>(p.rows * p.in));
  TG_RETURN_IF_ERROR(dequantizeWeightReference(p.w, p.out, p.in, w.data()));
  TG_RETURN_IF_ERROR(quantizeActivationsReference(p, x.data()));
  const Elements e{p.dtype};
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t o = 0; o < p.out; ++o) {
      float acc = 0.0f;
      for (int64_t i = 0; i < p.in; ++i) acc += x[r * p.in + i] * w[o * p.in + i];
      e.store(p.y, r * p.out + o, acc);
    }
  }
  return okStatus();
}

}  // namespace textgen::kernels
