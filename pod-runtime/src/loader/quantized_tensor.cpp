#include "loader/quantized_tensor.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>

#include "textgen/kernels/fp8.h"
#include "textgen/kernels/half.h"

namespace textgen::runtime {

using kernels::ActQuant;
using kernels::QuantCode;

Status validate(const QuantizedTensor& q, const std::string& name) {
  auto bad = [&](const std::string& what) {
    return invalidArgumentError("quantized weight '" + name + "': " + what);
  };
  if (q.out <= 0 || q.in <= 0 || q.groups <= 0) return bad("needs a positive shape and groups");
  if (q.gIdx.empty() &&
      (q.groupSize <= 0 || q.in % q.groupSize != 0 || q.in / q.groupSize != q.groups))
    return bad("its groups do not divide its inputs");
  if (!q.gIdx.empty() && static_cast<int64_t>(q.gIdx.size()) != q.in)
    return bad("needs one group index per input");
  for (int32_t g : q.gIdx)
    if (g < 0 || g >= q.groups) return bad("a group index is out of range");
  const auto n = static_cast<size_t>(q.out * q.in), ng = static_cast<size_t>(q.out * q.groups);
  if (q.codes.size() != n || q.scales.size() != ng)
    return bad("its codes or scales do not match its shape");
  if (kernels::quantHasZeros(q.code) != !q.zeros.empty() ||
      (!q.zeros.empty() && q.zeros.size() != ng))
    return bad("its zero points do not match its format");
  if (kernels::quantBits(q.code) == 4)
    for (uint8_t c : q.codes)
      if (c > 15) return bad("a 4-bit code is out of range");
  if (kernels::quantBits(q.code) == 4 && q.in % 2 != 0) return bad("4-bit codes need even inputs");
  return okStatus();
}

Tensor dequantize(const QuantizedTensor& q, DType dtype) {
  Tensor t(dtype, {q.out, q.in});
  auto* f = static_cast<float*>(t.data());
  auto* h = static_cast<uint16_t*>(t.data());
  parallelFor(
      q.out,
      [&](int64_t o0, int64_t o1) {
        for (int64_t o = o0; o < o1; ++o) {
          for (int64_t i = 0; i < q.in; ++i) {
            const int64_t g = o * q.groups + q.groupOf(i);
            float v = kernels::quantCodeValue(q.code, q.codes[o * q.in + i]);
            if (!q.zeros.empty()) v -= static_cast<float>(q.zeros[g]);
            v *= q.scales[g];
            const int64_t k = o * q.in + i;
            if (dtype == DType::kF32)
              f[k] = v;
            else
              h[k] = dtype == DType::kF16 ? kernels::floatToF16(v) : kernels::floatToBf16(v);
          }
        }
      },
      rowGrain(q.in));
  return t;
}

QuantizedTensor takeRows(const QuantizedTensor& q, const std::vector<int64_t>& rowsKept) {
  QuantizedTensor r = q;
  r.out = static_cast<int64_t>(rowsKept.size());
  r.codes.resize(static_cast<size_t>(r.out * q.in));
  r.scales.resize(static_cast<size_t>(r.out * q.groups));
  if (!q.zeros.empty()) r.zeros.resize(r.scales.size());
  for (int64_t k = 0; k < r.out; ++k) {
    const int64_t s = rowsKept[k];
    std::copy_n(q.codes.begin() + s * q.in, q.in, r.codes.begin() + k * q.in);
    std::copy_n(q.scales.begin() + s * q.groups, q.groups, r.scales.begin() + k * q.groups);
    if (!q.zeros.empty())
      std::copy_n(q.zeros.begin() + s * q.groups, q.groups, r.zeros.begin() + k * q.groups);
  }
  return r;
}

QuantizedTensor takeColumns(const QuantizedTensor& q, int64_t c0, int64_t cols) {
  QuantizedTensor r = q;
  r.in = cols;
  r.codes.resize(static_cast<size_t>(q.out * cols));
  for (int64_t o = 0; o < q.out; ++o)
    std::copy_n(q.codes.begin() + o * q.in + c0, cols, r.codes.begin() + o * cols);
  if (q.gIdx.empty() && q.groups == 1) {
    // One group over all inputs (fp8, GPT-Q group_size -1): it stays one group over the slice.
    r.groupSize = cols;
    return r;
  }
  if (q.gIdx.empty() && c0 % q.groupSize == 0 && cols % q.groupSize == 0) {
    // Whole groups: this slice's scales only.
    const int64_t g0 = c0 / q.groupSize;
    r.groups = cols / q.groupSize;
    r.scales.resize(static_cast<size_t>(q.out * r.groups));
    if (!q.zeros.empty()) r.zeros.resize(r.scales.size());
    for (int64_t o = 0; o < q.out; ++o) {
      std::copy_n(q.scales.begin() + o * q.groups + g0, r.groups, r.scales.begin() + o * r.groups);
      if (!q.zeros.empty())
        std::copy_n(q.zeros.begin() + o * q.groups + g0, r.groups, r.zeros.begin() + o * r.groups);
    }
    return r;
  }
  r.gIdx.resize(static_cast<size_t>(cols));
  for (int64_t j = 0; j < cols; ++j) r.gIdx[j] = static_cast<int32_t>(q.groupOf(c0 + j));
  return r;
}

StatusOr<QuantizedTensor> stackOutputs(std::vector<QuantizedTensor> parts) {
  if (parts.empty()) return invalidArgumentError("no parts to stack");
  QuantizedTensor r = std::move(parts[0]);
  for (size_t k = 1; k < parts.size(); ++k) {
    QuantizedTensor& p = parts[k];
    const bool sameGroups = r.gIdx.empty() && p.gIdx.empty()
                                ? r.groupSize == p.groupSize
                                : r.gIdx == p.gIdx && r.groups == p.groups;
    if (p.code != r.code || p.act != r.act || p.in != r.in || !sameGroups ||
        p.inputScale.has_value() != r.inputScale.has_value() || p.threshold != r.threshold)
      return invalidArgumentError("stacked quantized parts differ in format or input groups");
    // Static fp8 input scales: the largest of the parts' (q/k/v, gate/up), as TGI and vLLM do.
    if (p.inputScale) r.inputScale = std::max(*r.inputScale, *p.inputScale);
    // One tensor scale per stack: parts with different ones keep them per output.
    if (r.perTensorScale && (!p.perTensorScale || p.scales[0] != r.scales[0]))
      r.perTensorScale = false;
    r.out += p.out;
    r.codes.insert(r.codes.end(), p.codes.begin(), p.codes.end());
    r.scales.insert(r.scales.end(), p.scales.begin(), p.scales.end());
    r.zeros.insert(r.zeros.end(), p.zeros.begin(), p.zeros.end());
  }
  return r;
}

PackedQuantized pack(const QuantizedTensor& q) {
  PackedQuantized p;
  p.code = q.code;
  p.act = q.act;
  p.threshold = q.threshold;
  p.out = q.out;
  p.in = q.in;
  p.inputScale = q.inputScale;
  if (q.perTensorScale) p.tensorScale = q.scales[0];
  // Column order and runtime groups.
  std::vector<int32_t> order(static_cast<size_t>(q.in));
  std::iota(order.begin(), order.end(), 0);
  bool identity = true;
  int64_t runGroup = q.groupSize;
  if (!q.gIdx.empty()) {
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return q.gIdx[a] < q.gIdx[b]; });
    for (int64_t j = 0; j < q.in; ++j) identity = identity && order[j] == j;
    // The largest size dividing every run of equal groups.
    runGroup = 0;
    int64_t start = 0;
    for (int64_t j = 1; j <= q.in; ++j) {
      if (j == q.in || q.gIdx[order[j]] != q.gIdx[order[start]]) {
        runGroup = std::gcd(runGroup, j - start);
        start = j;
      }
    }
  }
  p.groupSize = runGroup;
  if (!identity) p.perm = order;
  const int64_t groups = q.in / runGroup;
  const int bits = kernels::quantBits(q.code);
  const int64_t rowBytes = kernels::quantRowBytes(q.code, q.in);
  p.packed.assign(static_cast<size_t>(q.out * rowBytes), 0);
  p.scales.resize(static_cast<size_t>(q.out * groups));
  if (!q.zeros.empty()) p.zeros.resize(p.scales.size());
  parallelFor(
      q.out,
      [&](int64_t o0, int64_t o1) {
        for (int64_t o = o0; o < o1; ++o) {
          uint8_t* row = p.packed.data() + o * rowBytes;
          const uint8_t* codes = q.codes.data() + o * q.in;
          for (int64_t j = 0; j < q.in; ++j) {
            const uint8_t c = codes[order[j]];
            if (bits == 8)
              row[j] = c;
            else
              row[j / 2] |= static_cast<uint8_t>(c << (4 * (j % 2)));
          }
          for (int64_t g = 0; g < groups; ++g) {
            const int64_t src = o * q.groups + q.groupOf(order[g * runGroup]);
            p.scales[o * groups + g] = q.scales[src];
            if (!q.zeros.empty()) p.zeros[o * groups + g] = q.zeros[src];
          }
        }
      },
      rowGrain(q.in));
  return p;
}

namespace {

// bitsandbytes' dQuantizeNF4 / dQuantizeFP4 decisions for x = w / absmax in [-1, 1]: the code
// whose value is nearest, a tie to the lower one (NF4's thresholds are the midpoints of its
// table; FP4's are its kernel's constants).
uint8_t nf4Code(float x) {
  // Midpoints between neighbouring codes; the code is the number of midpoints below x.
  static const auto kMid = [] {
    std::array<float, 15> m{};
    for (int c = 1; c < 16; ++c)
      m[c - 1] = 0.5f * (kernels::kNf4Table[c - 1] + kernels::kNf4Table[c]);
    return m;
  }();
  return static_cast<uint8_t>(std::lower_bound(kMid.begin(), kMid.end(), x) - kMid.begin());
}

uint8_t fp4Code(float x) {
  const uint8_t sign = x < 0 ? 8 : 0;
  const float a = std::fabs(x);
  if (a > 0.29166667f) {
    if (a > 0.583333f) return sign | (a > 0.8333333f ? 0b0011 : 0b0010);
    return sign | (a > 0.4166667f ? 0b0101 : 0b0100);
  }
  if (a > 0.0859375f) return sign | (a > 0.20833333f ? 0b0111 : 0b0110);
  return sign | (a > 0.00260417f ? 0b0001 : 0b0000);
}

}  // namespace

int64_t bnb4BlockSize(int64_t in) {
  int64_t block = 64;
  while (block > 2 && in % block != 0) block -= 2;
  return in % block == 0 ? block : 0;
}

StatusOr<QuantizedTensor> quantizeBnb4(const float* w, int64_t out, int64_t in, QuantCode code) {
  // bitsandbytes' blocks of 64 run over the flattened tensor; here they stay within an output's
  // inputs, so a layer whose inputs are not a multiple of 64 takes the largest even block below
  // 64 that divides them (smaller blocks: at least bitsandbytes' precision).
  const int64_t kBlock = bnb4BlockSize(in);
  if (kBlock == 0)
    return invalidArgumentError("bitsandbytes 4-bit: the layer's " + std::to_string(in) +
                                " inputs are odd: 4-bit codes pack in pairs");
  QuantizedTensor q;
  q.code = code;
  q.out = out;
  q.in = in;
  q.groupSize = kBlock;
  q.groups = in / kBlock;
  q.codes.resize(static_cast<size_t>(out * in));
  q.scales.resize(static_cast<size_t>(out * q.groups));
  parallelFor(
      out * q.groups,
      [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          const float* x = w + b * kBlock;
          float amax = 0.0f;
          for (int64_t k = 0; k < kBlock; ++k) amax = std::fmax(amax, std::fabs(x[k]));
          q.scales[b] = amax;
          const float inv =
              1.0f / amax;  // inf for an all-zero block: 0 * inf is NaN, coded 0 below
          for (int64_t k = 0; k < kBlock; ++k) {
            float v = x[k] * inv;
            if (std::isnan(v)) v = 0.0f;
            q.codes[b * kBlock + k] = code == QuantCode::kNf4 ? nf4Code(v) : fp4Code(v);
          }
        }
      },
      rowGrain(kBlock));
  return q;
}

QuantizedTensor quantizeInt8Rowwise(const float* w, int64_t out, int64_t in, ActQuant act) {
  QuantizedTensor q;
  q.code = QuantCode::kUint8;
  q.act = act;
  q.out = out;
  q.in = in;
  q.groupSize = in;
  q.groups = 1;
  q.codes.resize(static_cast<size_t>(out * in));
  q.scales.resize(static_cast<size_t>(out));
  q.zeros.assign(static_cast<size_t>(out), 128);
  parallelFor(
      out,
      [&](int64_t o0, int64_t o1) {
        for (int64_t o = o0; o < o1; ++o) {
          const float* x = w + o * in;
          float amax = 0.0f;
          for (int64_t i = 0; i < in; ++i) amax = std::fmax(amax, std::fabs(x[i]));
          q.scales[o] = amax / 127.0f;
          for (int64_t i = 0; i < in; ++i) {
            float v = amax > 0.0f ? std::nearbyint(x[i] * (127.0f / amax)) : 0.0f;
            if (std::isnan(v)) v = 0.0f;  // a NaN or infinite weight: no code holds it
            q.codes[o * in + i] =
                static_cast<uint8_t>(static_cast<int>(std::clamp(v, -127.0f, 127.0f)) + 128);
          }
        }
      },
      rowGrain(in));
  return q;
}

QuantizedTensor quantizeFp8PerTensor(const float* w, int64_t out, int64_t in) {
  QuantizedTensor q;
  q.code = QuantCode::kFp8E4M3;
  q.act = ActQuant::kFp8;
  q.out = out;
  q.in = in;
  q.groupSize = in;
  q.groups = 1;
  q.perTensorScale = true;
  float amax = 0.0f;
  for (int64_t k = 0; k < out * in; ++k) amax = std::fmax(amax, std::fabs(w[k]));
  const float mul = kernels::kFp8E4M3Max / std::fmax(amax, 1e-12f);
  q.codes.resize(static_cast<size_t>(out * in));
  parallelFor(
      out * in,
      [&](int64_t k0, int64_t k1) {
        for (int64_t k = k0; k < k1; ++k) q.codes[k] = kernels::floatToFp8E4M3(w[k] * mul);
      },
      int64_t{1} << 16);
  q.scales.assign(static_cast<size_t>(out), 1.0f / mul);
  return q;
}

}  // namespace textgen::runtime
