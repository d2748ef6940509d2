#include "layers/weight_loader.h"

#include <cstring>

#include "loader/dequantize.h"

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

// The rows `p.select` names of the whole tensor, then this rank's shard of them.
StatusOr<Tensor> selectRows(const WeightLoader::Part& p, const Tensor& whole) {
  const RowSelect& s = p.select;
  const std::vector<int64_t>& shape = whole.shape();
  if (shape.empty() || s.period <= 0 || shape[0] % s.period != 0 || s.offset < 0 || s.take <= 0 ||
      s.offset + s.take > s.period)
    return invalidArgumentError("weight '" + p.name + "': rows " + std::to_string(s.offset) + "+" +
                                std::to_string(s.take) + " of every " + std::to_string(s.period) +
                                " do not fit its " + std::to_string(shape.empty() ? 0 : shape[0]) +
                                " rows");
  const Shard& sh = p.shard;
  const std::vector<int64_t> sel = selectedShape(p);
  const int64_t inner = whole.numel() / shape[0];  // elements per row
  const size_t es = kernels::dtypeSize(whole.dtype());
  if (sh.pad ||
      (sh.worldSize > 1 && (sh.dim < 0 || sh.dim > 1 || static_cast<size_t>(sh.dim) >= sel.size() ||
                            sel[sh.dim] % sh.worldSize != 0)))
    return invalidArgumentError("weight '" + p.name + "': the selected rows (" +
                                std::to_string(sel[0]) + ") do not split across " +
                                std::to_string(sh.worldSize) + " ranks");
  // Rows [r0, r0 + rows) of the selection, columns [c0, c0 + cols) of each.
  int64_t r0 = 0, rows = sel[0], c0 = 0, cols = inner;
  if (sh.worldSize > 1 && sh.dim == 0) {
    rows = sel[0] / sh.worldSize;
    r0 = sh.rank * rows;
  } else if (sh.worldSize > 1) {
    cols = inner / sh.worldSize;
    c0 = sh.rank * cols;
  }
  std::vector<int64_t> outShape = sel;
  outShape[0] = rows;
  if (outShape.size() > 1) outShape[1] = outShape[1] / (inner / cols);
  Tensor out(whole.dtype(), outShape);
  const auto* src = static_cast<const unsigned char*>(whole.data());
  auto* dst = static_cast<unsigned char*>(out.data());
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = r0 + r;  // index among the selected rows
    const int64_t srcRow = i / s.take * s.period + s.offset + i % s.take;
    std::memcpy(dst + r * cols * es, src + (srcRow * inner + c0) * es, cols * es);
  }
  return out;
}

}  // namespace

bool WeightLoader::quantized(const std::string& name) const {
  return !store_.contains(name) && store_.contains(quantizedPrefix(name) + ".qweight");
}

StatusOr<Tensor> WeightLoader::dequantized(const Part& p) const {
  if (p.shape.size() != 2)
    return invalidArgumentError("weight '" + p.name + "': a quantized tensor must be 2-D");
  TG_ASSIGN_OR_RETURN(Tensor whole,
                      dequantizeLinear(store_, config_.quantization, quantizedPrefix(p.name),
                                       p.shape[0], p.shape[1], dtype_));
  // The dense path's slicing: every row selected when the part selects none.
  Part all = p;
  if (all.select.period <= 0) all.select = {p.shape[0], 0, p.shape[0]};
  return selectRows(all, whole);
}

StatusOr<std::unique_ptr<Buffer>> WeightLoader::upload(const std::vector<Part>& parts) const {
  std::vector<Tensor> tensors;
  size_t total = 0;
  for (const Part& p : parts) {
    Tensor t;
    if (quantized(p.name)) {
      TG_ASSIGN_OR_RETURN(t, dequantized(p));
    } else if (p.select.period > 0) {
      TG_ASSIGN_OR_RETURN(Tensor whole, store_.load(p.name, dtype_, p.shape));
      TG_ASSIGN_OR_RETURN(t, selectRows(p, whole));
    } else {
      TG_ASSIGN_OR_RETURN(t, store_.load(p.name, dtype_, p.shape, p.shard));
    }
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
  TG_ASSIGN_OR_RETURN(l.owned, upload(parts));
  l.weight = l.owned.get();
  if (l.owned->bytes() != static_cast<size_t>(l.in * l.out) * kernels::dtypeSize(dtype_))
    return internalError("'" + parts[0].name +
                         "': the loaded slices do not match the layer's shape");
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
