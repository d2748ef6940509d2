#include "loader/dequantize.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "loader/marlin.h"
#include "textgen/kernels/half.h"

namespace textgen::runtime {
namespace {

// AWQ's interleaved order: output j of a word (8 outputs) sits in nibble kAwqNibble[j].
constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

uint32_t wordAt(std::string_view bytes, int64_t i) {
  uint32_t w;  // little-endian, as safetensors stores it (and as every supported host is)
  std::memcpy(&w, bytes.data() + 4 * i, 4);
  return w;
}

uint32_t field(uint32_t word, int k, int bits) {
  return (word >> (k * bits)) & ((1u << bits) - 1);
}

// The layer's quantized tensors and groups, shapes checked.
struct Packed {
  std::string_view qweight, qzeros;
  std::vector<float> scales;  // [groups, out]
  std::vector<int32_t> gIdx;  // [in] (GPT-Q)
  int64_t groups = 0;
};

StatusOr<std::vector<float>> readScales(const WeightStore& store, const std::string& name,
                                        int64_t groups, int64_t out) {
  TG_ASSIGN_OR_RETURN(std::string_view bytes,
                      store.raw(name, {"F16", "BF16", "F32"}, {groups, out}));
  const std::string& dtype = store.info(name)->dtype;
  std::vector<float> s(static_cast<size_t>(groups * out));
  for (size_t i = 0; i < s.size(); ++i) {
    if (dtype == "F32") {
      std::memcpy(&s[i], bytes.data() + 4 * i, 4);
      continue;
    }
    uint16_t h;
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    s[i] = dtype == "F16" ? kernels::f16ToFloat(h) : kernels::bf16ToFloat(h);
  }
  return s;
}

// Inputs per group: the config's, or all of them; it must divide the inputs.
StatusOr<int64_t> groupsOf(const QuantizationConfig& c, const std::string& prefix, int64_t in) {
  const int64_t g = c.groupSize > 0 ? c.groupSize : in;
  if (in % g != 0)
    return invalidArgumentError("config.json: 'quantization_config.group_size' (" +
                                std::to_string(g) + ") does not divide the " + std::to_string(in) +
                                " inputs of '" + prefix + "'");
  return in / g;
}

StatusOr<Packed> readGptq(const WeightStore& store, const QuantizationConfig& c,
                          const std::string& prefix, int64_t out, int64_t in) {
  const int pack = 32 / c.bits;
  if (in % pack != 0 || out % pack != 0)
    return invalidArgumentError("'" + prefix + ".qweight': the layer's [" + std::to_string(out) +
                                ", " + std::to_string(in) +
                                "] does not pack into 32-bit words of " + std::to_string(c.bits) +
                                "-bit values");
  Packed p;
  TG_ASSIGN_OR_RETURN(p.groups, groupsOf(c, prefix, in));
  TG_ASSIGN_OR_RETURN(p.qweight, store.raw(prefix + ".qweight", {"I32"}, {in / pack, out}));
  TG_ASSIGN_OR_RETURN(p.qzeros, store.raw(prefix + ".qzeros", {"I32"}, {p.groups, out / pack}));
  TG_ASSIGN_OR_RETURN(p.scales, readScales(store, prefix + ".scales", p.groups, out));
  const std::string gName = prefix + ".g_idx";
  p.gIdx.resize(static_cast<size_t>(in));
  if (!store.contains(gName)) {
    // As the libraries do: g_idx is read whenever the checkpoint has it; act-order needs it.
    if (c.descAct)
      return notFoundError("weight '" + gName +
                           "' not found in the checkpoint: quantization_config.desc_act needs "
                           "each input's group");
    for (int64_t i = 0; i < in; ++i) p.gIdx[i] = static_cast<int32_t>(i / (in / p.groups));
    return p;
  }
  TG_ASSIGN_OR_RETURN(std::string_view g, store.raw(gName, {"I32"}, {in}));
  for (int64_t i = 0; i < in; ++i) {
    const auto v = static_cast<int32_t>(wordAt(g, i));
    if (v < 0 || v >= p.groups)
      return invalidArgumentError("weight '" + gName + "': input " + std::to_string(i) +
                                  " is in group " + std::to_string(v) + ", outside the " +
                                  std::to_string(p.groups) + " groups");
    p.gIdx[i] = v;
  }
  return p;
}

StatusOr<Packed> readAwq(const WeightStore& store, const QuantizationConfig& c,
                         const std::string& prefix, int64_t out, int64_t in) {
  if (out % 8 != 0)
    return invalidArgumentError("'" + prefix + ".qweight': the layer's " + std::to_string(out) +
                                " outputs do not pack into 32-bit words of 4-bit values");
  Packed p;
  TG_ASSIGN_OR_RETURN(p.groups, groupsOf(c, prefix, in));
  TG_ASSIGN_OR_RETURN(p.qweight, store.raw(prefix + ".qweight", {"I32"}, {in, out / 8}));
  if (c.zeroPoint) {
    TG_ASSIGN_OR_RETURN(p.qzeros, store.raw(prefix + ".qzeros", {"I32"}, {p.groups, out / 8}));
  }
  TG_ASSIGN_OR_RETURN(p.scales, readScales(store, prefix + ".scales", p.groups, out));
  return p;
}

// The layer's codes, zeros and scales per output ([out, groups]); g_idx kept when it is not the
// plain i / group_size.
QuantizedTensor unpackGptq(const QuantizationConfig& c, Packed p, int64_t out, int64_t in) {
  const int bits = c.bits, pack = 32 / bits;
  const uint32_t mask = (1u << bits) - 1;
  QuantizedTensor q;
  q.code = bits == 4 ? kernels::QuantCode::kUint4 : kernels::QuantCode::kUint8;
  q.out = out;
  q.in = in;
  q.groups = p.groups;
  q.groupSize = in / p.groups;
  q.codes.resize(static_cast<size_t>(out * in));
  q.scales.resize(static_cast<size_t>(out * p.groups));
  q.zeros.resize(q.scales.size());
  parallelFor(in, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t o = 0; o < out; ++o)
        q.codes[o * in + i] =
            static_cast<uint8_t>(field(wordAt(p.qweight, (i / pack) * out + o), i % pack, bits));
  });
  for (int64_t g = 0; g < p.groups; ++g) {
    for (int64_t o = 0; o < out; ++o) {
      uint32_t z = field(wordAt(p.qzeros, g * (out / pack) + o / pack), o % pack, bits);
      if (c.zerosMinusOne) z = (z + 1) & mask;
      q.zeros[o * p.groups + g] = static_cast<uint8_t>(z);
      q.scales[o * p.groups + g] = p.scales[g * out + o];
    }
  }
  for (int64_t i = 0; i < in; ++i) {
    if (p.gIdx[i] != i / q.groupSize) {
      q.gIdx = std::move(p.gIdx);
      break;
    }
  }
  return q;
}

QuantizedTensor unpackAwq(const QuantizationConfig& c, const Packed& p, int64_t out, int64_t in) {
  const int64_t words = out / 8;
  QuantizedTensor q;
  q.code = kernels::QuantCode::kUint4;
  q.out = out;
  q.in = in;
  q.groups = p.groups;
  q.groupSize = in / p.groups;
  q.codes.resize(static_cast<size_t>(out * in));
  q.scales.resize(static_cast<size_t>(out * p.groups));
  q.zeros.resize(q.scales.size());
  for (int64_t i = 0; i < in; ++i)
    for (int64_t o = 0; o < out; ++o)
      q.codes[o * in + i] =
          static_cast<uint8_t>(field(wordAt(p.qweight, i * words + o / 8), kAwqNibble[o % 8], 4));
  for (int64_t g = 0; g < p.groups; ++g) {
    for (int64_t o = 0; o < out; ++o) {
      q.zeros[o * p.groups + g] = static_cast<uint8_t>(
          c.zeroPoint ? field(wordAt(p.qzeros, g * words + o / 8), kAwqNibble[o % 8], 4)
                      : 1u << (c.bits - 1));
      q.scales[o * p.groups + g] = p.scales[g * out + o];
    }
  }
  return q;
}

// Marlin (IST-DASLab's Layer.pack; loader/marlin.h): B int32 [in / 16, out * 2], s [groups, out].
StatusOr<QuantizedTensor> readMarlin(const WeightStore& store, const QuantizationConfig& c,
                                     const std::string& prefix, int64_t out, int64_t in) {
  if (in % kMarlinTile != 0 || out % 64 != 0)
    return invalidArgumentError("'" + prefix + ".B': the layer's [" + std::to_string(out) + ", " +
                                std::to_string(in) +
                                "] (outputs, inputs) does not fit Marlin's layout, which needs "
                                "inputs divisible by 16 and outputs by 64");
  TG_ASSIGN_OR_RETURN(const int64_t groups, groupsOf(c, prefix, in));
  TG_ASSIGN_OR_RETURN(std::string_view b,
                      store.raw(prefix + ".B", {"I32"}, {in / kMarlinTile, out * 2}));
  TG_ASSIGN_OR_RETURN(std::vector<float> s, readScales(store, prefix + ".s", groups, out));
  return unpackMarlin(b, s, out, in, groups);
}

// A float32/float16/bfloat16 tensor of any shape (checked by the caller) as float32.
StatusOr<std::vector<float>> readFloats(const WeightStore& store, const std::string& name,
                                        const std::vector<int64_t>& shape) {
  TG_ASSIGN_OR_RETURN(std::string_view bytes, store.raw(name, {"F32", "F16", "BF16"}, shape));
  const std::string& dtype = store.info(name)->dtype;
  const size_t es = dtype == "F32" ? 4 : 2;
  std::vector<float> v(bytes.size() / es);
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == "F32") {
      std::memcpy(&v[i], bytes.data() + 4 * i, 4);
      continue;
    }
    uint16_t h;
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    v[i] = dtype == "F16" ? kernels::f16ToFloat(h) : kernels::bf16ToFloat(h);
  }
  return v;
}

std::string shapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t k = 0; k < shape.size(); ++k) s += (k ? ", " : "") + std::to_string(shape[k]);
  return s + "]";
}

// fp8 (vLLM / AutoFP8 / TGI / compressed-tensors) "<prefix>.":
//   weight       F8_E4M3 [out, in]
//   weight_scale F32 (or F16/BF16) [] or [1]: per tensor; [out] or [out, 1]: per output channel
//   input_scale  F32 (or F16/BF16) [] or [1]: the static activation scale (activation_scheme
//                "static"; ignored when dynamic)
// w[o, i] = e4m3(weight[o, i]) * weight_scale[o or 0].
StatusOr<QuantizedTensor> readFp8(const WeightStore& store, const QuantizationConfig& c,
                                  const std::string& prefix, int64_t out, int64_t in) {
  TG_ASSIGN_OR_RETURN(std::string_view codes,
                      store.raw(prefix + ".weight", {"F8_E4M3"}, {out, in}));
  const std::string scaleName = prefix + ".weight_scale";
  const TensorInfo* si = store.info(scaleName);
  if (si == nullptr)
    return notFoundError("weight '" + scaleName +
                         "' not found in the checkpoint: an fp8 layer needs its weight scale");
  const std::vector<int64_t>& ss = si->shape;
  const bool perTensor = ss.empty() || (ss.size() == 1 && ss[0] == 1);
  const bool perChannel =
      (ss.size() == 1 && ss[0] == out) || (ss.size() == 2 && ss[0] == out && ss[1] == 1);
  if (!perTensor && !perChannel)
    return invalidArgumentError("weight '" + scaleName + "' has shape " + shapeText(ss) +
                                ": expected [], [1] (per tensor), [" + std::to_string(out) +
                                "] or [" + std::to_string(out) +
                                ", 1] (per channel); block-wise scales are not supported");
  TG_ASSIGN_OR_RETURN(std::vector<float> scale, readFloats(store, scaleName, ss));
  for (float v : scale)
    if (!std::isfinite(v) || v < 0)
      return invalidArgumentError("weight '" + scaleName + "' holds " + std::to_string(v) +
                                  ": a weight scale must be finite and non-negative");
  QuantizedTensor q;
  q.code = kernels::QuantCode::kFp8E4M3;
  q.act = c.fp8Activations == QuantizationConfig::Fp8Activations::kNone ? kernels::ActQuant::kNone
                                                                        : kernels::ActQuant::kFp8;
  q.out = out;
  q.in = in;
  q.groupSize = in;
  q.groups = 1;
  q.perTensorScale = perTensor;
  q.scales.resize(static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o) q.scales[o] = scale[perTensor ? 0 : o];
  q.codes.assign(codes.begin(), codes.end());
  for (int64_t k = 0; k < out * in; ++k)
    if ((q.codes[k] & 0x7f) == 0x7f)
      return invalidArgumentError("weight '" + prefix + ".weight': element " + std::to_string(k) +
                                  " is an fp8 NaN");
  if (c.fp8Activations != QuantizationConfig::Fp8Activations::kStatic) return q;
  const std::string inName = prefix + ".input_scale";
  const TensorInfo* ii = store.info(inName);
  if (ii == nullptr)
    return notFoundError("weight '" + inName +
                         "' not found in the checkpoint: quantization_config's static activation "
                         "scheme needs each layer's input scale");
  if (!(ii->shape.empty() || (ii->shape.size() == 1 && ii->shape[0] == 1)))
    return invalidArgumentError("weight '" + inName + "' has shape " + shapeText(ii->shape) +
                                ": expected [] or [1] (one scale per tensor)");
  TG_ASSIGN_OR_RETURN(std::vector<float> is, readFloats(store, inName, ii->shape));
  if (!std::isfinite(is[0]) || is[0] <= 0)
    return invalidArgumentError("weight '" + inName + "' holds " + std::to_string(is[0]) +
                                ": an input scale must be finite and positive");
  q.inputScale = is[0];
  return q;
}

}  // namespace

std::string quantizedPrefix(const std::string& weightName) {
  constexpr std::string_view kWeight = ".weight";
  if (weightName.ends_with(kWeight))
    return weightName.substr(0, weightName.size() - kWeight.size());
  return weightName;
}

StatusOr<QuantizedTensor> readQuantizedLinear(const WeightStore& store,
                                              const QuantizationConfig& config,
                                              const std::string& prefix, int64_t out, int64_t in) {
  if (out <= 0 || in <= 0)
    return invalidArgumentError("'" + prefix + "': a quantized layer needs a positive shape");
  switch (config.method) {
    case QuantMethod::kGptq: {
      TG_ASSIGN_OR_RETURN(Packed p, readGptq(store, config, prefix, out, in));
      return unpackGptq(config, std::move(p), out, in);
    }
    case QuantMethod::kAwq: {
      TG_ASSIGN_OR_RETURN(Packed p, readAwq(store, config, prefix, out, in));
      return unpackAwq(config, p, out, in);
    }
    case QuantMethod::kFp8: return readFp8(store, config, prefix, out, in);
    case QuantMethod::kMarlin: return readMarlin(store, config, prefix, out, in);
    case QuantMethod::kNone: break;
  }
  return invalidArgumentError("weight '" + prefix + ".qweight' is a pre-quantized layer, but " +
                              "config.json has no quantization_config");
}

StatusOr<Tensor> dequantizeLinear(const WeightStore& store, const QuantizationConfig& config,
                                  const std::string& prefix, int64_t out, int64_t in, DType dtype) {
  TG_ASSIGN_OR_RETURN(QuantizedTensor q, readQuantizedLinear(store, config, prefix, out, in));
  return dequantize(q, dtype);
}

}  // namespace textgen::runtime
