#include "layers/weight_loader.h"

#include <cstring>
#include <string_view>

#include "loader/dequantize.h"
#include "loader/quantized_tensor.h"
#include "textgen/kernels/half.h"

namespace textgen::runtime {

std::string biasName(const std::string& weight) {
  constexpr std::string_view kWeight = ".weight";
  if (weight.size() >= kWeight.size() && weight.ends_with(kWeight))
    return weight.substr(0, weight.size() - kWeight.size()) + ".bias";
  return weight + ".bias";
}

namespace {

// The part's shape once its rows are selected (before the shard).
std::vector<int64_t> selectedShape(const WeightLoader::Part& p) {
  std::vector<int64_t> shape = p.shape;
  if (p.select.period > 0 && !shape.empty()) shape[0] = shape[0] / p.select.period * p.select.take;
  return shape;
}

// Which rows and columns of the whole tensor this rank takes: the rows `p.select` names, then
// this rank's shard of them.
struct Slice {
  std::vector<int64_t> rows;  // source rows, in order
  int64_t c0 = 0, cols = 0;   // columns [c0, c0 + cols) of each
};

StatusOr<Slice> sliceOf(const WeightLoader::Part& p, const std::vector<int64_t>& shape,
                        int64_t inner) {
  const RowSelect& s = p.select;
  if (shape.empty() || s.period <= 0 || shape[0] % s.period != 0 || s.offset < 0 || s.take <= 0 ||
      s.offset + s.take > s.period)
    return invalidArgumentError("weight '" + p.name + "': rows " + std::to_string(s.offset) + "+" +
                                std::to_string(s.take) + " of every " + std::to_string(s.period) +
                                " do not fit its " + std::to_string(shape.empty() ? 0 : shape[0]) +
                                " rows");
  const Shard& sh = p.shard;
  const std::vector<int64_t> sel = selectedShape(p);
  if (sh.pad ||
      (sh.worldSize > 1 && (sh.dim < 0 || sh.dim > 1 || static_cast<size_t>(sh.dim) >= sel.size() ||
                            sel[sh.dim] % sh.worldSize != 0)))
    return invalidArgumentError("weight '" + p.name + "': the selected rows (" +
                                std::to_string(sel[0]) + ") do not split across " +
                                std::to_string(sh.worldSize) + " ranks");
  // Rows [r0, r0 + rows) of the selection, columns [c0, c0 + cols) of each.
  int64_t r0 = 0, rows = sel[0];
  Slice out;
  out.cols = inner;
  if (sh.worldSize > 1 && sh.dim == 0) {
    rows = sel[0] / sh.worldSize;
    r0 = sh.rank * rows;
  } else if (sh.worldSize > 1) {
    out.cols = inner / sh.worldSize;
    out.c0 = sh.rank * out.cols;
  }
  out.rows.resize(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = r0 + r;  // index among the selected rows
    out.rows[r] = i / s.take * s.period + s.offset + i % s.take;
  }
  return out;
}

// Every row selected when the part selects none.
WeightLoader::Part selectingAll(WeightLoader::Part p) {
  if (p.select.period <= 0 && !p.shape.empty()) p.select = {p.shape[0], 0, p.shape[0]};
  return p;
}

StatusOr<Tensor> selectRows(const WeightLoader::Part& p, const Tensor& whole) {
  const std::vector<int64_t>& shape = whole.shape();
  const int64_t inner = shape.empty() || shape[0] == 0 ? 0 : whole.numel() / shape[0];
  TG_ASSIGN_OR_RETURN(const Slice sl, sliceOf(p, shape, inner));
  const size_t es = kernels::dtypeSize(whole.dtype());
  std::vector<int64_t> outShape = shape;
  outShape[0] = static_cast<int64_t>(sl.rows.size());
  if (outShape.size() > 1) outShape[1] = outShape[1] / (inner / sl.cols);
  Tensor out(whole.dtype(), outShape);
  const auto* src = static_cast<const unsigned char*>(whole.data());
  auto* dst = static_cast<unsigned char*>(out.data());
  for (size_t r = 0; r < sl.rows.size(); ++r)
    std::memcpy(dst + r * sl.cols * es, src + (sl.rows[r] * inner + sl.c0) * es, sl.cols * es);
  return out;
}

}  // namespace

bool WeightLoader::quantized(const std::string& name) const {
  if (config_.quantization.method == QuantMethod::kFp8) {
    // fp8 keeps the dense name: the layers stored as float8 (not the head, embeddings or the
    // checkpoint's ignored layers, which stay in 16 bits).
    const TensorInfo* info = store_.info(name);
    return info != nullptr && info->dtype == "F8_E4M3";
  }
  // Marlin's packed codes are "x.B"; GPT-Q's and AWQ's "x.qweight".
  const char* codes = config_.quantization.method == QuantMethod::kMarlin ? ".B" : ".qweight";
  return !store_.contains(name) && store_.contains(quantizedPrefix(name) + codes);
}

StatusOr<Tensor> WeightLoader::dequantized(const Part& p) const {
  if (p.shape.size() != 2)
    return invalidArgumentError("weight '" + p.name + "': a quantized tensor must be 2-D");
  TG_ASSIGN_OR_RETURN(Tensor whole,
                      dequantizeLinear(store_, config_.quantization, quantizedPrefix(p.name),
                                       p.shape[0], p.shape[1], dtype_));
  return selectRows(selectingAll(p), whole);
}

StatusOr<QuantizedTensor> WeightLoader::quantizedSlice(const Part& p) const {
  if (p.shape.size() != 2)
    return invalidArgumentError("weight '" + p.name + "': a quantized tensor must be 2-D");
  TG_ASSIGN_OR_RETURN(QuantizedTensor q,
                      readQuantizedLinear(store_, config_.quantization, quantizedPrefix(p.name),
                                          p.shape[0], p.shape[1]));
  TG_RETURN_IF_ERROR(validate(q, quantizedPrefix(p.name)));
  TG_ASSIGN_OR_RETURN(const Slice sl, sliceOf(selectingAll(p), p.shape, p.shape[1]));
  q = takeRows(q, sl.rows);
  if (sl.cols != q.in) q = takeColumns(q, sl.c0, sl.cols);
  return q;
}

StatusOr<Tensor> WeightLoader::hostSlice(const Part& p, DType dtype) const {
  if (quantized(p.name)) {
    if (dtype == dtype_) return dequantized(p);
    return invalidArgumentError("weight '" + p.name + "': a pre-quantized layer is not re-read");
  }
  if (p.select.period > 0) {
    TG_ASSIGN_OR_RETURN(Tensor whole, store_.load(p.name, dtype, p.shape));
    return selectRows(p, whole);
  }
  return store_.load(p.name, dtype, p.shape, p.shard);
}

StatusOr<std::unique_ptr<Buffer>> WeightLoader::upload(const std::vector<Part>& parts) const {
  std::vector<Tensor> tensors;
  size_t total = 0;
  for (const Part& p : parts) {
    TG_ASSIGN_OR_RETURN(Tensor t, hostSlice(p, dtype_));
    total += t.bytes();
    tensors.push_back(std::move(t));
  }
  TG_ASSIGN_OR_RETURN(auto buf, backend_.allocate(total));
  size_t offset = 0;
  for (const Tensor& t : tensors) {
    TG_RETURN_IF_ERROR(backend_.upload(*buf, t.data(), t.bytes(), offset));
    offset += t.bytes();
  }
  // Host tensors are freed on return; pageable uploads are staged before upload() returns.
  return buf;
}

StatusOr<std::unique_ptr<Buffer>> WeightLoader::upload(const std::vector<Part>& parts,
                                                       float scale) const {
  if (scale == 1.0f) return upload(parts);
  std::vector<float> values;
  for (const Part& p : parts) {
    TG_ASSIGN_OR_RETURN(Tensor t, hostSlice(p, DType::kF32));
    values.insert(values.end(), t.f32(), t.f32() + t.numel());
  }
  for (float& v : values) v *= scale;
  if (dtype_ == DType::kF32) return uploadF32(values);
  std::vector<uint16_t> half(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    half[i] =
        dtype_ == DType::kF16 ? kernels::floatToF16(values[i]) : kernels::floatToBf16(values[i]);
  }
  TG_ASSIGN_OR_RETURN(auto buf, backend_.allocate(half.size() * sizeof(uint16_t)));
  TG_RETURN_IF_ERROR(backend_.upload(*buf, half.data(), half.size() * sizeof(uint16_t)));
  return buf;
}

StatusOr<std::unique_ptr<Buffer>> WeightLoader::uploadF32(const std::vector<float>& values) const {
  const size_t bytes = values.size() * sizeof(float);
  TG_ASSIGN_OR_RETURN(auto buf, backend_.allocate(bytes));
  TG_RETURN_IF_ERROR(backend_.upload(*buf, values.data(), bytes));
  return buf;
}

StatusOr<Linear> WeightLoader::linear(const std::vector<Part>& parts, SplitKind split,
                                      bool withBias) const {
  if (parts.empty()) return invalidArgumentError("a linear layer needs a weight");
  Linear l;
  l.format = WeightFormat::kDense;
  l.dtype = dtype_;
  l.split = split;
  for (const Part& p : parts) {
    if (!store_.contains(p.name) && !quantized(p.name))
      return notFoundError("weight '" + p.name + "' not found in the checkpoint");
    if (p.shape.size() != 2)
      return invalidArgumentError("weight '" + p.name + "' of a linear layer must be 2-D");
    // This rank's share of the part: the split dimension divided (padded when the shard pads).
    auto part = [&](int64_t size, int dim) {
      if (p.shard.dim != dim || p.shard.worldSize == 1) return size;
      return (size + p.shard.worldSize - 1) / p.shard.worldSize;
    };
    const std::vector<int64_t> shape = selectedShape(p);
    const int64_t in = part(shape[1], 1);
    if (l.in != 0 && l.in != in)
      return invalidArgumentError("weight '" + p.name + "': stacked parts differ in inputs");
    l.in = in;
    l.out += part(shape[0], 0);
  }
  TG_ASSIGN_OR_RETURN(std::optional<PackedQuantized> q, quantizedLinear(parts, split));
  if (q) {
    if (q->out != l.out || q->in != l.in)
      return internalError("'" + parts[0].name +
                           "': the quantized slices do not match the layer's shape");
    TG_RETURN_IF_ERROR(uploadQuantized(*q, l));
  } else {
    TG_ASSIGN_OR_RETURN(l.owned, upload(parts));
    l.weight = l.owned.get();
    if (l.owned->bytes() != static_cast<size_t>(l.in * l.out) * kernels::dtypeSize(dtype_))
      return internalError("'" + parts[0].name +
                           "': the loaded slices do not match the layer's shape");
  }
  if (!withBias) return l;
  std::vector<Part> bias;
  for (const Part& p : parts) {
    // [out_i]: a column-parallel part's slice of its rows (its shard on dimension 0), else whole.
    const Shard shard = p.shard.dim == 0 ? p.shard : Shard{};
    bias.push_back({biasName(p.name), {p.shape[0]}, shard, p.select});
  }
  TG_ASSIGN_OR_RETURN(auto b, upload(bias));
  if (b->bytes() != static_cast<size_t>(l.out) * kernels::dtypeSize(dtype_))
    return internalError("'" + bias[0].name + "': the loaded slices do not match the outputs");
  if (split != SplitKind::kRow || partition_.rank == 0) l.bias = std::move(b);
  return l;
}

}  // namespace textgen::runtime

namespace textgen::runtime {

StatusOr<WeightLoader::HostRows> WeightLoader::stackedRows(const std::vector<Part>& parts) const {
  HostRows h;
  for (size_t k = 0; k < parts.size(); ++k) {
    const Part& p = parts[k];
    int64_t cols = 0;
    if (p.shard.pad) {
      TG_ASSIGN_OR_RETURN(Tensor t, hostSlice(p, DType::kF32));
      cols = t.dim(1);
      for (int64_t r = 0; r < t.dim(0); ++r)
        h.rows.rows.push_back({t.f32() + r * cols, WeightRows::Type::kF32});
      h.owned.push_back(std::move(t));
    } else {
      TG_ASSIGN_OR_RETURN(const std::string_view bytes,
                          store_.raw(p.name, {"F32", "F16", "BF16"}, p.shape));
      const std::string& dtype = store_.info(p.name)->dtype;
      const WeightRows::Type type = dtype == "F32"    ? WeightRows::Type::kF32
                                    : dtype == "BF16" ? WeightRows::Type::kBF16
                                                      : WeightRows::Type::kF16;
      const int64_t es = dtype == "F32" ? 4 : 2, inner = p.shape[1];
      TG_ASSIGN_OR_RETURN(const Slice sl, sliceOf(selectingAll(p), p.shape, inner));
      cols = sl.cols;
      for (int64_t r : sl.rows)
        h.rows.rows.push_back({bytes.data() + (r * inner + sl.c0) * es, type});
    }
    if (k > 0 && cols != h.rows.cols)
      return invalidArgumentError("weight '" + p.name + "': stacked parts differ in inputs");
    h.rows.cols = cols;
  }
  return h;
}

StatusOr<std::optional<PackedQuantized>> WeightLoader::quantizedLinear(
    const std::vector<Part>& parts, SplitKind split) const {
  size_t preQuantized = 0;
  for (const Part& p : parts) preQuantized += quantized(p.name) ? 1 : 0;
  if (preQuantized > 0) {
    // The checkpoint's own format, sliced and stacked; parts that differ (a dense one beside
    // quantized ones, act-order parts with different g_idx) are dequantized instead.
    if (preQuantized != parts.size()) return std::optional<PackedQuantized>();
    std::vector<QuantizedTensor> qs;
    for (const Part& p : parts) {
      TG_ASSIGN_OR_RETURN(QuantizedTensor q, quantizedSlice(p));
      qs.push_back(std::move(q));
    }
    auto stacked = stackOutputs(std::move(qs));
    if (!stacked.ok()) return std::optional<PackedQuantized>();
    return std::optional<PackedQuantized>(pack(*stacked));
  }
  if (quantize_ == LoadQuantization::kNone || split == SplitKind::kVocab)
    return std::optional<PackedQuantized>();
  // --quantize: this rank's stacked slice, quantized as one tensor (as TGI quantizes the weight
  // it loads for its rank), from the mapping straight into the runtime layout
  // (loader/load_quantizer.h).
  TG_ASSIGN_OR_RETURN(const HostRows h, stackedRows(parts));
  const std::string what = std::string(toString(quantize_)) + " '" + parts[0].name + "'";
  switch (quantize_) {
    case LoadQuantization::kBitsandbytesNf4:
    case LoadQuantization::kBitsandbytesFp4: {
      auto q = quantizeBnb4Packed(h.rows, quantize_ == LoadQuantization::kBitsandbytesNf4
                                              ? kernels::QuantCode::kNf4
                                              : kernels::QuantCode::kFp4);
      if (!q.ok()) return q.status().withContext(what);
      return std::optional<PackedQuantized>(std::move(*q));
    }
    case LoadQuantization::kBitsandbytes:
      return std::optional<PackedQuantized>(
          quantizeInt8Packed(h.rows, kernels::ActQuant::kLlmInt8));
    case LoadQuantization::kEetq:
      return std::optional<PackedQuantized>(quantizeInt8Packed(h.rows, kernels::ActQuant::kNone));
    case LoadQuantization::kFp8: return std::optional<PackedQuantized>(quantizeFp8Packed(h.rows));
    case LoadQuantization::kNone: break;
  }
  return std::optional<PackedQuantized>();
}

Status WeightLoader::uploadQuantized(const PackedQuantized& q, Linear& l) const {
  l.format = WeightFormat::kQuantized;
  auto put = [&](const void* data, size_t bytes) -> StatusOr<std::unique_ptr<Buffer>> {
    TG_ASSIGN_OR_RETURN(auto buf, backend_.allocate(bytes));
    TG_RETURN_IF_ERROR(backend_.upload(*buf, data, bytes));
    return buf;
  };
  TG_ASSIGN_OR_RETURN(l.owned, put(q.packed.data(), q.packed.size()));
  l.weight = l.owned.get();
  TG_ASSIGN_OR_RETURN(l.scales, put(q.scales.data(), q.scales.size() * sizeof(float)));
  kernels::QuantWeight& w = l.quant;
  w = {};
  w.code = q.code;
  w.packed = l.owned->data();
  w.scales = l.scales->as<float>();
  w.groupSize = q.groupSize;
  w.act = q.act;
  w.threshold = q.threshold;
  if (!q.zeros.empty()) {
    TG_ASSIGN_OR_RETURN(l.zeros, put(q.zeros.data(), q.zeros.size()));
    w.zeros = l.zeros->as<uint8_t>();
  }
  if (!q.perm.empty()) {
    TG_ASSIGN_OR_RETURN(l.perm, put(q.perm.data(), q.perm.size() * sizeof(int32_t)));
    w.perm = l.perm->as<int32_t>();
  }
  if (q.inputScale || q.tensorScale) {
    // Each scale 16-byte aligned (cuBLASLt's scale pointers).
    const float s[8] = {q.inputScale.value_or(0.0f), 0, 0, 0, q.tensorScale.value_or(0.0f)};
    TG_ASSIGN_OR_RETURN(l.fp8Scales, put(s, sizeof s));
    if (q.inputScale) w.inputScale = l.fp8Scales->as<float>();
    if (q.tensorScale) w.tensorScale = l.fp8Scales->as<float>() + 4;
  }
  return okStatus();
}

}  // namespace textgen::runtime
