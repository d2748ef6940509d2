// Learned absolute position embeddings (GPT-2, OPT, GPT-BigCode), added in place to the token
// embeddings:
//
//   x[r, :] = round(x[r, :] + table[positions[r] + offset, :])
//
// one rounding of the fp32 sum, as `inputs_embeds + position_embeds` rounds in torch. `offset`
// is OPT's 2 (its table's first two rows are unused), 0 elsewhere.
//
// Bounds: positions live in backend memory, which the host cannot read without a sync, so the
// caller states `maxPosition`, a bound on every position it passes (a batch's longest context - 1),
// and validation requires maxPosition + offset < tableRows. Should a position still fall outside
// the table, the CPU reference returns INVALID_ARGUMENT and the CUDA kernel leaves that row
// unchanged: neither reads out of bounds.
#pragma once

#include <cstdint>

#include "textgen/base/status.h"
#include "textgen/kernels/dtype.h"
#include "textgen/kernels/stream.h"

namespace textgen::kernels {

struct PositionEmbeddingParams {
  void* x = nullptr;                   // [rows, width], in place
  const void* table = nullptr;         // [tableRows, width]
  const int32_t* positions = nullptr;  // [rows]; each in [0, maxPosition]
  int64_t rows = 0, width = 0, tableRows = 0;
  int64_t offset = 0;       // table row = position + offset
  int64_t maxPosition = 0;  // the largest position any row may hold
  DType dtype = DType::kF32;
};

// INVALID_ARGUMENT naming the first bad field (maxPosition + offset beyond the table included).
Status validatePositionEmbedding(const PositionEmbeddingParams& p);
// CPU reference on host memory; INVALID_ARGUMENT for a position outside [0, maxPosition].
Status positionEmbeddingReference(const PositionEmbeddingParams& p);
// CUDA kernel on device memory; a row whose position is outside the table is left unchanged.
Status invokePositionEmbedding(const PositionEmbeddingParams& p, Stream stream);

}  // namespace textgen::kernels
