// Row gather: out[r, :] = table[ids[r] - idOffset, :]. The token embedding (a tensor-parallel
// rank's slice of the vocabulary: ids outside it give zero rows), and picking the rows of a batch
// whose logits are wanted.
#pragma once

#include <cstdint>

#include "textgen/base/status.h"
#include "textgen/kernels/dtype.h"
#include "textgen/kernels/stream.h"

namespace textgen::kernels {

struct GatherRowsParams {
  const void* table = nullptr;   // [tableRows, width]
  const int32_t* ids = nullptr;  // [rows]; must lie in [0, tableRows) (the caller validates)
  void* out = nullptr;           // [rows, width]
  int64_t rows = 0, width = 0, tableRows = 0;
  DType dtype = DType::kF32;
  int64_t idOffset = 0;      // the table's first row is id idOffset
  bool zeroOutside = false;  // an id outside the table gives a zero row (not an error)
};

Status validateGatherRows(const GatherRowsParams& p);
// INVALID_ARGUMENT for an id out of range, unless zeroOutside.
Status gatherRowsReference(const GatherRowsParams& p);
// On the device an id out of range yields a zero row (kernels cannot report errors).
Status invokeGatherRows(const GatherRowsParams& p, Stream stream);

}  // namespace textgen::kernels
