#include "textgen/kernels/gather_rows.h"

#include <cstring>
#include <string>

namespace textgen::kernels {

Status validateGatherRows(const GatherRowsParams& p) {
  if (p.rows < 0 || p.width <= 0 || p.tableRows <= 0)
    return invalidArgumentError("gather_rows: rows >= 0, width > 0 and tableRows > 0 required");
  if (p.rows > 0 && (!p.table || !p.ids || !p.out))
    return invalidArgumentError("gather_rows: table, ids and out are required");
  return okStatus();
}

Status gatherRowsReference(const GatherRowsParams& p) {
  TG_RETURN_IF_ERROR(validateGatherRows(p));
  const size_t rowBytes = static_cast<size_t>(p.width) * dtypeSize(p.dtype);
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t id = p.ids[r] - p.idOffset;
    if (id < 0 || id >= p.tableRows) {
      if (!p.zeroOutside)
        return invalidArgumentError("gather_rows: id " + std::to_string(p.ids[r]) +
                                    " out of range");
      std::memset(static_cast<char*>(p.out) + r * rowBytes, 0, rowBytes);
      continue;
    }
    std::memcpy(static_cast<char*>(p.out) + r * rowBytes,
                static_cast<const char*>(p.table) + id * rowBytes, rowBytes);
  }
  return okStatus();
}

}  // namespace textgen::kernels
