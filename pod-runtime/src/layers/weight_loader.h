// A graph's weights for this rank: tensors read in the compute dtype, sliced for the rank's share
// (layers/partition.h) and uploaded to backend memory, several stacked into one operand along the
// first dimension where one GEMM serves them (q/k/v, gate/up).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "layers/partition.h"
#include "textgen/runtime/backend.h"
#include "textgen/runtime/model_config.h"
#include "textgen/runtime/weights.h"

namespace textgen::runtime {

class WeightLoader {
 public:
  struct Part {
    std::string name;
    std::vector<int64_t> shape;  // the whole tensor's, checked against the checkpoint
    Shard shard;
  };

  WeightLoader(const WeightStore& store, Backend& backend, DType dtype, const ModelConfig& config,
               const Partition& partition)
      : store_(store), backend_(backend), dtype_(dtype), config_(config), partition_(partition) {}

  // The parts' slices stacked in order: NOT_FOUND / INVALID_ARGUMENT naming a missing or
  // misshapen tensor.
  StatusOr<std::unique_ptr<Buffer>> upload(const std::vector<Part>& parts) const;
  // A dense linear layer from `parts` stacked along the outputs (each part's slice [out_i, in]),
  // split as `split`, with the bias tensors' slices stacked the same way when given (one per part).
  StatusOr<Linear> linear(const std::vector<Part>& parts, SplitKind split,
                          const std::vector<Part>& bias = {}) const;
  bool contains(const std::string& name) const { return store_.contains(name); }

  const ModelConfig& config() const { return config_; }
  const Partition& partition() const { return partition_; }
  DType dtype() const { return dtype_; }

 private:
  const WeightStore& store_;
  Backend& backend_;
  DType dtype_;
  const ModelConfig& config_;
  const Partition& partition_;
};

}  // namespace textgen::runtime
