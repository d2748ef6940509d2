// A linear layer's weights as the loader builds them: the format (dense today; quantized formats
// add theirs), the dtype, this rank's [out, in] shape and how the layer is split over ranks, an
// optional bias, and for quantized formats the per-group scales and zero points. Backends take a
// Linear (Backend::linear), so a new weight format is a loader and a backend change, never a
// model's.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "textgen/kernels/dtype.h"
#include "textgen/kernels/quant_gemm.h"

namespace textgen::runtime {

class Buffer;

enum class WeightFormat {
  kDense,      // [out, in] in the compute dtype
  kQuantized,  // codes, scales and zero points in the kernels' runtime layout (quant_gemm.h)
};

constexpr std::string_view toString(WeightFormat f) {
  switch (f) {
    case WeightFormat::kDense: return "dense";
    case WeightFormat::kQuantized: return "quantized";
  }
  return "?";
}

// Megatron's splits: which dimension this rank holds a part of.
enum class SplitKind {
  kReplicated,  // the whole layer on every rank
  kColumn,      // a part of the outputs (rows of [out, in]): no communication after
  kRow,         // a part of the inputs (columns): the outputs are summed over ranks after
  kVocab,       // the embedding / head's part of the vocabulary, padded to equal parts
};

struct Linear {
  WeightFormat format = WeightFormat::kDense;
  kernels::DType dtype = kernels::DType::kF32;
  int64_t in = 0, out = 0;  // this rank's shape
  SplitKind split = SplitKind::kReplicated;
  // The weight: owned, or a view of another layer's (a head tied to the embedding).
  std::unique_ptr<Buffer> owned;
  Buffer* weight = nullptr;
  std::unique_ptr<Buffer> bias;  // [out] or none
  // kQuantized: `weight` holds the packed codes; `quant` the kernels' view, its pointers into
  // these buffers (scales and zero points per group of quant.groupSize inputs, the act-order
  // permutation, the static fp8 scales).
  std::unique_ptr<Buffer> scales, zeros, perm, fp8Scales;
  kernels::QuantWeight quant;
};

}  // namespace textgen::runtime
