#include "textgen/kernels/position_embedding.h"

#include <string>

#include "elements.h"

namespace textgen::kernels {

Status validatePositionEmbedding(const PositionEmbeddingParams& p) {
  if (p.rows < 0) return invalidArgumentError("position_embedding: rows must be >= 0");
  if (p.width <= 0) return invalidArgumentError("position_embedding: width must be > 0");
  if (p.tableRows <= 0) return invalidArgumentError("position_embedding: tableRows must be > 0");
  if (p.rows > INT32_MAX) return invalidArgumentError("position_embedding: rows exceeds 2^31-1");
  if (p.offset < 0) return invalidArgumentError("position_embedding: offset must be >= 0");
  if (p.maxPosition < 0)
    return invalidArgumentError("position_embedding: maxPosition must be >= 0");
  if (p.maxPosition + p.offset >= p.tableRows) {
    return invalidArgumentError("position_embedding: maxPosition " + std::to_string(p.maxPosition) +
                                " + offset " + std::to_string(p.offset) +
                                " is outside the table's " + std::to_string(p.tableRows) + " rows");
  }
  if (p.rows == 0) return okStatus();
  if (!p.x) return invalidArgumentError("position_embedding: x is null");
  if (!p.table) return invalidArgumentError("position_embedding: table is null");
  if (!p.positions) return invalidArgumentError("position_embedding: positions is null");
  return okStatus();
}

Status positionEmbeddingReference(const PositionEmbeddingParams& p) {
  TG_RETURN_IF_ERROR(validatePositionEmbedding(p));
  for (int64_t r = 0; r < p.rows; ++r) {  // checked before anything is written
    if (p.positions[r] < 0 || p.positions[r] > p.maxPosition) {
      return invalidArgumentError("position_embedding: position " + std::to_string(p.positions[r]) +
                                  " of row " + std::to_string(r) + " outside [0, maxPosition " +
                                  std::to_string(p.maxPosition) + "]");
    }
  }
  const Elements e{p.dtype};
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t src = (p.positions[r] + p.offset) * p.width, dst = r * p.width;
    for (int64_t i = 0; i < p.width; ++i)
      e.store(p.x, dst + i, e.load(p.x, dst + i) + e.load(p.table, src + i));
  }
  return okStatus();
}

}  // namespace textgen::kernels
