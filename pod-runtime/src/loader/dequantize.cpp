#include "loader/dequantize.h"

#include <cstring>
#include <vector>

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
