// A graph's weights for this rank: tensors read in the compute dtype, sliced for the rank's share
// (layers/partition.h) and uploaded to backend memory, several stacked into one operand along the
// first dimension where one GEMM serves them (q/k/v, gate/up).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "layers/partition.h"
#include "loader/load_quantizer.h"
#include "loader/quantized_tensor.h"
#include "textgen/runtime/backend.h"
#include "textgen/runtime/model_config.h"
#include "textgen/runtime/weights.h"

namespace textgen::runtime {

// A weight's bias tensor: "x.weight" -> "x.bias" (Hugging Face's nn.Linear names).
std::string biasName(const std::string& weight);

// Rows of a fused tensor that make up one part: in each group of `period` rows along dimension 0,
// rows [offset, offset + take). Fused QKV layouts are such views: [q; k; v] (one group), one
// [q; k; v] per head (GPT-NeoX, BLOOM), one [q x heads per group; k; v] per key/value head
// (Falcon's new architecture). period 0: the whole tensor.
struct RowSelect {
  int64_t period = 0, offset = 0, take = 0;
};

class WeightLoader {
 public:
  struct Part {
    std::string name;
    std::vector<int64_t> shape;  // the whole tensor's, checked against the checkpoint
    Shard shard;                 // applied to the selected rows (no padding with a selection)
    RowSelect select = {};
  };

  WeightLoader(const WeightStore& store, Backend& backend, DType dtype, const ModelConfig& config,
               const Partition& partition, LoadQuantization quantize = LoadQuantization::kNone)
      : store_(store),
        backend_(backend),
        dtype_(dtype),
        config_(config),
        partition_(partition),
        quantize_(quantize) {}

  // The parts' slices stacked in order: NOT_FOUND / INVALID_ARGUMENT naming a missing or
  // misshapen tensor. A part "x.weight" the checkpoint holds as a pre-quantized layer ("x.qweight",
  // ...: loader/dequantize.h) is dequantized whole on the host, then sliced like a dense one.
  StatusOr<std::unique_ptr<Buffer>> upload(const std::vector<Part>& parts) const;
  // The same, each element multiplied by `scale` in float32 before it is rounded to the compute
  // dtype (a weight that folds a constant factor: T5's scaled decoder output).
  StatusOr<std::unique_ptr<Buffer>> upload(const std::vector<Part>& parts, float scale) const;
  // Values computed on the host at load (ALiBi slopes), fp32 whatever the compute dtype.
  StatusOr<std::unique_ptr<Buffer>> uploadF32(const std::vector<float>& values) const;
  // One part's slice for this rank on the host in float32 (tables read at load: T5's relative
  // position bias, whose head columns a rank keeps).
  StatusOr<Tensor> hostF32(const Part& p) const { return hostSlice(p, DType::kF32); }
  // A dense linear layer from `parts` stacked along the outputs (each part's slice [out_i, in]),
  // split as `split`. A layer the checkpoint stores pre-quantized keeps its format (packed into the
  // kernels' runtime layout: WeightFormat::kQuantized), as does every layer but the logits head
  // under a load-time --quantize; pre-quantized parts that cannot stack into one layout are
  // dequantized. With `withBias`, each part's bias (biasName: [out_i]) is stacked the same
  // way: a column-parallel layer's sliced like its rows; a row-parallel layer's outputs are summed
  // over ranks, so its whole bias is held by rank 0 alone (added once, before the all-reduce).
  // Every rank checks the bias tensors: a missing or misshapen one is an error naming it.
  StatusOr<Linear> linear(const std::vector<Part>& parts, SplitKind split,
                          bool withBias = false) const;
  bool contains(const std::string& name) const { return store_.contains(name); }

  const ModelConfig& config() const { return config_; }
  const Partition& partition() const { return partition_; }
  DType dtype() const { return dtype_; }

 private:
  // `name` ("x.weight") is absent and "x.qweight" present ("x.B" for Marlin; fp8: stored F8_E4M3).
  bool quantized(const std::string& name) const;
  StatusOr<Tensor> dequantized(const Part& p) const;
  // The part's slice for this rank on the host in `dtype` (dequantized when pre-quantized).
  StatusOr<Tensor> hostSlice(const Part& p, DType dtype) const;
  // A pre-quantized part's slice for this rank, in its own format.
  StatusOr<QuantizedTensor> quantizedSlice(const Part& p) const;
  // The parts' slices for this rank stacked along the outputs, each row where the checkpoint's
  // mapping holds it (a padded shard's slice loaded whole into `owned`): --quantize's input.
  struct HostRows {
    WeightRows rows;
    std::vector<Tensor> owned;
  };
  StatusOr<HostRows> stackedRows(const std::vector<Part>& parts) const;
  // The layer quantized (pre-quantized or --quantize) in the kernels' runtime layout, or
  // nullopt: dense.
  StatusOr<std::optional<PackedQuantized>> quantizedLinear(const std::vector<Part>& parts,
                                                           SplitKind split) const;
  Status uploadQuantized(const PackedQuantized& q, Linear& l) const;

  const WeightStore& store_;
  Backend& backend_;
  DType dtype_;
  const ModelConfig& config_;
  const Partition& partition_;
  LoadQuantization quantize_;
};

}  // namespace textgen::runtime
