#include "layers/weight_loader.h"

namespace textgen::runtime {

std::string biasName(const std::string& weight) {
  constexpr std::string_view kWeight = ".weight";
  if (weight.size() >= kWeight.size() && weight.ends_with(kWeight))
    return weight.substr(0, weight.size() - kWeight.size()) + ".bias";
  return weight + ".bias";
}

StatusOr<std::unique_ptr<Buffer>> WeightLoader::upload(const std::vector<Part>& parts) const {
  std::vector<Tensor> tensors;
  size_t total = 0;
  for (const Part& p : parts) {
    TG_ASSIGN_OR_RETURN(Tensor t, store_.load(p.name, dtype_, p.shape, p.shard));
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
    const TensorInfo* info = store_.info(p.name);
    if (!info) return notFoundError("weight '" + p.name + "' not found in the checkpoint");
    if (p.shape.size() != 2)
      return invalidArgumentError("weight '" + p.name + "' of a linear layer must be 2-D");
    // This rank's share of the part: the split dimension divided (padded when the shard pads).
    auto part = [&](int64_t size, int dim) {
      if (p.shard.dim != dim || p.shard.worldSize == 1) return size;
      return (size + p.shard.worldSize - 1) / p.shard.worldSize;
    };
    const int64_t in = part(p.shape[1], 1);
    if (l.in != 0 && l.in != in)
      return invalidArgumentError("weight '" + p.name + "': stacked parts differ in inputs");
    l.in = in;
    l.out += part(p.shape[0], 0);
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
    bias.push_back({biasName(p.name), {p.shape[0]}, shard});
  }
  TG_ASSIGN_OR_RETURN(auto b, upload(bias));
  if (b->bytes() != static_cast<size_t>(l.out) * kernels::dtypeSize(dtype_))
    return internalError("'" + bias[0].name + "': the loaded slices do not match the outputs");
  if (split != SplitKind::kRow || partition_.rank == 0) l.bias = std::move(b);
  return l;
}

}  // namespace textgen::runtime
