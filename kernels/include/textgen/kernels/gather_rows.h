// Row gather: out[r, :] = table[ids[r], :]. The token embedding, and picking the rows of a batch
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
};

Status validateGatherRows(const GatherRowsParams& p);
// INVALID_ARGUMENT for an id out of range.
Status gatherRowsReference(const GatherRowsParams& p);
// On the device an id out of range yields a zero row (kernels cannot report errors).
Status invokeGatherRows(const GatherRowsParams& p, Stream stream);

}  // namespace textgen::kernels
