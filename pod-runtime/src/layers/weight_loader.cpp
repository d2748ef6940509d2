#include "layers/weight_loader.h"

namespace textgen::runtime {

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

}  // namespace textgen::runtime
