// The weights of a model directory: model.safetensors, or the shards named by
// model.safetensors.index.json. Tensors load in the compute dtype, whole or as one tensor-parallel
// rank's slice.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "textgen/base/status_or.h"
#include "textgen/runtime/safetensors.h"
#include "textgen/runtime/tensor.h"

namespace textgen::runtime {

// A tensor-parallel slice: rank `rank` of `worldSize` equal parts along dimension `dim`. With
// `pad`, a dimension that does not divide gives parts of ceil(size / worldSize), the last ones
// completed with zeros (a vocabulary split over ranks).
struct Shard {
  int dim = 0;
  int rank = 0;
  int worldSize = 1;
  bool pad = false;
};

class WeightStore {
 public:
  static StatusOr<std::unique_ptr<WeightStore>> open(const std::string& modelDir);
  // One safetensors file's tensors (Medusa's medusa_lm_head.safetensors).
  static StatusOr<std::unique_ptr<WeightStore>> openFile(const std::string& path);

  bool contains(const std::string& name) const { return where_.contains(name); }
  const TensorInfo* info(const std::string& name) const;
  // Every tensor name of the checkpoint, sorted.
  std::vector<std::string> names() const;

  // NOT_FOUND naming the tensor; INVALID_ARGUMENT for a shape other than `expectShape` (when given)
  // or a dtype other than F32/F16/BF16.
  StatusOr<Tensor> loadF32(const std::string& name, const std::vector<int64_t>& expectShape = {},
                           Shard shard = {}) const {
    return load(name, DType::kF32, expectShape, shard);
  }
  // The same, converted to `dtype` (round to nearest even, as torch's .to() does).
  StatusOr<Tensor> load(const std::string& name, DType dtype,
                        const std::vector<int64_t>& expectShape = {}, Shard shard = {}) const;
  // A tensor's bytes as stored (a view of the mapping), for packed formats read element by
  // element: NOT_FOUND naming the tensor; INVALID_ARGUMENT for a dtype not among `dtypes` ("I32",
  // "F16", ...), a shape other than `expectShape`, or a byte size that does not match them.
  StatusOr<std::string_view> raw(const std::string& name, const std::vector<std::string>& dtypes,
                                 const std::vector<int64_t>& expectShape) const;

 private:
  static StatusOr<std::unique_ptr<WeightStore>> openFiles(const std::vector<std::string>& paths);

  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<const SafetensorsFile*, const TensorInfo*>> where_;
};

}  // namespace textgen::runtime
